"""--eval_splits: which splits a run evaluates; absent splits leave their keys out, and
collect_results / the analyses say what that prevents."""
import json
import subprocess
import sys

import numpy as np
import pytest

from domainbed.launch import sweep as sweep_plan
from domainbed.predictions import list_prediction_steps, load_predictions
from domainbed.results import model_selection
from domainbed.scripts import collect_results, sweep, train
from oodutils.errors import UserError


def train_run(out, *extra, test_env="2", steps=3):
    out.parent.mkdir(parents=True, exist_ok=True)
    train.main(["--dataset", "Debug28", "--algorithm", "ERM", "--data_dir", str(out.parent),
                "--output_dir", str(out), "--steps", str(steps), "--checkpoint_freq", "2",
                "--test_envs", test_env, "--num_threads", "1", "--skip_model_save", *extra])
    with open(out / "results.jsonl") as f:
        return [json.loads(line) for line in f]


def acc_splits(record):
    return sorted(k[:-4] for k in record if k.endswith("_acc"))


def test_default_evaluates_every_split_and_out_only_leaves_in_keys_out(tmp_path):
    full = train_run(tmp_path / "full")
    assert acc_splits(full[-1]) == ["env0_in", "env0_out", "env1_in", "env1_out",
                                    "env2_in", "env2_out"]
    out = train_run(tmp_path / "out", "--eval_splits", "out")
    assert acc_splits(out[-1]) == ["env0_out", "env1_out", "env2_out"]
    assert not any(k.startswith(("env0_in", "env1_in", "env2_in")) for k in out[-1])
    for a, b in zip(full, out):   # the same model: the kept keys are equal
        assert {k: v for k, v in a.items() if k.startswith("env") and k in b} == \
            {k: v for k, v in b.items() if k.startswith("env")}
    preds = load_predictions(str(tmp_path / "out"), list_prediction_steps(
        str(tmp_path / "out"))[-1])
    assert set(np.unique(preds["split"])) == {1}   # out splits only


def test_tokens_are_a_union(tmp_path):
    recs = train_run(tmp_path / "r", "--eval_splits", "out", "test", "env0_in")
    assert acc_splits(recs[-1]) == ["env0_in", "env0_out", "env1_out", "env2_in", "env2_out"]
    recs = train_run(tmp_path / "t", "--eval_splits", "train")
    assert acc_splits(recs[-1]) == ["env0_in", "env0_out", "env1_in", "env1_out"]


@pytest.mark.parametrize("tokens", [["bogus"], ["env0_inn"]])
def test_bad_tokens_fail_before_any_work(tmp_path, tokens):
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset",
                           "Debug28", "--data_dir", str(tmp_path), "--output_dir",
                           str(tmp_path / "run"), "--eval_splits", *tokens],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: --eval_splits")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_split_name_must_exist(tmp_path):
    with pytest.raises(UserError, match="no such split"):
        train_run(tmp_path / "r", "--eval_splits", "env7_in")


def test_collect_results_says_what_a_missing_split_prevents(tmp_path, capsys):
    train_run(tmp_path / "sweep" / "a", "--eval_splits", "in")
    collect_results.main(["--input_dir", str(tmp_path / "sweep"), "--no_save"])
    err = capsys.readouterr().err
    assert "training-domain validation set" in err and "env0_out_acc" in err
    assert "oracle" in err and "env2_out_acc" in err
    # out + the test env's in split serve both
    recs = train_run(tmp_path / "b", "--eval_splits", "out", "test")
    methods = [model_selection.IIDAccuracySelectionMethod,
               model_selection.OracleSelectionMethod]
    assert model_selection.missing_split_notes(recs, methods) == []


def test_sweep_passes_eval_splits_and_all_keeps_domainbed_hashes(tmp_path):
    base = ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir",
            str(tmp_path), "--output_dir", str(tmp_path / "s"), "--command_launcher",
            "dummy", "--n_hparams", "1", "--n_trials", "1", "--single_test_envs",
            "--skip_confirmation"]

    def jobs(*extra):
        args = sweep.build_parser().parse_args(base + list(extra))
        return sweep_plan.make_args_list(
            1, ["Debug28"], ["ERM"], 0, 1, None, str(tmp_path), "domain_generalization",
            0.2, True, None,
            extra_args={n: getattr(args, n) for n in sweep.PASS_THROUGH
                        if not (n == "eval_splits" and args.eval_splits == ["all"])})

    assert jobs() == jobs("--eval_splits", "all")
    with_out = jobs("--eval_splits", "out", "test")
    assert all(a["eval_splits"] == ["out", "test"] for a in with_out)
    assert "--eval_splits out test" in " ".join(sweep_plan.train_argv(with_out[0]))
    with pytest.raises(UserError, match="eval_splits"):
        sweep.check_args(sweep.build_parser().parse_args(base + ["--eval_splits", "x"]))


@pytest.mark.slow
def test_aotl_names_the_split_it_lacks(tmp_path):
    for env in ("0", "1", "2"):
        train_run(tmp_path / "sweep" / env, "--eval_splits", "in", test_env=env)
    proc = subprocess.run([sys.executable, "-m", "analysis.aotl", str(tmp_path / "sweep"),
                           "--split", "out"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--eval_splits" in proc.stderr
