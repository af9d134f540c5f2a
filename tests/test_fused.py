"""The fused launcher: groups of runs trained with stacked parameters must leave what the
single runs leave (records to floating-point tolerance, the same files), resume after a
kill, and lose only the member that diverges."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from domainbed.launch import launchers
from domainbed.launch.fused import plan, run_group
from domainbed.scripts import train

ALGORITHMS_THAT_FUSE = ["CORAL", "ERM", "GroupDRO", "IRM", "MMD", "ReweightedERM", "VREx"]
NOT_COMPARED = ("step_time", "mem_gb")


def train_flags(out, data_dir, algorithm="ERM", dataset="ColoredMNIST", seed=0, steps=6,
                checkpoint_freq=3, **hparams):
    return ["--dataset", dataset, "--algorithm", algorithm, "--test_envs", "2",
            "--steps", str(steps), "--checkpoint_freq", str(checkpoint_freq),
            "--seed", str(seed), "--output_dir", str(out), "--data_dir", str(data_dir),
            "--hparams", json.dumps(hparams, sort_keys=True), "--num_threads", "1"]


def command(flags):
    out = flags[flags.index("--output_dir") + 1]
    return launchers.Command([sys.executable, "-m", "domainbed.scripts.train", *flags], out)


def records(run_dir):
    with open(os.path.join(run_dir, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_same_records(single, fused, acc_tol, value_rtol=1e-3):
    """Every key of every record: accuracies within `acc_tol`, update() values within
    `value_rtol`, arguments equal but for the output directory."""
    assert len(single) == len(fused) > 0
    for a, b in zip(single, fused):
        assert set(a) == set(b)
        assert {k: v for k, v in a["args"].items() if k != "output_dir"} == \
            {k: v for k, v in b["args"].items() if k != "output_dir"}
        assert a["hparams"] == b["hparams"]
        for key, value in a.items():
            if key in NOT_COMPARED or not isinstance(value, (int, float)):
                continue
            tol = acc_tol if key.startswith("env") else value_rtol * max(1.0, abs(value))
            assert abs(value - b[key]) <= tol, (key, a["step"], value, b[key])


def single_and_fused(tmp_path, members, **common):
    """Train each member alone, then all of them as one fused group."""
    commands = []
    for i, hparams in enumerate(members):
        train.main(train_flags(tmp_path / f"single{i}", tmp_path, seed=10 + i,
                               **common, **hparams))
        commands.append(command(train_flags(tmp_path / f"fused{i}", tmp_path, seed=10 + i,
                                            **common, **hparams)))
    result = run_group(commands)
    assert not result.fallback, result.fallback_reason
    return result


# Members differ in what may differ: lr, weight decay, training seed, penalty weights and
# anneal steps (switching within the run, so each member's Adam restarts on its own step).
MEMBER_HPARAMS = {
    "ERM": [{}, {"lr": 3e-3, "weight_decay": 1e-3}],
    "ReweightedERM": [{}, {"lr": 3e-3}],
    "GroupDRO": [{"groupdro_eta": 0.1}, {"lr": 3e-3, "groupdro_eta": 0.001}],
    "IRM": [{"irm_penalty_anneal_iters": 2, "irm_lambda": 10.0},
            {"irm_penalty_anneal_iters": 4, "irm_lambda": 1000.0, "lr": 3e-3}],
    "VREx": [{"vrex_penalty_anneal_iters": 0}, {"vrex_penalty_anneal_iters": 3, "lr": 3e-3}],
    "CORAL": [{"mmd_gamma": 1.0}, {"mmd_gamma": 5.0, "weight_decay": 1e-4}],
    "MMD": [{"mmd_gamma": 1.0}, {"mmd_gamma": 0.3, "lr": 3e-3}],
}


@pytest.mark.parametrize("algorithm", ALGORITHMS_THAT_FUSE)
def test_fused_colored_mnist_records_match_single_runs(tmp_path, algorithm):
    """The MLP's batched matrix products round as the single run's do: every accuracy
    of every checkpoint is equal."""
    members = [dict(h, arch="mlp", mlp_width=64, batch_size=32)
               for h in MEMBER_HPARAMS[algorithm]]
    result = single_and_fused(tmp_path, members, algorithm=algorithm)
    assert [o.status for o in result.outcomes] == ["ok"] * len(members)
    for i in range(len(members)):
        assert_same_records(records(tmp_path / f"single{i}"), records(tmp_path / f"fused{i}"),
                            acc_tol=1e-9)
        assert os.path.exists(tmp_path / f"fused{i}" / "done")
        assert sorted(os.listdir(tmp_path / f"fused{i}" / "predictions")) == \
            sorted(os.listdir(tmp_path / f"single{i}" / "predictions"))


@pytest.mark.parametrize("algorithm", ["GroupDRO"])
def test_fused_debug_cnn_records_match_single_runs(tmp_path, algorithm):
    """Convolutions of stacked members run as one grouped convolution, which rounds
    differently (closer to float64 than oneDNN's channels-last kernel, measured), so
    the CNN's records agree to a tolerance rather than exactly."""
    members = [dict(h, arch="mnist_cnn", batch_size=8) for h in MEMBER_HPARAMS[algorithm]]
    single_and_fused(tmp_path, members, algorithm=algorithm, dataset="Debug28", steps=4,
                     checkpoint_freq=2)
    for i in range(len(members)):
        assert_same_records(records(tmp_path / f"single{i}"), records(tmp_path / f"fused{i}"),
                            acc_tol=0.05, value_rtol=0.05)


def test_dropout_rates_may_differ_and_a_zero_rate_member_matches(tmp_path):
    members = [{"mlp_dropout": 0.5}, {"mlp_dropout": 0.0, "lr": 3e-3}]
    members = [dict(h, arch="mlp", mlp_width=64, batch_size=32) for h in members]
    single_and_fused(tmp_path, members)
    assert_same_records(records(tmp_path / "single1"), records(tmp_path / "fused1"),
                        acc_tol=1e-9)
    assert len(records(tmp_path / "fused0")) == len(records(tmp_path / "single0"))


def test_a_diverging_member_stops_alone(tmp_path):
    common = {"arch": "mlp", "mlp_width": 64, "batch_size": 32,
              "irm_penalty_anneal_iters": 0}
    good, bad = dict(common, irm_lambda=10.0), dict(common, lr=1e30)   # Adam: lr x sign
    commands = [command(train_flags(tmp_path / name, tmp_path, "IRM", seed=i, **hp))
                for i, (name, hp) in enumerate([("good", good), ("bad", bad)])]
    result = run_group(commands)
    status = {os.path.basename(o.output_dir): o.status for o in result.outcomes}
    assert status == {"good": "ok", "bad": "failed"}
    err = (tmp_path / "bad" / "err.txt").read_text()
    assert err.startswith("error: ") and "became" in err and "IRM on ColoredMNIST" in err
    assert not (tmp_path / "bad" / "done").exists()
    assert "exit code 2" in (tmp_path / "bad" / "launcher.log").read_text()
    train.main(train_flags(tmp_path / "good_single", tmp_path, "IRM", seed=0, **good))
    assert_same_records(records(tmp_path / "good_single"), records(tmp_path / "good"),
                        acc_tol=1e-9)


def _resume_step(run_dir):
    path = os.path.join(run_dir, "resume_state.pt")
    try:
        return torch.load(path, weights_only=True)["next_step"]
    except Exception:
        return 0


@pytest.mark.slow
def test_kill_and_relaunch_resumes_every_member(tmp_path):
    """SIGKILL a group mid-run, relaunch it: every member resumes from its own last
    checkpoint and ends with the records of an uninterrupted fused run."""
    members = [{"lr": 1e-3}, {"lr": 3e-3}, {"lr": 2e-4, "weight_decay": 1e-3}]
    hp = {"arch": "mlp", "mlp_width": 64, "batch_size": 32}
    steps = dict(steps=300, checkpoint_freq=10)

    def commands(prefix):
        return [command(train_flags(tmp_path / f"{prefix}{i}", tmp_path, seed=i, **steps,
                                    **hp, **m)) for i, m in enumerate(members)]
    killed = commands("killed")
    child = multiprocessing.get_context("fork").Process(target=run_group, args=(killed,))
    child.start()
    deadline = time.time() + 120
    while time.time() < deadline and child.is_alive() and \
            min(_resume_step(c.output_dir) for c in killed) < 50:
        time.sleep(0.05)
    assert child.is_alive(), "the group finished before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert not any(os.path.exists(os.path.join(c.output_dir, "done")) for c in killed)
    result = run_group(killed)
    assert [o.status for o in result.outcomes] == ["ok"] * 3
    for c in killed:
        assert "notice: resuming" in open(os.path.join(c.output_dir, "launcher.log")).read()
    run_group(commands("whole"))
    for i in range(3):
        assert_same_records(records(tmp_path / f"whole{i}"), records(tmp_path / f"killed{i}"),
                            acc_tol=1e-9, value_rtol=1e-6)


def test_plan_groups_what_can_share_a_process(tmp_path):
    def cmd(name, algorithm="ERM", seed=0, **hparams):
        return command(train_flags(tmp_path / name, tmp_path, algorithm, seed=seed,
                                   **dict({"arch": "mlp", "batch_size": 32}, **hparams)))
    commands = [cmd("a", lr=1e-3), cmd("b", lr=3e-3, seed=1), cmd("c", mlp_dropout=0.5),
                cmd("d", batch_size=64), cmd("e", "SagNet"), cmd("f", "SagNet", seed=1),
                cmd("g", "IRM", irm_lambda=1.0), cmd("h", "IRM", irm_lambda=10.0)]
    work = plan(commands)
    groups = sorted(sorted(os.path.basename(c.output_dir) for c in g) for g in work.groups)
    assert groups == [["a", "b", "c"], ["g", "h"]]
    assert sorted(os.path.basename(c.output_dir) for c in work.ordinary) == ["d", "e", "f"]
    assert "fused: 2 jobs run as ordinary jobs: SagNet has no fused form" in work.notices
    assert any("1 job run as ordinary jobs: no other job shares" in n for n in work.notices)
    assert any(n.startswith("fused: algorithms that fuse: CORAL, ERM") for n in work.notices)
    assert [len(g) for g in plan(commands, max_models=2).groups] == [2, 2]


@pytest.mark.slow
def test_sweep_with_the_fused_launcher(tmp_path):
    """The sweep CLI end to end: groups per test environment, ordinary run directories
    with one log line per checkpoint, and `status` reading them as done."""
    base = [sys.executable, "-m", "domainbed.scripts.sweep"]
    flags = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "2",
             "--n_trials", "1", "--single_test_envs", "--steps", "3",
             "--output_dir", str(tmp_path / "sweep"),
             "--data_dir", str(tmp_path), "--hparams",
             '{"arch": "mlp", "batch_size": 8, "mlp_width": 32, "mlp_depth": 3}']
    proc = subprocess.run(base + ["launch", *flags, "--command_launcher", "fused",
                                  "--skip_confirmation"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fused: 6 jobs in 3 groups (2, 2, 2 models)" in proc.stdout
    assert "Ran 6 jobs: 6 finished, 0 failed." in proc.stdout
    status = subprocess.run(base + ["status", *flags, "--command_launcher", "fused"],
                            capture_output=True, text=True)
    assert "6 jobs: 6 done" in status.stdout
    run_dirs = [d for d in (tmp_path / "sweep").iterdir() if d.is_dir()]
    log = (run_dirs[0] / "launcher.log").read_text()
    assert "running fused with 2 models" in log and "exit code 0" in log
    assert sum(line.startswith("step ") for line in log.splitlines()) == \
        len(records(run_dirs[0]))


def test_a_group_process_that_dies_fails_its_members_not_the_launcher(tmp_path):
    from domainbed.launch.fused import run_groups
    (tmp_path / "file").write_text("not a directory")
    doomed = [command(train_flags(tmp_path / "file" / f"run{i}", tmp_path, seed=i))
              for i in range(2)]
    ((index, result),) = list(run_groups([doomed], max_workers=1))
    assert index == 0
    assert [o.status for o in result.outcomes] == ["failed", "failed"]
    assert "died (exit code 1)" in result.summary
