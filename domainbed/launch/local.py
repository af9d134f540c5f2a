"""Launchers that run jobs on this machine: `dummy` (print only), `local` (N at a time)
and `multi_gpu` (one job per visible GPU, or per group of GPUs, at a time)."""
import dataclasses
import os
import queue
import threading
import time
from typing import Any

from domainbed.launch.jobs import last_error, run_command
from domainbed.launch.progress import SweepProgress
from oodutils.errors import UserError
from oodutils.log import get_logger

LOG = get_logger(__name__)


def _run_pool(commands: Any, slots: Any, echo: Any = print) -> list[Any]:
    """Run `commands` with one worker thread per slot; each slot is a dict of extra
    environment variables (e.g. CUDA_VISIBLE_DEVICES). Outcomes keep command order."""
    todo: Any = queue.Queue()
    for i, c in enumerate(commands):
        todo.put((i, c))
    outcomes = [None] * len(commands)
    errors = []
    stop = threading.Event()
    progress = SweepProgress(len(commands), len(slots), echo)
    echo = progress.echo

    def next_job() -> Any:
        try:
            return None if stop.is_set() else todo.get_nowait()
        except queue.Empty:
            return None

    def worker(slot_env: Any) -> None:
        job = next_job()
        if job is not None:
            progress.job_started()
        while job is not None:
            i, c = job
            started = time.monotonic()
            try:
                outcomes[i] = run_command(c, extra_env=slot_env, echo=echo)
            except BaseException as e:  # a launcher bug, not a job failure
                errors.append(e)
                stop.set()
                return
            _report(outcomes[i], echo, c.describe())
            job = next_job()   # taken before the report, so its line counts it as running
            progress.job_finished(outcomes[i], time.monotonic() - started,
                                  next_started=job is not None)

    if len(slots) == 1:
        worker(slots[0])
    else:
        threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in slots]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
                    progress.tick()
        except KeyboardInterrupt:
            stop.set()
            raise
    progress.close()
    if errors:
        raise errors[0]
    return [o for o in outcomes if o is not None]


def _report(outcome: Any, echo: Any, job: Any = None) -> None:
    """One status line for a finished job; `job` names it (Command.describe()), else its
    directory does."""
    if echo is None:
        return
    job = job or outcome.output_dir
    if outcome.status == "failed" and outcome.returncode is None:
        echo(f"Failed: {job}: {last_error(outcome.output_dir)}")
    elif outcome.status == "failed":
        echo(f"Failed (exit code {outcome.returncode}): {job}: "
             f"{last_error(outcome.output_dir)}")
    elif outcome.status == "skipped_running":
        echo(f"Skipped (running elsewhere): {job}")
    elif outcome.status == "ok":
        echo(f"Done: {job}")


def dummy_launcher(commands: Any, **_: Any) -> list[Any]:
    """Run nothing; print each command (for checking a sweep before launching it)."""
    for c in commands:
        print(f"Dummy launcher: {c}")
    return []


def local_launcher(commands: Any, max_workers: int = 1, echo: Any = None, **_: Any) -> Any:
    """Run the jobs on this machine, `max_workers` at a time (1 = one after another);
    `echo` takes the status lines (default: print), as the pooled launcher's."""
    max_workers = int(max_workers or 1)
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    return _run_pool(commands, [{}] * min(max_workers, max(1, len(commands))),
                     echo=echo or print)


def visible_gpus() -> list[Any]:
    """GPU ids from CUDA_VISIBLE_DEVICES (empty entries dropped), else all torch sees."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [g.strip() for g in value.split(",") if g.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def multi_gpu_launcher(commands: Any, gpus_per_job: int = 1, **_: Any) -> Any:
    """Run the jobs on this machine, each on `gpus_per_job` visible GPUs (one job per
    GPU by default), as many at a time as there are such groups; each job sees only its
    GPUs through CUDA_VISIBLE_DEVICES, and with several it trains data-parallel over
    them (train's `--distributed K`)."""
    gpus = visible_gpus()
    if not gpus:
        raise UserError("the multi_gpu launcher found no GPU (CUDA_VISIBLE_DEVICES is empty "
                        "or torch sees no CUDA device); use --command_launcher local")
    per_job = int(gpus_per_job or 1)
    if not 1 <= per_job <= len(gpus):
        raise UserError(f"--gpus_per_job must be between 1 and the {len(gpus)} visible "
                        f"GPU(s), got {per_job}")
    groups = [gpus[i:i + per_job] for i in range(0, len(gpus) - per_job + 1, per_job)]
    LOG.info(f"multi_gpu launcher: {len(gpus)} GPU(s): {', '.join(gpus)}; "
             f"{per_job} per job")
    if per_job > 1:
        commands = [dataclasses.replace(c, argv=[*c.argv, "--distributed", str(per_job)])
                    for c in commands]
    return _run_pool(commands, [{"CUDA_VISIBLE_DEVICES": ",".join(g)} for g in groups])


