"""The train CLI: every bad input is one `error:` line and exit 2 before any work (no run
directory created or touched); an empty split's accuracy is NaN and read as missing."""
import math
import os

import numpy as np
import pytest

from tests.hardening_util import quiet_threads, train, train_argv  # noqa: F401

pytestmark = pytest.mark.usefixtures("quiet_threads")


@pytest.mark.parametrize("extra, message", [
    (("--test_envs", "0", "1", "2"), "every environment of Debug28 is a test environment"),
    (("--hparams", '{"lr": "abc"}'), "hyperparameter 'lr' must be a number, got 'abc'"),
    (("--hparams", '{"batch_size": 0}'), "hyperparameter 'batch_size' must be in [1, inf]"),
    (("--hparams", '{"batch_size": 2.5}'), "hyperparameter 'batch_size' must be an integer"),
    (("--hparams", '{"lr": -0.001}'), "hyperparameter 'lr' must be in [0.0, inf]"),
    (("--hparams", '{"lr": NaN}'), "hyperparameter 'lr' must be a finite number"),
    (("--hparams", '{"nonlinear_classifier": 1}'), "must be a boolean"),
    (("--hparams", '{"arch": "vgg"}'), "hyperparameter 'arch' must be one of"),
    (("--hparams", '{"mlp_dropout": 1.5}'), "hyperparameter 'mlp_dropout' must be in [0.0, 1.0]"),
    (("--holdout_fraction", "0"), "--holdout_fraction must be in (0, 1)"),
    (("--holdout_fraction", "-0.2"), "--holdout_fraction must be in (0, 1)"),
    (("--holdout_fraction", "1"), "--holdout_fraction must be in (0, 1)"),
    (("--uda_holdout_fraction", "1"), "--uda_holdout_fraction must be in [0, 1)"),
    (("--uda_holdout_fraction", "-0.1"), "--uda_holdout_fraction must be in [0, 1)"),
    (("--eval_batch_size", "0"), "--eval_batch_size must be at least 1"),
    (("--num_threads", "-2"), "--num_threads must be 0 (torch's default) or more"),
])
def test_bad_input_fails_before_work(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    argv = train_argv(out)
    if extra[0] == "--hparams":  # replace the helper's own --hparams
        argv = argv[:argv.index("--hparams")] + argv[argv.index("--hparams") + 2:]
    code, err = train(argv + list(extra), capsys)
    assert code == 2 and message in err, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_output_dir_that_is_a_file_or_under_one(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("mine\n")
    code, err = train(train_argv(blocker), capsys)
    assert code == 2 and "is a file, not a directory" in err
    argv = train_argv(blocker / "run")
    argv[argv.index("--data_dir") + 1] = str(tmp_path)
    code, err = train(argv, capsys)
    assert code == 2 and "which is a file" in err
    assert blocker.read_text() == "mine\n"


def test_output_dir_not_writable(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "readonly"
    parent.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: make the check itself see a refusal
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(parent)
                            else real_access(p, mode))
    else:
        parent.chmod(0o555)
    code, err = train(train_argv(parent / "run"), capsys)
    assert code == 2 and "is not writable" in err
    assert not (parent / "run").exists()


def test_data_dir_that_is_a_file(tmp_path, capsys):
    out = tmp_path / "run"
    argv = train_argv(out)
    data = tmp_path / "data.txt"
    data.write_text("x")
    argv[argv.index("--data_dir") + 1] = str(data)
    code, err = train(argv, capsys)
    assert code == 2 and "is not a directory" in err and "does not exist" not in err
    assert not out.exists()


def test_empty_split_is_nan_and_read_as_missing():
    from domainbed.results.model_selection import IIDAccuracySelectionMethod, candidates
    from domainbed.training.evaluation import split_metrics
    metrics = split_metrics("env1_out", np.zeros(0, np.uint8), None, 0)
    assert math.isnan(metrics["env1_out_acc"])
    record = {"args": {"test_envs": [0], "dataset": "D", "algorithm": "ERM",
                       "trial_seed": 0}, "step": 5, "env0_in_acc": 0.7,
              "env0_out_acc": 0.6, "env1_out_acc": metrics["env1_out_acc"],
              "env2_out_acc": 0.5, "env1_in_acc": 0.9, "env2_in_acc": 0.8}
    choice = candidates([record], IIDAccuracySelectionMethod).to_dicts()[0]
    assert choice["val_acc"] == 0.5  # the mean of the splits that exist, not (0 + 0.5) / 2
