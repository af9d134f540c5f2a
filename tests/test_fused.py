"""The fused launcher: a group's members must leave what their single runs leave (exact
arithmetic: the same records and predictions bit for bit; batched: to a rounding
tolerance, and the same zoo-level fits), whatever else shares the group, resume after a
kill (either a group or a single run resuming the other), and lose only the member that
diverges."""
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from domainbed.launch.fused import plan, run_group
from domainbed.launch.jobs import Command
from domainbed.scripts import train

ALGORITHMS_THAT_FUSE = ["CORAL", "ERM", "GroupDRO", "IRM", "MMD", "ReweightedERM", "VREx"]
NOT_COMPARED = ("step_time", "mem_gb")
# single and fused-exact name the same arithmetic two ways (training.arithmetic)
SAME_ARITHMETIC = {"single": "single", "fused-exact": "single"}


def train_flags(out, data_dir, algorithm="ERM", dataset="ColoredMNIST", seed=0, steps=6,
                checkpoint_freq=3, **hparams):
    return ["--dataset", dataset, "--algorithm", algorithm, "--test_envs", "2",
            "--steps", str(steps), "--checkpoint_freq", str(checkpoint_freq),
            "--seed", str(seed), "--output_dir", str(out), "--data_dir", str(data_dir),
            "--hparams", json.dumps(hparams, sort_keys=True), "--num_threads", "1"]


def command(flags):
    out = flags[flags.index("--output_dir") + 1]
    return Command([sys.executable, "-m", "domainbed.scripts.train", *flags], out)


def records(run_dir):
    with open(os.path.join(run_dir, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_same_records(single, fused, acc_tol, value_rtol=1e-3):
    """Every key of every record: accuracies within `acc_tol`, update() values within
    `value_rtol`, arguments equal but for the output directory."""
    assert len(single) == len(fused) > 0
    for a, b in zip(single, fused):
        assert set(a) == set(b)
        assert {k: v for k, v in a["args"].items() if k not in ("output_dir", "arithmetic")} == \
            {k: v for k, v in b["args"].items() if k not in ("output_dir", "arithmetic")}
        assert a["hparams"] == b["hparams"]
        for key, value in a.items():
            if key in NOT_COMPARED or not isinstance(value, (int, float)):
                continue
            tol = acc_tol if key.startswith("env") else value_rtol * max(1.0, abs(value))
            assert abs(value - b[key]) <= tol, (key, a["step"], value, b[key])


def single_and_fused(tmp_path, members, arithmetic="auto", **common):
    """Train each member alone, then all of them as one fused group (auto: the CPU's
    exact arithmetic)."""
    commands = []
    for i, hparams in enumerate(members):
        train.main(train_flags(tmp_path / f"single{i}", tmp_path, seed=10 + i,
                               **common, **hparams))
        commands.append(command(train_flags(tmp_path / f"fused{i}", tmp_path, seed=10 + i,
                                            **common, **hparams)))
    result = run_group(commands, arithmetic)
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


@pytest.mark.parametrize("arithmetic", ["exact", "batched"])
@pytest.mark.parametrize("algorithm", ALGORITHMS_THAT_FUSE)
def test_fused_colored_mnist_records_match_single_runs(tmp_path, algorithm, arithmetic):
    """exact: every record is the single run's, bit for bit. batched (each algorithm's
    FusedForm, vmapped): the batched products round differently, so over these few steps
    the records agree to a tolerance."""
    members = [dict(h, arch="mlp", mlp_width=64, batch_size=32)
               for h in MEMBER_HPARAMS[algorithm]]
    result = single_and_fused(tmp_path, members, arithmetic, algorithm=algorithm)
    assert [o.status for o in result.outcomes] == ["ok"] * len(members)
    for i in range(len(members)):
        if arithmetic == "exact":
            assert comparable(tmp_path / f"single{i}") == comparable(tmp_path / f"fused{i}")
        assert_same_records(records(tmp_path / f"single{i}"), records(tmp_path / f"fused{i}"),
                            acc_tol=0.02)
        assert os.path.exists(tmp_path / f"fused{i}" / "done")
        assert sorted(os.listdir(tmp_path / f"fused{i}" / "predictions")) == \
            sorted(os.listdir(tmp_path / f"single{i}" / "predictions"))


@pytest.mark.parametrize("algorithm", ["GroupDRO"])
def test_fused_debug_cnn_records_match_single_runs(tmp_path, algorithm):
    """batched: convolutions of stacked members run as one grouped convolution, which
    rounds differently (closer to float64 than oneDNN's channels-last kernel, measured),
    so the CNN's records agree to a tolerance rather than exactly."""
    members = [dict(h, arch="mnist_cnn", batch_size=8) for h in MEMBER_HPARAMS[algorithm]]
    single_and_fused(tmp_path, members, "batched", algorithm=algorithm, dataset="Debug28",
                     steps=4, checkpoint_freq=2)
    for i in range(len(members)):
        assert_same_records(records(tmp_path / f"single{i}"), records(tmp_path / f"fused{i}"),
                            acc_tol=0.05, value_rtol=0.05)


def test_dropout_rates_may_differ_and_exact_members_draw_their_single_runs_masks(tmp_path):
    members = [{"mlp_dropout": 0.5}, {"mlp_dropout": 0.0, "lr": 3e-3}]
    members = [dict(h, arch="mlp", mlp_width=64, batch_size=32) for h in members]
    single_and_fused(tmp_path, members, "exact")
    for i in range(2):
        assert comparable(tmp_path / f"single{i}") == comparable(tmp_path / f"fused{i}")


def test_batched_dropout_masks_are_each_members_own():
    """counter_uniform under vmap: each member's numbers are those it gets alone, differ
    between keys and layers, and look uniform."""
    from torch.func import vmap

    from domainbed.launch.fused_training import counter_uniform
    keys = torch.tensor([7, 123456789, 2 ** 31 - 1])
    stacked = vmap(lambda k: counter_uniform(k, 1, (64, 32), "cpu"))(keys)
    for i, key in enumerate(keys):
        assert torch.equal(stacked[i], counter_uniform(key, 1, (64, 32), "cpu"))
    assert not torch.equal(stacked[0], stacked[1])
    assert not torch.equal(counter_uniform(keys[0], 0, (64, 32), "cpu"), stacked[0])
    many = counter_uniform(torch.tensor(5), 0, (200_000,), "cpu")
    assert 0.0 <= many.min() and many.max() < 1.0
    assert abs(many.mean().item() - 0.5) < 0.005
    assert abs((many < 0.1).float().mean().item() - 0.1) < 0.005


@pytest.mark.parametrize("arithmetic", ["exact", "batched"])
def test_a_diverging_member_stops_alone(tmp_path, arithmetic):
    common = {"arch": "mlp", "mlp_width": 64, "batch_size": 32,
              "irm_penalty_anneal_iters": 0}
    good, bad = dict(common, irm_lambda=10.0), dict(common, lr=1e30)   # Adam: lr x sign
    commands = [command(train_flags(tmp_path / name, tmp_path, "IRM", seed=i, **hp))
                for i, (name, hp) in enumerate([("good", good), ("bad", bad)])]
    result = run_group(commands, arithmetic)
    status = {os.path.basename(o.output_dir): o.status for o in result.outcomes}
    assert status == {"good": "ok", "bad": "failed"}
    err = (tmp_path / "bad" / "err.txt").read_text()
    assert err.startswith("error: ") and "became" in err and "IRM on ColoredMNIST" in err
    assert not (tmp_path / "bad" / "done").exists()
    assert "exit code 2" in (tmp_path / "bad" / "launcher.log").read_text()
    train.main(train_flags(tmp_path / "good_single", tmp_path, "IRM", seed=0, **good))
    assert_same_records(records(tmp_path / "good_single"), records(tmp_path / "good"),
                        acc_tol=0.02)


def _resume_step(run_dir):
    path = os.path.join(run_dir, "resume_state.pt")
    try:
        return torch.load(path, weights_only=True)["next_step"]
    except Exception:
        return 0


def comparable(run_dir):
    """A run's records without what differs between any two runs of the same arguments
    (seconds, memory, the output folder)."""
    out = []
    for record in records(run_dir):
        for key in NOT_COMPARED:
            record.pop(key, None)
        record["args"].pop("output_dir")
        name = record["args"]["arithmetic"]
        record["args"]["arithmetic"] = SAME_ARITHMETIC.get(name, name)
        out.append(record)
    return out


def _kill_when_past(commands, step, arithmetic):
    """Start the group in a child process and SIGKILL it once every member has a
    checkpoint past `step`."""
    child = multiprocessing.get_context("fork").Process(target=run_group,
                                                        args=(commands, arithmetic))
    child.start()
    deadline = time.time() + 240
    while time.time() < deadline and child.is_alive() and \
            min(_resume_step(c.output_dir) for c in commands) < step:
        time.sleep(0.05)
    assert child.is_alive(), "the group finished before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert not any(os.path.exists(os.path.join(c.output_dir, "done")) for c in commands)


LONG = dict(steps=300, checkpoint_freq=25)
TINY = {"arch": "mlp", "mlp_width": 32, "mlp_depth": 3, "batch_size": 16}
# a dropout member, one without, one with another rate: the rates differ within a group
WITH_DROPOUT = [{"lr": 1e-3, "mlp_dropout": 0.5}, {"lr": 3e-3},
                {"lr": 2e-4, "weight_decay": 1e-3, "mlp_dropout": 0.1}]


def _member_commands(tmp_path, prefix, order=(0, 1, 2), members=WITH_DROPOUT):
    return [command(train_flags(tmp_path / f"{prefix}{i}", tmp_path, seed=i, **LONG,
                                **TINY, **members[i])) for i in order]


@pytest.mark.slow
@pytest.mark.parametrize("arithmetic", ["exact", "batched"])
def test_kill_and_relaunch_resumes_every_member(tmp_path, arithmetic):
    """SIGKILL a group (dropout on) mid-run, relaunch its members in another order: every
    member resumes from its own last checkpoint and ends with the records of an
    uninterrupted run; exact members end with their single runs' records."""
    killed = _member_commands(tmp_path, "killed")
    _kill_when_past(killed, 100, arithmetic)
    result = run_group(killed[::-1], arithmetic)
    assert [o.status for o in result.outcomes] == ["ok"] * 3
    for c in killed:
        assert "notice: resuming" in open(os.path.join(c.output_dir, "launcher.log")).read()
    run_group(_member_commands(tmp_path, "whole"), arithmetic)
    for i in range(3):
        assert comparable(tmp_path / f"whole{i}") == comparable(tmp_path / f"killed{i}")
        if arithmetic == "exact":
            train.main(train_flags(tmp_path / f"single{i}", tmp_path, seed=i, **LONG, **TINY,
                                   **WITH_DROPOUT[i]))
            assert comparable(tmp_path / f"single{i}") == comparable(tmp_path / f"killed{i}")


@pytest.mark.slow
def test_a_single_run_resumes_a_fused_member_and_a_group_resumes_a_single_run(tmp_path):
    """Either resumes the other: a member killed in its group finishes as a single run,
    a killed single run finishes in a group, and both end with the uninterrupted single
    runs' records (dropout on: each keeps its own random generators)."""
    killed = _member_commands(tmp_path, "fused", order=(0, 1))
    _kill_when_past(killed, 100, "exact")
    flags = [train_flags(tmp_path / f"fused{i}", tmp_path, seed=i, **LONG, **TINY,
                         **WITH_DROPOUT[i]) for i in range(2)]
    train.main(flags[0])                  # member 0 goes on alone
    proc = subprocess.Popen([sys.executable, "-m", "domainbed.scripts.train",
                             *train_flags(tmp_path / "alone2", tmp_path, seed=2, **LONG,
                                          **TINY, **WITH_DROPOUT[2])])
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and \
            _resume_step(tmp_path / "alone2") < 100:
        time.sleep(0.05)
    assert proc.poll() is None, "the single run finished before it could be killed"
    proc.kill()
    proc.wait()
    # member 1 (killed in its group) and the killed single run resume together
    result = run_group([command(flags[1]), _member_commands(tmp_path, "alone", (2,))[0]],
                       "exact")
    assert [o.status for o in result.outcomes] == ["ok"] * 2
    for i, name in ((0, "fused0"), (1, "fused1"), (2, "alone2")):
        train.main(train_flags(tmp_path / f"single{i}", tmp_path, seed=i, **LONG, **TINY,
                               **WITH_DROPOUT[i]))
        assert comparable(tmp_path / f"single{i}") == comparable(tmp_path / name), name


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_exact_members_are_their_single_runs_over_hundreds_of_steps(tmp_path, dropout):
    """Records and predictions of every checkpoint equal the single runs', bit for bit."""
    import numpy as np
    members = [{"lr": 1e-3, "mlp_dropout": dropout}, {"lr": 3e-3, "mlp_dropout": 0.1},
               {"lr": 2e-4}]
    result = single_and_fused(tmp_path, [dict(TINY, **m) for m in members], **LONG)
    assert [o.status for o in result.outcomes] == ["ok"] * 3
    for i in range(3):
        assert comparable(tmp_path / f"single{i}") == comparable(tmp_path / f"fused{i}")
        names = sorted(os.listdir(tmp_path / f"single{i}" / "predictions"))
        assert names == sorted(os.listdir(tmp_path / f"fused{i}" / "predictions"))
        for name in names:
            a = np.load(tmp_path / f"single{i}" / "predictions" / name)
            b = np.load(tmp_path / f"fused{i}" / "predictions" / name)
            assert sorted(a.files) == sorted(b.files)
            assert all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.slow
@pytest.mark.parametrize("arithmetic", ["exact", "batched"])
def test_a_members_records_do_not_depend_on_its_group(tmp_path, arithmetic):
    """Member 0 (dropout 0.5) alone, with two others, and last in reversed order: the
    same records, in either arithmetic."""
    run_group(_member_commands(tmp_path, "alone", order=(0,)), arithmetic)
    run_group(_member_commands(tmp_path, "group"), arithmetic)
    run_group(_member_commands(tmp_path, "reversed", order=(2, 1, 0)), arithmetic)
    assert comparable(tmp_path / "alone0") == comparable(tmp_path / "group0") == \
        comparable(tmp_path / "reversed0")
    assert comparable(tmp_path / "group2") == comparable(tmp_path / "reversed2")


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


def _zoo(tmp_path, arithmetic, n_members=5):
    """A small model zoo (every test environment, members differing in lr, dropout and
    seed), trained by fused groups in one arithmetic."""
    for test_env in range(3):
        commands = []
        for i in range(n_members):
            flags = train_flags(tmp_path / arithmetic / f"env{test_env}_{i}", tmp_path,
                                seed=i, **LONG, **TINY, lr=[3e-4, 1e-3, 3e-3][i % 3],
                                mlp_dropout=[0.0, 0.1, 0.5][i % 3])
            flags[flags.index("--test_envs") + 1] = str(test_env)
            commands.append(command(flags))
        result = run_group(commands, arithmetic)
        assert [o.status for o in result.outcomes] == ["ok"] * n_members
    return tmp_path / arithmetic


@pytest.mark.slow
def test_batched_and_exact_zoos_give_the_same_accuracy_on_the_line(tmp_path):
    """Batched members part from their single runs (rounding, their own dropout masks), but
    the zoo-level result does not move: for each split, the two zoos' R differ by less than
    the 95% margin of a difference of two independent estimates (the root sum of squares of
    their bootstrap half-widths). Each R inside the other zoo's own interval is too strict
    a test: it treats the other zoo as exact, and near |R| = 1 its interval is a few
    thousandths wide (torch 2.4's single runs, whose kernels differ from later torch's,
    land 0.0015 outside it while the batched zoo is bit for bit the same)."""
    from analysis.aotl import load_accuracies, per_ood_table
    fits = {}
    for arithmetic in ("exact", "batched"):
        acc = load_accuracies([_zoo(tmp_path, arithmetic)], split="out", checkpoints="all")
        fits[arithmetic] = per_ood_table(acc, n_boot=1000).set_index("ood_env")
    exact, batched = fits["exact"], fits["batched"]
    assert list(exact.index) == list(batched.index) == [0, 1, 2]
    assert (exact["n"] == batched["n"]).all()
    for env in range(3):
        half_widths = [(fit.loc[env, "r_ci_high"] - fit.loc[env, "r_ci_low"]) / 2
                       for fit in (exact, batched)]
        margin = math.hypot(*half_widths)
        assert abs(exact.loc[env, "r"] - batched.loc[env, "r"]) <= margin, \
            (env, margin, exact.loc[env].to_dict(), batched.loc[env].to_dict())


def test_an_unknown_arithmetic_is_one_clear_error():
    from domainbed.launch.fused import fused_launcher
    from oodutils.errors import UserError
    with pytest.raises(UserError, match="--fused_arithmetic must be one of auto, exact, "
                                        "batched, got 'fast'"):
        fused_launcher([], fused_arithmetic="fast")
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.sweep", "launch",
                           "--datasets", "Debug28", "--algorithms", "ERM",
                           "--command_launcher", "fused", "--fused_arithmetic", "fast",
                           "--output_dir", "unused"], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--fused_arithmetic" in proc.stderr and "'fast'" in proc.stderr
