"""The slurm launcher on a real single-node Slurm cluster (scripts/slurm_cluster.py):
an array with the launcher's Slurm options, `sweep status` beside Slurm's view, and jobs
stopped by `scancel` and by their time limit that resume on relaunch to the records of
uninterrupted runs.

To stop a job *mid-run* whatever the machine's speed, the test keeps its train process
frozen (SIGSTOP, again after each SIGCONT Slurm sends) from its first checkpoint on; Slurm
then stops the job itself (scancel, or the time limit lowered with `scontrol update`),
with SIGTERM and, KillWait later, SIGKILL, as it does to any job.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.builders import read_records
from tests.hardening_util import comparable, wait_for
from tests.requirements import need_slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "scripts" / "slurm_cluster.py"
SWEEP_FLAGS = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
               "--n_trials", "1", "--single_test_envs", "--steps", "300",
               "--checkpoint_freq", "50", "--num_threads", "1",
               "--hparams", '{"arch": "mlp", "mlp_width": 32}', "--skip_confirmation"]
TIMEOUT_S = 900   # for a step of the test on a loaded machine


def wait_for_slurm(predicate, what):
    return wait_for(predicate, what, timeout=TIMEOUT_S)
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


@pytest.fixture(scope="module")
def reference(tmp_path_factory, slurm_env):
    """The sweep's jobs run uninterrupted by the local launcher, in the background while
    the Slurm jobs run; `reference()` waits for it and returns its sweep folder."""
    out = tmp_path_factory.mktemp("reference") / "sweep"
    proc = subprocess.Popen(sweep_argv("launch", out, "--command_launcher", "local",
                                       "--max_workers", "2"), cwd=REPO, env=slurm_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finished():
        printed = proc.communicate(timeout=TIMEOUT_S)[0] if proc.returncode is None else ""
        assert proc.returncode == 0, printed
        return out
    yield finished
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def sweep_argv(command, out, *flags):
    # Debug28 reads no files; one --data_dir for every sweep keeps the job hashes (run
    # directory names) of the Slurm sweeps and the reference equal
    return [sys.executable, "-m", "domainbed.scripts.sweep", command, "--output_dir",
            str(out), "--data_dir", tempfile.gettempdir(), *SWEEP_FLAGS, *flags]


def sweep(env, command, out, *flags):
    proc = subprocess.run(sweep_argv(command, out, *flags), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def slurm(env, *argv):
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def submitted(out):
    """run directory -> Slurm job id, as the launcher recorded them."""
    with open(out / ".slurm_jobs.jsonl") as f:
        return {out / e["run"]: e["job_id"] for e in map(json.loads, f)}


def job_state(env, job_id):
    text = slurm(env, "scontrol", "show", "job", "-o", job_id)
    return dict(f.split("=", 1) for f in text.split() if "=" in f)["JobState"]


def keep_frozen(pid, stop):
    """SIGSTOP `pid` every 0.1 s until it is gone or `stop` is set: Slurm sends SIGCONT
    with its own signals (the time-limit warning among them), which would thaw it."""
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        stop.wait(0.1)


@pytest.fixture
def freezer():
    """freeze(pid): keep the process stopped (SIGSTOP) until it dies or the test ends."""
    stop = threading.Event()
    threads = []

    def freeze(pid):
        thread = threading.Thread(target=keep_frozen, args=(pid, stop), daemon=True)
        thread.start()
        threads.append(thread)
    yield freeze
    stop.set()
    for thread in threads:
        thread.join()


def first_checkpoints(ids, n, freeze):
    """The first `n` jobs to write a checkpoint (their resume state); each one's train
    process frozen at once, so that it is mid-run whatever this machine's speed."""
    frozen = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(frozen) < n and time.monotonic() < deadline:
        for run in ids:
            if len(frozen) < n and run not in frozen and (run / "resume_state.pt").exists():
                freeze(int((run / ".lock").read_text().split()[0]))
                frozen.append(run)
        time.sleep(0.05)
    assert len(frozen) == n, f"only {len(frozen)} jobs started"
    assert not any((run / "done").exists() for run in frozen), "a job finished too soon"
    return frozen


def test_array_options_status_cancel_and_time_limit_resume(slurm_env, reference, freezer,
                                                           tmp_path):
    out = tmp_path / "sweep"
    printed = sweep(slurm_env, "launch", out, "--command_launcher", "slurm", *SLURM_FLAGS)
    assert "Submitted 3 Slurm jobs" in printed
    assert "Submitted Slurm job" in printed and "ERM on Debug28, test envs [0]" in printed
    ids = submitted(out)
    array_id = next(iter(ids.values())).split("_")[0]
    cancelled, timed_out = first_checkpoints(ids, 2, freezer)   # the two the throttle lets run

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

    wait_for_slurm(lambda: job_state(slurm_env, ids[cancelled]) == "CANCELLED", "the cancel")
    wait_for_slurm(lambda: job_state(slurm_env, ids[timed_out]) == "TIMEOUT", "the time limit")
    wait_for_slurm(lambda: not slurm(slurm_env, "squeue", "-h", "-r", "-j", array_id).strip(),
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
    wait_for_slurm(lambda: all((r / "done").exists() for r in ids), "the resumed jobs")
    for run in ids:
        assert comparable(read_records(run)) == \
            comparable(read_records(reference() / run.name)), run
    for run in (cancelled, timed_out):   # resumed, not restarted: two attempts, one run
        log = (run / "launcher.log").read_text()
        assert log.count("running:") == 2, log
        assert "notice: resuming" in log, log


def test_requeue_resumes_a_job_at_its_time_limit_without_a_relaunch(slurm_env, reference,
                                                                    freezer, tmp_path):
    """--slurm_requeue: Slurm warns the job 90 s before its 3-minute limit, submitit
    requeues it, and the new attempt resumes from the last checkpoint."""
    out = tmp_path / "sweep"
    sweep(slurm_env, "launch", out, "--command_launcher", "slurm", "--slurm_requeue",
          *SLURM_FLAGS, "--slurm_timeout_min", "3")   # the last value wins
    ids = submitted(out)
    frozen = first_checkpoints(ids, 1, freezer)[0]
    wait_for_slurm(lambda: all((r / "done").exists() for r in ids), "every job")
    for run in ids:
        assert comparable(read_records(run)) == \
            comparable(read_records(reference() / run.name)), run
    log = (frozen / "launcher.log").read_text()
    assert log.count("running:") >= 2 and "notice: resuming" in log, log
    restarts = dict(f.split("=", 1) for f in slurm(
        slurm_env, "scontrol", "show", "job", "-o", ids[frozen]).split() if "=" in f)
    assert int(restarts["Restarts"]) >= 1
