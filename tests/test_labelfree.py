"""Label-free OOD accuracy estimation: each estimator against hand-computed values, the
agreement line on zoos built to be on / off the line, and the command on a sweep in the
real on-disk layout (results.jsonl, predictions with logits, done)."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.stats import linregress, norm

from analysis import labelfree as lf
from tests.builders import record, run_args, write_run


def logits_for(pred, confidence, n_classes=2):
    """Logits whose argmax is `pred` with max-softmax `confidence` (two classes)."""
    out = np.zeros((len(pred), n_classes))
    gap = np.log(confidence / (1 - confidence))
    out[np.arange(len(pred)), pred] = gap
    return out


def test_atc_threshold_matches_the_validation_error():
    id_scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    id_correct = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1], bool)     # error 0.2
    t = lf.atc_threshold(id_scores, id_correct)
    assert np.mean(id_scores < t) == pytest.approx(0.2)
    ood_scores = np.array([0.1, 0.15, 0.25, 0.3, 0.95])
    assert t == 0.3     # 0.1 and 0.2 score below it: the two errors
    assert lf.atc_estimate(id_scores, id_correct, ood_scores) == pytest.approx(2 / 5)


def test_doc_and_average_confidence():
    labels = np.zeros(4, int)
    id_logits = logits_for(np.array([0, 0, 0, 1]), 0.9)       # acc 0.75, conf 0.9
    ood_logits = logits_for(np.array([0, 1, 1, 1]), 0.7)      # conf 0.7
    assert lf.doc_estimate(id_logits, id_logits.argmax(1) == labels, ood_logits) == \
        pytest.approx(0.75 - (0.9 - 0.7))
    cp = lf.Checkpoint("r", 0, "D", 1, np.arange(4), id_logits, labels, np.arange(4),
                       ood_logits, labels)
    est = lf.single_model_estimates(cp)
    assert est["avg_conf"] == pytest.approx(0.7) and set(est) == set(lf.METHODS) - {"aline_s"}


def zoo(n_models, ood_shift, n=4000, seed=0, sigma=0.3):
    """Binary models sharing each example's difficulty z ~ N(0, 1): model i is right on
    an example when z + sigma * noise < theta_i, and theta_i + ood_shift on OOD examples
    (`ood_shift` None: OOD predictions are coin flips)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    z_id, z_ood = rng.normal(size=n), rng.normal(size=n)
    cps = []
    for i, theta in enumerate(np.linspace(0.3, 1.8, n_models)):
        right_id = z_id + sigma * rng.normal(size=n) < theta
        right_ood = (rng.random(n) < 0.5) if ood_shift is None else \
            z_ood + sigma * rng.normal(size=n) < theta + ood_shift
        cps.append(lf.Checkpoint(
            f"run{i}", 10, "D", 2, np.arange(n),
            logits_for(np.where(right_id, labels, 1 - labels), 0.8), labels,
            np.arange(n) + n, logits_for(np.where(right_ood, labels, 1 - labels), 0.8),
            labels))
    return cps


def test_aline_s_applies_the_agreement_line_to_each_models_accuracy():
    cps = zoo(6, -0.5)
    estimates, agreement = lf.estimate(cps)
    # the agreement line, computed here with plain loops
    xs, ys = [], []
    for i in range(6):
        for j in range(i + 1, 6):
            xs.append(np.mean(cps[i].id_logits.argmax(1) == cps[j].id_logits.argmax(1)))
            ys.append(np.mean(cps[i].ood_logits.argmax(1) == cps[j].ood_logits.argmax(1)))
    fit = linregress(norm.ppf(np.clip(xs, 0.01, 0.99)), norm.ppf(np.clip(ys, 0.01, 0.99)))
    line = agreement.iloc[0]
    assert line["n_pairs"] == 15
    assert (line["slope"], line["intercept"], line["r"]) == pytest.approx(
        (fit.slope, fit.intercept, fit.rvalue))
    aline = estimates[estimates["method"] == "aline_s"].set_index("run")
    for cp in cps:
        id_acc = np.mean(cp.id_logits.argmax(1) == cp.id_labels)
        expected = norm.cdf(fit.slope * norm.ppf(np.clip(id_acc, 0.01, 0.99)) +
                            fit.intercept)
        assert aline.loc[cp.run, "estimated_acc"] == pytest.approx(expected)


def test_agreement_on_the_line_is_trusted_and_coin_flips_are_not():
    _, on = lf.estimate(zoo(8, -0.5))
    assert on["r"].iloc[0] >= lf.AGREEMENT_R_ON_THE_LINE
    assert lf.verdicts(on, {("D", 2): 8})["verdict"].tolist() == ["trust"]
    _, off = lf.estimate(zoo(8, None))
    assert not bool(off["agreement_on_the_line"].iloc[0])
    assert lf.verdicts(off, {("D", 2): 8})["verdict"].tolist() == ["do not trust"]
    assert lf.verdicts(off, {("D", 2): 2})["verdict"].tolist() == ["unknown"]


def test_summary_is_the_mean_absolute_error_in_points():
    est = pd.DataFrame({"run": ["a", "b"], "step": [1, 1], "dataset": ["D", "D"],
                        "env": [0, 0], "method": ["doc", "doc"],
                        "estimated_acc": [0.5, 0.8], "true_acc": [0.6, 0.7]})
    row = lf.summary(est).iloc[0]
    assert row["mae"] == pytest.approx(10.0) and row["n"] == 2


def write_sweep(root, cps, with_logits=True):
    """The checkpoints as finished runs: results.jsonl, predictions/step_*.npz, done."""
    for cp in cps:
        n_id, n_ood = len(cp.id_ids), len(cp.ood_ids)
        arrays = {"id": np.concatenate([cp.id_ids, cp.ood_ids]),
                  "env": np.array([0] * n_id + [cp.env] * n_ood, np.int16),
                  "split": np.array([1] * n_id + [0] * n_ood, np.int8),
                  "label": np.concatenate([cp.id_labels, cp.ood_labels])}
        logits = np.concatenate([cp.id_logits, cp.ood_logits])
        arrays["pred"] = logits.argmax(1)
        arrays["correct"] = (arrays["pred"] == arrays["label"]).astype(np.uint8)
        arrays["group"] = np.full(n_id + n_ood, -1)
        if with_logits:
            arrays["logits"] = logits.astype(np.float16)
        args = run_args(cp.dataset, test_envs=[cp.env])
        write_run(root / cp.run, [record(cp.step, args, {})], predictions={cp.step: arrays})


def test_command_on_a_sweep(tmp_path):
    write_sweep(tmp_path / "sweep", zoo(6, -0.5, n=600))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "analysis.labelfree", "--input_dir",
                           str(tmp_path / "sweep"), "--output_dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    estimates = pd.read_csv(out / "estimates.csv")
    assert {"run", "step", "env", "method", "estimated_acc", "true_acc"} <= set(estimates)
    assert set(estimates["method"]) == set(lf.METHODS) and len(estimates) == 6 * 5
    assert (out / "summary.csv").exists() and (out / "estimates_D_env2.png").exists()
    assert "trust" in (out / "verdicts.csv").read_text()


def test_a_sweep_without_logits_says_how_to_get_them(tmp_path):
    write_sweep(tmp_path / "sweep", zoo(3, -0.5, n=50), with_logits=False)
    proc = subprocess.run([sys.executable, "-m", "analysis.labelfree", "--input_dir",
                           str(tmp_path / "sweep"), "--output_dir", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "--save_logits" in proc.stderr and "Traceback" not in proc.stderr
