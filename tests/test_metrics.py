"""Metrics beyond accuracy: each one against scikit-learn (or, for the two written here,
against a direct computation), in the records of a run trained with --metrics, and
afterwards from saved predictions with domainbed-metrics."""
import json
import subprocess
import sys

import numpy as np
import pytest
from sklearn import metrics as skm

from oodutils import metrics as M
from oodutils.errors import UserError


@pytest.fixture
def split():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 3)) + np.eye(3)[rng.integers(0, 3, 200)] * 1.5
    labels = rng.integers(0, 3, 200)
    labels[:60] = logits[:60].argmax(1)
    return labels, logits.argmax(1), logits


def test_against_scikit_learn(split):
    labels, pred, logits = split
    got = M.classification_metrics(labels, pred, logits, 3, list(M.METRICS))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert got["nll"] == pytest.approx(skm.log_loss(labels, probs))
    assert got["balanced_acc"] == pytest.approx(skm.balanced_accuracy_score(labels, pred))
    assert got["macro_f1"] == pytest.approx(skm.f1_score(labels, pred, average="macro"))
    recall = skm.recall_score(labels, pred, average=None)
    assert got["worst_class_acc"] == pytest.approx(recall.min())
    assert [got[f"acc_class{c}"] for c in range(3)] == pytest.approx(list(recall))
    assert "auroc" not in got                         # three classes
    onehot = np.eye(3)[labels]
    assert got["brier"] == pytest.approx(np.mean(np.sum((probs - onehot) ** 2, 1)))
    np.testing.assert_array_equal(M.confusion_matrix(labels, pred, 3),
                                  skm.confusion_matrix(labels, pred))


def test_ece_by_its_definition():
    # 4 examples at confidence 0.9 (3 right), 2 at 0.6 (both wrong): two bins
    probs = np.array([[0.9, 0.1]] * 4 + [[0.6, 0.4]] * 2)
    labels = np.array([0, 0, 0, 1, 1, 1])
    expected = 4 / 6 * abs(0.75 - 0.9) + 2 / 6 * abs(0.0 - 0.6)
    assert M.expected_calibration_error(probs, labels) == pytest.approx(expected)


def test_binary_auroc_and_metrics_without_logits():
    labels = np.array([0, 0, 1, 1])
    logits = np.array([[0, -2.0], [0, 0.5], [0, 0.2], [0, 3.0]])
    got = M.classification_metrics(labels, logits.argmax(1), logits, 2, ["auroc", "ece"])
    assert got["auroc"] == pytest.approx(skm.roc_auc_score(labels, logits[:, 1]))
    without = M.classification_metrics(labels, logits.argmax(1), None, 2, list(M.METRICS))
    assert set(without) == {"balanced_acc", "macro_f1", "worst_class_acc", "acc_class0",
                            "acc_class1"}
    with pytest.raises(UserError, match="'f2'"):
        M.check_metrics(["f2"])


def test_trained_with_metrics_and_computed_afterwards_agree(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
         "--data_dir", str(tmp_path), "--output_dir", str(out), "--steps", "3",
         "--checkpoint_freq", "2", "--test_envs", "0", "--num_threads", "1",
         "--save_logits", "--metrics", "nll", "ece", "balanced_acc", "class_acc",
         "auroc"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    last = records[-1]
    assert {"env0_in_nll", "env2_out_ece", "env1_in_balanced_acc", "env1_in_acc_class1",
            "env0_out_auroc"} <= set(last)
    confusion = np.load(out / "confusion" / f"step_{last['step']:07d}.npz")
    assert confusion["env1_in"].sum() == round(len(confusion["env1_in"]) and
                                               confusion["env1_in"].sum())
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.metrics", "--input_dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    after = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [a["step"] for a in after] == [r["step"] for r in records]
    for key in ("env0_in_nll", "env2_out_ece", "env1_in_balanced_acc", "env0_out_auroc"):
        # the saved logits are float16: afterwards is as close as that rounding allows
        assert after[-1][key] == pytest.approx(last[key], abs=2e-3), key
    assert (out / "results.jsonl").read_text().count("\n") == len(records)


def test_collect_results_tables_on_a_metric(tmp_path):
    """Selection is by accuracy as always; the cells report the chosen checkpoints' metric,
    read from metrics.jsonl where the records lack it."""
    from tests.builders import record, run_args, write_run
    for trial, ece in ((0, 0.10), (1, 0.30)):
        rec = record(5, run_args(trial_seed=trial), {}, {0: (0.5, 0.5), 1: (0.7, 0.6)})
        write_run(tmp_path / f"t{trial}", [rec],
                  files={"metrics.jsonl": json.dumps({"step": 5, "env0_in_ece": ece}) + "\n"})
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(tmp_path), "--no_save", "--metric", "ece",
                           "--selection_methods", "training_domain"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "model selection method: training-domain validation set, metric: ece (x100)" \
        in proc.stdout
    assert "20.0 +/- 7.1" in proc.stdout     # mean 0.2, std 0.1 / sqrt(2), in percent
    bad = subprocess.run(proc.args[:-4] + ["--metric", "f2"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "--metric 'f2'" in bad.stderr
