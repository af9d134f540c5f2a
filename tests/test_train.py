"""The train script: run directory contents, determinism, resume after SIGKILL, bad input."""
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.hardening_util import (  # noqa: F401  (quiet_threads is a fixture)
    comparable,
    quiet_threads,
    records,
    train,
    train_argv,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_cmd(out, *extra, dataset="Debug28", algorithm="ERM", steps=6, freq=2):
    return [sys.executable, "-m", "domainbed.scripts.train", "--dataset", dataset,
            "--algorithm", algorithm, "--data_dir", str(out.parent), "--output_dir", str(out),
            "--steps", str(steps), "--checkpoint_freq", str(freq), "--test_envs", "0",
            "--num_threads", "1", *extra]


def run(cmd, env=None, check=True):
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed:\n{proc.stderr}")
    return proc




def test_run_directory_contents(tmp_path):
    out = tmp_path / "run"
    run(train_cmd(out, "--save_logits"))
    assert (out / "done").exists() and (out / "model.pkl").exists()
    assert not (out / "resume_state.pt").exists()
    recs = records(out)
    assert [r["step"] for r in recs] == [0, 2, 4, 5]
    r = recs[-1]
    for key in ("args", "hparams", "step", "epoch", "step_time", "mem_gb", "loss",
                "env0_in_acc", "env2_out_acc", "env1_out_acc_g3", "env1_out_wga"):
        assert key in r, key
    assert r["args"]["data_fingerprint"] and r["args"]["data_source"].startswith("random")
    assert r["args"]["group_names"] == ["y0_a0", "y0_a1", "y1_a0", "y1_a1"]
    assert r["env1_out_wga"] == min(r[f"env1_out_acc_g{g}"] for g in range(4)
                                    if f"env1_out_acc_g{g}" in r)
    pred = np.load(out / "predictions" / "step_0000005.npz")
    assert set(pred.files) >= {"id", "env", "split", "label", "pred", "correct", "group",
                               "logits"}
    assert len(pred["id"]) == 3 * 48 and len(np.unique(pred["id"])) == 3 * 48
    assert pred["logits"].dtype == np.float16 and pred["logits"].shape == (144, 2)
    np.testing.assert_array_equal(pred["correct"], pred["pred"] == pred["label"])
    for env in range(3):
        for split, key in ((0, "in"), (1, "out")):
            mask = (pred["env"] == env) & (pred["split"] == split)
            assert pred["correct"][mask].mean() == pytest.approx(r[f"env{env}_{key}_acc"])


@pytest.mark.slow
def test_same_seeds_give_identical_records(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run(train_cmd(a, algorithm="IRM"))
    run(train_cmd(b, algorithm="IRM"))
    assert comparable(records(a)) == comparable(records(b))
    c = tmp_path / "c"
    run(train_cmd(c, "--seed", "1", algorithm="IRM"))
    assert comparable(records(a)) != comparable(records(c))


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted(tmp_path):
    """Kill the run at random moments (also mid-write), restart, compare every record."""
    reference = tmp_path / "reference"
    kw = dict(algorithm="VREx", steps=40, freq=3)
    extra = ("--hparams", '{"vrex_penalty_anneal_iters": 10}')
    run(train_cmd(reference, *extra, **kw))
    out = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    for _attempt in range(12):
        proc = subprocess.Popen(train_cmd(out, *extra, **kw), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # wait for the first checkpoint state, then kill at a random moment after it
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline and \
                not (out / "resume_state.pt").exists():
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is not None:
            break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 1
    run(train_cmd(out, *extra, **kw))
    assert (out / "done").exists()
    assert comparable(records(out)) == comparable(records(reference))
    ref_pred = np.load(reference / "predictions" / "step_0000039.npz")
    got_pred = np.load(out / "predictions" / "step_0000039.npz")
    for key in ref_pred.files:
        np.testing.assert_array_equal(ref_pred[key], got_pred[key])
    assert not list(out.glob(".tmp-*")) and not list((out / "predictions").glob(".tmp-*"))


@pytest.mark.parametrize("extra, message", [
    (("--dataset", "NoSuchSet"), "unknown dataset 'NoSuchSet'; valid datasets: "),
    (("--algorithm", "NoSuchAlgo"), "unknown algorithm 'NoSuchAlgo'; valid algorithms: "),
    (("--test_envs", "7"), "test env 7 is out of range"),
    (("--hparams", '{"not_a_name": 1}'), "unknown hyperparameter 'not_a_name'"),
])
def test_bad_input_is_one_clear_line(tmp_path, extra, message):
    proc = run(train_cmd(tmp_path / "run") + list(extra), check=False)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    if "dataset" in message:
        assert "ColoredMNIST" in proc.stderr and "RotatedMNIST" in proc.stderr


def test_missing_data_dir(tmp_path):
    """A dataset that reads files needs its folder (Debug28 and the MNIST family build
    themselves without one: tests/test_config.py)."""
    cmd = train_cmd(tmp_path / "run")
    cmd[cmd.index("--data_dir") + 1] = str(tmp_path / "nowhere")
    cmd[cmd.index("--dataset") + 1] = "VLCS"
    proc = run(cmd, check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_other_algorithms_hparam_is_ignored_with_notice(tmp_path):
    proc = run(train_cmd(tmp_path / "run", "--hparams", '{"irm_lambda": 5}'))
    assert "irm_lambda" in proc.stderr and "ignored" in proc.stderr
    assert "irm_lambda" not in records(tmp_path / "run")[0]["hparams"]


@pytest.mark.usefixtures("quiet_threads")  # the in-process run sets one thread
def test_bf16_refused_clearly_without_cpu_support(tmp_path, monkeypatch, capsys):
    """On a CPU without native bfloat16 (made so here, whatever this machine has), --precision
    bf16 is one clear error line and exit 2, naming the opt-in for emulation."""
    import torch

    from domainbed.training import precision
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(precision.ALLOW_EMULATED_BF16, raising=False)
    code, err = train(train_argv(tmp_path / "run", "--precision", "bf16"), capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: --precision bf16 needs a CPU with AVX-512 BF16 or AMX")
    assert "DOMAINBED_ALLOW_EMULATED_BF16" in err
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.slow
def test_bf16_runs_under_autocast_when_emulation_is_allowed(tmp_path):
    """The bf16 path trains end to end on any CPU once emulation is allowed, and its
    records say so (runs of other precisions are never pooled with it)."""
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    mlp = ("--hparams", '{"arch": "mlp"}')  # emulated bf16 convolutions are very slow
    run(train_cmd(fp32, "--save_logits", *mlp))
    proc = run(train_cmd(bf16, "--precision", "bf16", "--save_logits", *mlp),
               env={"DOMAINBED_ALLOW_EMULATED_BF16": "1"})
    assert (bf16 / "done").exists()
    recs = records(bf16)
    assert recs[-1]["args"]["precision"] == "bf16"
    assert records(fp32)[-1]["args"]["precision"] == "fp32"
    import torch

    from domainbed.predictions import load_predictions
    from domainbed.training.precision import cpu_supports_bf16
    if not (torch.cuda.is_available() or cpu_supports_bf16()):
        assert "emulated" in proc.stderr
    # bf16 rounding (8-bit mantissa) moves the logits away from the fp32 run's.
    last = recs[-1]["step"]
    a, b = load_predictions(str(fp32), last)["logits"], load_predictions(str(bf16), last)["logits"]
    assert a.shape == b.shape and not np.array_equal(a, b)
    assert np.allclose(a, b, atol=0.5)


def test_group_balanced_sampling_weights():
    import torch

    from domainbed.datasets.base import TensorEnvironment
    from domainbed.training.batches import BatchSampler, sampling_weights
    groups = np.array([0] * 90 + [1] * 10)
    env = TensorEnvironment(torch.zeros(100, 1), torch.zeros(100, dtype=torch.long),
                            np.arange(100), groups)
    weights = sampling_weights(env, {"group_balanced": True})
    sampler = BatchSampler(env, 4000, seed=0, env_i=0, weights=weights)
    drawn = groups[sampler.indices(0).numpy()]
    assert abs(drawn.mean() - 0.5) < 0.05  # the minority group is drawn half the time
    assert sampling_weights(env, {}) is None
