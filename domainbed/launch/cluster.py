"""Launchers that hand jobs to a cluster engine: `slurm` (a job array through submitit)
and `ray` (Ray tasks)."""
import os
import shutil
import signal
import subprocess
from typing import Any

from domainbed.launch.jobs import Outcome, run_command
from domainbed.launch.local import _report, visible_gpus
from domainbed.launch.slurm_status import record_submissions
from oodutils.errors import UserError, require


def _run_command_quietly(command: Any) -> Any:
    """Entry point for remote executors (ray): run one job, return its Outcome."""
    return run_command(command)


class SlurmJob:
    """What each Slurm array task runs: one job through `run_command`.

    Slurm warns a job before its time limit (submitit asks for SIGUSR2 `signal_delay_s`
    ahead). Without `requeue` the warning is ignored, by this process and the train
    process it starts: the job runs on until Slurm stops it at the limit, and a relaunch
    resumes it from its last checkpoint. With `requeue` submitit checkpoints this call
    (its arguments: the job's command) and requeues it: the new attempt resumes in the
    same run directory without a relaunch."""

    def __init__(self, requeue: bool = False) -> None:
        self.requeue = requeue

    def __call__(self, command: Any) -> Any:
        if not self.requeue:
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)   # inherited by the train process
        return run_command(command)

    def checkpoint(self, command: Any) -> Any:
        """submitit calls this on the time-limit warning or a preemption."""
        if not self.requeue:
            return None
        helpers = require("submitit.helpers", extra="cluster")
        return helpers.DelayedSubmission(SlurmJob(requeue=True), command)


def slurm_launcher(commands: Any, slurm_partition: Any = None, slurm_timeout_min: Any = 24 * 60,
                   slurm_gpus: int = 1, slurm_cpus: int = 8, slurm_mem_gb: int = 32,
                   slurm_array_parallelism: int = 256, slurm_log_dir: Any = None,
                   slurm_requeue: bool = False, **_: Any) -> list[Any]:
    """Submit the jobs as a Slurm job array through submitit and return without waiting;
    follow them with `sweep status` (which asks Slurm about jobs not finished). submitit's
    own logs go to `slurm_log_dir` (default: <sweep>/.submitit)."""
    submitit = require("submitit", extra="cluster")
    if not commands:
        return []
    if shutil.which("sbatch") is None:
        # submitit's AutoExecutor would silently run the jobs on this machine instead.
        raise UserError("the slurm launcher found no 'sbatch' on PATH (not a Slurm login "
                        "node?); use --command_launcher local here")
    sweep_dir = os.path.dirname(os.path.abspath(commands[0].output_dir))
    log_dir = slurm_log_dir or os.path.join(sweep_dir, ".submitit")
    executor = submitit.AutoExecutor(folder=log_dir, cluster="slurm")
    params = dict(timeout_min=int(slurm_timeout_min), gpus_per_node=int(slurm_gpus),
                  cpus_per_task=int(slurm_cpus), mem_gb=slurm_mem_gb, tasks_per_node=1,
                  nodes=1, slurm_array_parallelism=int(slurm_array_parallelism))
    if slurm_partition:
        params["slurm_partition"] = slurm_partition
    executor.update_parameters(**params)
    try:
        jobs = executor.map_array(SlurmJob(requeue=bool(slurm_requeue)), commands)
    except subprocess.CalledProcessError as e:   # sbatch refused the array
        output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        raise UserError(f"sbatch refused the job array: {(output or str(e)).strip()}") from None
    record_submissions(sweep_dir, [(c.output_dir, j.job_id) for c, j in zip(commands, jobs)])
    for command, job in zip(commands, jobs):
        print(f"Submitted Slurm job {job.job_id}: {command.describe()}")
    print(f"Submitted {len(jobs)} Slurm jobs (array {jobs[0].job_id.split('_')[0]}); "
          f"submitit logs in {log_dir}; follow them with `sweep status`")
    return []


def ray_launcher(commands: Any, ray_address: Any = None, ray_gpus_per_job: Any = None,
                 ray_cpus_per_job: int = 1, **_: Any) -> Any:
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
            command = pending.pop(ref)
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayError as e:   # its node died more often than Ray retries
                print(f"Ray lost the job ({type(e).__name__}): {command.describe()}")
                outcome = Outcome(command.output_dir, "failed")
            _report(outcome, print, command.describe())
            outcomes.append(outcome)
    return outcomes
