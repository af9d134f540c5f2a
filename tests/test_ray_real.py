"""The ray launcher on a real two-node Ray cluster on this machine (scripts/ray_cluster.py):
one node fails mid-sweep (every process of it killed, its jobs with it), and a relaunch
finishes every job once, with the records of uninterrupted runs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from domainbed.training.resume import RESUME_FILE
from tests.builders import read_records
from tests.hardening_util import comparable, wait_for
from tests.requirements import need_ray

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
SWEEP_FLAGS = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
               "--n_trials", "1", "--single_test_envs", "--steps", "300",
               "--checkpoint_freq", "50", "--num_threads", "1",
               "--hparams", '{"arch": "mlp", "mlp_width": 32}', "--skip_confirmation"]


def sweep_argv(command, out, *flags):
    return [sys.executable, "-m", "domainbed.scripts.sweep", command, "--output_dir", str(out),
            "--data_dir", str(out.parent), *SWEEP_FLAGS, *flags]


def job_pids(out):
    """run directory -> pid of its train process, for the jobs running now."""
    from domainbed.launch.jobs import is_running
    pids = {}
    for run in (out.iterdir() if out.exists() else []):
        if run.is_dir() and (run / ".lock").exists() and is_running(str(run)):
            try:
                pids[run] = int((run / ".lock").read_text().split()[0])
            except (ValueError, IndexError):
                continue
    return pids


def test_a_node_lost_mid_sweep_and_a_relaunch_finish_every_job_once(tmp_path):
    need_ray()
    from ray_cluster import RayCluster, session_pids
    with RayCluster(tmp_path / "ray", cpus_per_node=1) as cluster:
        worker = cluster.add_node()
        env = dict(os.environ, PYTHONPATH=str(REPO), **cluster.env())
        out = tmp_path / "sweep"
        launch = subprocess.Popen(
            sweep_argv("launch", out, "--command_launcher", "ray",
                       "--ray_address", cluster.address),
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # one job on each node, each past its first checkpoint (its resume state
            # written: results.jsonl is written before it): stop the second node
            on_worker = set(session_pids(worker.proc.pid))
            def lost_job():
                on_worker.update(session_pids(worker.proc.pid))
                return [run for run, pid in job_pids(out).items() if pid in on_worker
                        and (run / RESUME_FILE).exists()]
            lost = wait_for(lost_job, "a job with a checkpoint on the second node")[0]
            cluster.fail_node(worker)
            printed, _ = launch.communicate(timeout=600)
        finally:
            if launch.poll() is None:
                launch.kill()
        assert not (lost / "done").exists() or "notice: resuming" in \
            (lost / "launcher.log").read_text(), printed

        relaunch = subprocess.run(
            sweep_argv("launch", out, "--command_launcher", "ray",
                       "--ray_address", cluster.address),
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr

    reference = tmp_path / "reference"
    proc = subprocess.run(sweep_argv("launch", reference, "--command_launcher", "local"),
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    runs = sorted(r for r in out.iterdir() if r.is_dir() and not r.name.startswith("."))
    assert len(runs) == 3 and all((r / "done").exists() for r in runs), printed
    for run in runs:
        assert comparable(read_records(run)) == comparable(read_records(reference / run.name)), run
        log = (run / "launcher.log").read_text()
        assert log.count("exit code 0") == 1, log   # finished once
    assert "notice: resuming" in (lost / "launcher.log").read_text()
