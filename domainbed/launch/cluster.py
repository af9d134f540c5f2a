"""Launchers that hand jobs to a cluster engine: `slurm` (a job array through submitit)
and `ray` (Ray tasks)."""
import os
import shutil

from domainbed.launch.jobs import run_command
from domainbed.launch.local import _report, visible_gpus
from oodutils.errors import UserError, require


def _run_command_quietly(command):
    """Entry point for remote executors (slurm, ray): run one job, return its Outcome."""
    return run_command(command)


def slurm_launcher(commands, slurm_partition=None, slurm_timeout_min=24 * 60,
                   slurm_gpus=1, slurm_cpus=8, slurm_mem_gb=32, slurm_array_parallelism=256,
                   slurm_log_dir=None, **_):
    """Submit the jobs as a Slurm job array through submitit and return without waiting;
    follow them with `sweep status`. submitit's own logs go to `slurm_log_dir`."""
    submitit = require("submitit", extra="cluster")
    if not commands:
        return []
    if shutil.which("sbatch") is None:
        # submitit's AutoExecutor would silently run the jobs on this machine instead.
        raise UserError("the slurm launcher found no 'sbatch' on PATH (not a Slurm login "
                        "node?); use --command_launcher local here")
    log_dir = slurm_log_dir or os.path.join(
        os.path.dirname(os.path.abspath(commands[0].output_dir)), ".submitit")
    executor = submitit.AutoExecutor(folder=log_dir, cluster="slurm")
    params = dict(timeout_min=int(slurm_timeout_min), gpus_per_node=int(slurm_gpus),
                  cpus_per_task=int(slurm_cpus), mem_gb=slurm_mem_gb, tasks_per_node=1,
                  nodes=1, slurm_array_parallelism=int(slurm_array_parallelism))
    if slurm_partition:
        params["slurm_partition"] = slurm_partition
    executor.update_parameters(**params)
    jobs = executor.map_array(_run_command_quietly, commands)
    print(f"Submitted {len(jobs)} Slurm jobs (array {jobs[0].job_id.split('_')[0]}); "
          f"submitit logs in {log_dir}")
    return []


def ray_launcher(commands, ray_address=None, ray_gpus_per_job=None, ray_cpus_per_job=1,
                 **_):
    """Run the jobs as Ray tasks (on the cluster at `ray_address`, or RAY_ADDRESS, or a
    local Ray instance) and wait for them. Each task asks for `ray_gpus_per_job` GPUs
    (default: 1 when this machine has CUDA, else 0)."""
    ray = require("ray", extra="cluster")
    if not commands:
        return []
    if ray_gpus_per_job is None:
        ray_gpus_per_job = 1 if visible_gpus() else 0
    if not ray.is_initialized():
        ray.init(address=ray_address or os.environ.get("RAY_ADDRESS"))
    remote = ray.remote(num_gpus=ray_gpus_per_job, num_cpus=ray_cpus_per_job)(
        _run_command_quietly)
    pending = {remote.remote(c): c for c in commands}
    outcomes = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            pending.pop(ref)
            outcome = ray.get(ref)
            _report(outcome, print)
            outcomes.append(outcome)
    return outcomes
