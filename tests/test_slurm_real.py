"""The slurm launcher on a real single-node Slurm cluster (scripts/slurm_cluster.py):
an array with the launcher's Slurm options, `sweep status` beside Slurm's view, and jobs
stopped by `scancel` and by their time limit that resume on relaunch to the records of
uninterrupted runs.

To stop a job *mid-run* whatever the machine's speed, the test freezes its train process
(SIGSTOP) after the first checkpoint; Slurm then stops the job itself (scancel, or the
time limit lowered with `scontrol update`), sending SIGCONT, SIGTERM and SIGKILL as it
does to any job.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hardening_util import comparable, records
from tests.requirements import need_slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "scripts" / "slurm_cluster.py"
SWEEP_FLAGS = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
               "--n_trials", "1", "--single_test_envs", "--steps", "300",
               "--checkpoint_freq", "50", "--num_threads", "1",
               "--hparams", '{"arch": "mlp", "mlp_width": 32}', "--skip_confirmation"]
SLURM_FLAGS = ["--slurm_partition", "debug", "--slurm_timeout_min", "10", "--slurm_cpus", "1",
               "--slurm_mem_gb", "0.5", "--slurm_gpus", "0", "--slurm_array_parallelism", "2"]


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    need_slurm()
    folder = tmp_path_factory.mktemp("slurm")
    start = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "start", str(folder),
                            "--cpus", "2"], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=os.environ["PATH"] + ":/usr/sbin")
    for line in start.stdout.splitlines():   # export NAME=VALUE
        name, value = line.removeprefix("export ").split("=", 1)
        env[name] = value
    yield env
    subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "stop", str(folder)], timeout=120)


def sweep(env, command, out, *flags):
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.sweep", command,
                           "--output_dir", str(out), "--data_dir", str(out.parent),
                           *SWEEP_FLAGS, *flags], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def slurm(env, *argv):
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def wait_for(predicate, what, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def submitted(out):
    """run directory -> Slurm job id, as the launcher recorded them."""
    with open(out / ".slurm_jobs.jsonl") as f:
        return {out / e["run"]: e["job_id"] for e in map(json.loads, f)}


def job_state(env, job_id):
    text = slurm(env, "scontrol", "show", "job", "-o", job_id)
    return dict(f.split("=", 1) for f in text.split() if "=" in f)["JobState"]


def first_checkpoints(ids, n):
    """The first `n` jobs to write a record; each one's train process frozen (SIGSTOP) at
    once, so that it is mid-run whatever this machine's speed."""
    frozen = []
    deadline = time.monotonic() + 300
    while len(frozen) < n and time.monotonic() < deadline:
        for run in ids:
            if run not in frozen and (run / "results.jsonl").exists() and records(run):
                os.kill(int((run / ".lock").read_text().split()[0]), signal.SIGSTOP)
                frozen.append(run)
        time.sleep(0.05)
    assert len(frozen) == n, f"only {len(frozen)} jobs started"
    assert not any((run / "done").exists() for run in frozen), "a job finished too soon"
    return frozen


def test_array_options_status_cancel_and_time_limit_resume(slurm_env, tmp_path):
    out = tmp_path / "sweep"
    printed = sweep(slurm_env, "launch", out, "--command_launcher", "slurm", *SLURM_FLAGS)
    assert "Submitted 3 Slurm jobs" in printed
    assert "Submitted Slurm job" in printed and "ERM on Debug28, test envs [0]" in printed
    ids = submitted(out)
    array_id = next(iter(ids.values())).split("_")[0]
    cancelled, timed_out = first_checkpoints(ids, 2)   # the two the throttle lets run

    # the launcher's options reached Slurm
    array = slurm(slurm_env, "scontrol", "show", "job", "-o", array_id)
    for field in ("Partition=debug", "TimeLimit=00:10:00", "MinMemoryNode=512M",
                  "ArrayTaskThrottle=2"):
        assert field in array, field
    assert "NumCPUs=1 " in array

    # two tasks run (throttle 2), the third waits: status shows Slurm's view beside ours
    status = sweep(slurm_env, "status", out, "--command_launcher", "slurm")
    assert "Slurm: PENDING" in status and "Slurm: RUNNING" in status, status
    assert "Slurm's view of the jobs not finished here: 1 pending, 2 running." in status
    assert "2 running" in status

    # one job cancelled mid-run, one stopped by its time limit (lowered to 1 minute)
    slurm(slurm_env, "scancel", ids[cancelled])
    slurm(slurm_env, "scontrol", "update", f"JobId={ids[timed_out]}", "TimeLimit=1")

    reference = tmp_path / "reference"   # the same jobs, uninterrupted, meanwhile
    sweep(slurm_env, "launch", reference, "--command_launcher", "local", "--max_workers", "2")

    wait_for(lambda: job_state(slurm_env, ids[cancelled]) == "CANCELLED", "the cancel")
    wait_for(lambda: job_state(slurm_env, ids[timed_out]) == "TIMEOUT", "the time limit",
             timeout=240)
    wait_for(lambda: not slurm(slurm_env, "squeue", "-h", "-r", "-j", array_id).strip(),
             "the array to leave the queue")
    status = sweep(slurm_env, "status", out, "--command_launcher", "slurm")
    lines = {run: next(line for line in status.splitlines() if str(run) in line)
             for run in (cancelled, timed_out)}
    assert lines[cancelled].startswith("interrupted") and "Slurm: CANCELLED" in \
        lines[cancelled], status
    assert lines[timed_out].startswith("interrupted") and "Slurm: TIMEOUT" in \
        lines[timed_out], status
    assert "1 done" in status and "2 interrupted" in status

    relaunch = sweep(slurm_env, "launch", out, "--command_launcher", "slurm", *SLURM_FLAGS)
    assert "Launching 2 jobs (2 to resume, 0 new)" in relaunch
    wait_for(lambda: all((r / "done").exists() for r in ids), "the resumed jobs")
    for run in ids:
        assert comparable(records(run)) == comparable(records(reference / run.name)), run
    for run in (cancelled, timed_out):   # resumed, not restarted: two attempts, one run
        log = (run / "launcher.log").read_text()
        assert log.count("running:") == 2, log
        assert "notice: resuming" in log, log
