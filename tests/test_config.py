"""RunConfig: every option of a training run defined once; the train parser is generated
from it, records keep DomainBed's arg keys, and it is cheap to import."""
import json
import subprocess
import sys

import pytest

from domainbed.training.config import RunConfig, build_parser
from oodutils.errors import UserError

# A record's `args` keys as DomainBed's train.py writes them, then ours, in this order.
RECORD_ARG_KEYS = [
    "data_dir", "dataset", "algorithm", "task", "hparams", "hparams_seed", "trial_seed",
    "seed", "data_seed", "steps", "checkpoint_freq", "test_envs", "output_dir",
    "holdout_fraction", "uda_holdout_fraction", "skip_model_save",
    "save_model_every_checkpoint", "save_best_model", "early_stopping", "patience",
    "save_logits", "precision", "memory_format",
    "eval_splits", "eval_batch_size", "metrics", "trackers", "tracker_uri", "tracker_timeout",
    "num_threads",
    "distributed", "restart", "weights_dir",
    "feature_cache_dir",
    "skip_bad_images"]


def test_fields_are_the_record_keys_in_order():
    assert RunConfig.field_names() == RECORD_ARG_KEYS
    assert list(RunConfig().to_dict()) == RECORD_ARG_KEYS


def test_parser_is_generated_from_the_fields():
    flags = {a.dest for a in build_parser()._actions} - {"help", "verbose", "quiet"}
    flags = {f for f in flags if not f.startswith("hf_")}   # folded into an hf: name
    assert flags == set(RECORD_ARG_KEYS)
    config = RunConfig.from_argv(["--test_envs", "1", "2", "--eval_splits", "out", "test",
                                  "--steps", "7", "--save_logits", "-v",
                                  "--holdout_fraction", "0.3"])
    assert config.test_envs == [1, 2] and config.eval_splits == ["out", "test"]
    assert config.steps == 7 and config.save_logits is True
    assert config.holdout_fraction == 0.3 and config.checkpoint_freq is None


def test_defaults_are_domainbeds():
    config = RunConfig.from_argv([])
    assert (config.dataset, config.algorithm, config.hparams_seed, config.trial_seed,
            config.seed, config.holdout_fraction, config.uda_holdout_fraction,
            config.task, config.output_dir) == (
        "ColoredMNIST", "ERM", 0, 0, 0, 0.2, 0, "domain_generalization", "train_output")
    # JSON of the defaults is what the old parser wrote (0, not 0.0: run identity)
    assert json.dumps(config.uda_holdout_fraction) == "0"


def test_choices_and_bad_values_are_refused():
    with pytest.raises(SystemExit):
        RunConfig.from_argv(["--precision", "fp8"])
    with pytest.raises(UserError, match="--steps must be at least 1"):
        RunConfig(steps=0).check_numbers()
    with pytest.raises(UserError, match="eval_splits 'o'"):
        RunConfig(eval_splits=["o"]).check_numbers()


def test_keyword_construction():
    config = RunConfig.from_options(dataset="Debug28", test_envs=2, hparams={"lr": 0.1},
                                    output_dir=__import__("pathlib").Path("x"))
    assert config.test_envs == [2] and json.loads(config.hparams) == {"lr": 0.1}
    assert config.output_dir == "x"
    with pytest.raises(UserError, match="unknown training option.*nonsense"):
        RunConfig.from_options(nonsense=1)


def test_validate_fills_default_test_envs_and_checks_range(tmp_path):
    config = RunConfig(dataset="Debug28", data_dir=str(tmp_path))
    config.validate()
    assert config.test_envs == [0]
    with pytest.raises(UserError, match="test env 9 is out of range"):
        RunConfig(dataset="Debug28", data_dir=str(tmp_path), test_envs=[9]).validate()


def test_importing_the_config_does_not_import_torch():
    code = ("import sys, domainbed.training.config, domainbed.scripts.train; "
            "print(sorted(m for m in ('torch', 'pandas', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_train_without_a_data_folder_says_where_its_results_are(tmp_path):
    """A dataset that needs no files trains without --data_dir existing, and the command
    prints its run directory and final accuracies on stdout."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
         "--data_dir", str(tmp_path / "absent"), "--output_dir", str(out), "--steps", "2",
         "--checkpoint_freq", "1", "--num_threads", "1"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"run directory: {out}"
    assert lines[1].startswith("step 1: env0_in_acc ") and "env2_out_acc" in lines[1]
    assert (out / "done").exists() and not (tmp_path / "absent").exists()
    again = subprocess.run(proc.args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already finished" in again.stdout
