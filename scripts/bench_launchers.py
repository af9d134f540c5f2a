"""What a launcher costs: seconds from `sweep launch` to the first training record, and
seconds per job, for the local, pooled, Slurm and Ray launchers on this machine.

    python scripts/bench_launchers.py [--jobs 4] [--launchers local pooled slurm ray]

Each launcher runs the same sweep of tiny jobs (Debug28, ERM with a small MLP, 2 steps:
the job's own training is a few milliseconds, so what is timed is the launcher, the
process start, imports, data and evaluation), one job at a time: `--max_workers 1`, a
Slurm array throttled to 1 on a single-node cluster (scripts/slurm_cluster.py), a
one-node Ray cluster offering 1 CPU (scripts/ray_cluster.py). Cluster start-up is not
counted. "First record" is the first results.jsonl of the sweep appearing (step 0 trained
and evaluated), polled every 0.05 s. Slurm needs the slurm-wlm and munge packages and root;
a launcher that cannot run here is left out with the reason.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ray_cluster import RayCluster, ray_binary  # noqa: E402
from slurm_cluster import missing_binaries  # noqa: E402

SWEEP = ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
         "--n_trials", "1", "--steps", "2", "--checkpoint_freq", "1", "--num_threads", "1",
         "--hparams", '{"arch": "mlp", "mlp_width": 32}', "--skip_confirmation"]


def n_jobs_flags(jobs):
    """Debug28 has 3 environments: --single_test_envs gives 3 jobs per trial."""
    trials = max(1, -(-jobs // 3))
    return ["--single_test_envs", "--n_trials", str(trials)], 3 * trials


def time_sweep(out, launcher_flags, env, n_jobs, timeout=1800):
    """(seconds to the first record, seconds until every job is done)."""
    trial_flags, _ = n_jobs_flags(n_jobs)
    argv = [sys.executable, "-m", "domainbed.scripts.sweep", "launch", "--output_dir",
            str(out), "--data_dir", str(out.parent), *SWEEP, *trial_flags, *launcher_flags]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = None
    while time.monotonic() - start < timeout:
        runs = [r for r in out.iterdir() if r.is_dir() and not r.name.startswith(".")] \
            if out.exists() else []
        if first is None and any((r / "results.jsonl").exists() for r in runs):
            first = time.monotonic() - start
        if len(runs) == n_jobs and all((r / "done").exists() for r in runs):
            break
        if proc.poll() not in (None, 0):
            raise RuntimeError(f"sweep failed:\n{proc.stdout.read()}")
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError(f"{launcher_flags}: not done within {timeout} s")
    total = time.monotonic() - start
    proc.wait()
    return first, total


def run_all(launchers, n_jobs, folder):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    _, n = n_jobs_flags(n_jobs)
    figures, skipped = {}, {}
    for name in launchers:
        out = folder / name / "sweep"
        out.parent.mkdir(parents=True)
        if name in ("local", "pooled"):
            figures[name] = time_sweep(out, ["--command_launcher", name, "--max_workers", "1"],
                                       env, n)
        elif name == "slurm":
            absent = missing_binaries()
            if absent or os.geteuid() != 0:
                skipped[name] = f"missing {', '.join(absent)}" if absent else "not root"
                continue
            cluster = folder / "slurm-cluster"
            start = subprocess.run([sys.executable, str(REPO / "scripts" / "slurm_cluster.py"),
                                    "start", str(cluster), "--cpus", "1"],
                                   capture_output=True, text=True, check=True)
            slurm_env = dict(env, SLURM_CONF=start.stdout.strip().split("=", 1)[1],
                             PATH=env["PATH"] + ":/usr/sbin")
            try:
                figures[name] = time_sweep(out, [
                    "--command_launcher", "slurm", "--slurm_partition", "debug",
                    "--slurm_gpus", "0", "--slurm_cpus", "1", "--slurm_mem_gb", "1",
                    "--slurm_array_parallelism", "1"], slurm_env, n)
            finally:
                subprocess.run([sys.executable, str(REPO / "scripts" / "slurm_cluster.py"),
                                "stop", str(cluster)])
        elif name == "ray":
            if ray_binary() is None:
                skipped[name] = "no ray command"
                continue
            with RayCluster(folder / "ray-cluster", cpus_per_node=1) as cluster:
                figures[name] = time_sweep(out, [
                    "--command_launcher", "ray", "--ray_address", cluster.address],
                    dict(env, **cluster.env()), n)
    return figures, skipped, n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs per sweep (rounded up to "
                        "a multiple of 3)")
    parser.add_argument("--launchers", nargs="+", default=["local", "pooled", "slurm", "ray"])
    parser.add_argument("--no_record", action="store_true",
                        help="print the figures without writing docs/benchmarks")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_launchers_") as tmp:
        figures, skipped, n = run_all(args.launchers, args.jobs, Path(tmp))
    parts = [f"{name} {first:.1f} s to first record, {total / n:.1f} s/job"
             for name, (first, total) in figures.items()]
    result = f"{n} two-step Debug28 jobs one at a time: " + "; ".join(parts)
    if skipped:
        result += " (not run: " + ", ".join(f"{k}: {v}" for k, v in skipped.items()) + ")"
    print(result)
    if not args.no_record:
        from benchfigures import record
        headline = ", ".join(f"{name} {total / n:.1f}" for name, (_, total) in
                             figures.items() if name != "local") + " s/job"
        peer = (f"local launcher {figures['local'][1] / n:.1f} s/job" if "local" in figures
                else "local launcher not run")
        record("launchers", what="Launcher overhead, seconds per tiny job",
               headline=headline[:60], peer=peer,
               command="python scripts/bench_launchers.py", result=result,
               method="`sweep launch` to the first training record, and wall seconds per "
               "job; tiny jobs one at a time (max_workers 1, a Slurm array throttled to 1 "
               "on a one-CPU single-node cluster, a one-node Ray cluster with 1 CPU); "
               "cluster start-up not counted; first record = step 0 trained and evaluated; "
               "seconds per job = sweep wall time / jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
