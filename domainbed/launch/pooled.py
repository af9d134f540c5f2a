"""The `pooled` command launcher: many short train jobs in a few long-lived processes.

On a 2-core CPU a short ColoredMNIST run (a few hundred MLP steps) costs a few seconds of
arithmetic, but starting a Python process that imports torch and the registry costs
seconds more; the pooled launcher pays that start once per worker, not once per job.
Each job is still an ordinary train job: the same argv, the same run directory, records,
predictions, `done`, lock and `launcher.log` as with the local launcher, and a rerun
resumes it from its last checkpoint. The workers are our own processes (not a
multiprocessing.Pool, which hangs forever when a worker is killed): a worker that dies is
noticed through its process sentinel, its job is failed with the reason, and a new worker
takes the remaining jobs. Workers are spawned, never forked (a fork of a process whose
torch or polars threads hold a lock can hang): a script that launches them needs the
``if __name__ == "__main__":`` guard, as with the fused launcher.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from domainbed.launch import jobs
from domainbed.launch.local import _report
from domainbed.launch.progress import SweepProgress
from oodutils.errors import UserError

if TYPE_CHECKING:
    from domainbed.training.config import RunConfig

TRAIN_MODULE = "domainbed.scripts.train"
Train = Callable[["RunConfig"], Any]   # (torch and training are imported by the workers)

def train_flags(command: Any) -> Any:
    """The train flags of a `python -m domainbed.scripts.train ...` command, else None."""
    argv = [str(a) for a in command.argv]
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == TRAIN_MODULE:
        return argv[3:]
    return None


@contextlib.contextmanager
def _output_to(log: Any) -> Iterator[Any]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to the open file
    `log` (the job's launcher.log, opened through its pinned job folder)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def starts_processes(flags: Any) -> bool:
    """A data-parallel job (--distributed N) starts its own processes, which a pooled
    worker (a daemon process) may not: it runs as its own command."""
    values = [value for flag, value in zip(flags, flags[1:]) if flag == "--distributed"]
    values += [flag.split("=", 1)[1] for flag in flags if flag.startswith("--distributed=")]
    return any(value.isdigit() and int(value) > 1 for value in values)


def run_single_threaded(config: RunConfig) -> Any:
    """The train command's own run (`training.run.run_config`), torch on one thread unless
    the job asks for more (``--num_threads``): what a worker runs each job with."""
    import torch

    from domainbed.training.run import run_config

    torch.set_num_threads(1)
    return run_config(config)


def run_in_process(command: Any, train: Train = run_single_threaded) -> Any:
    """`jobs.run_command` without a new process: the same claim (skip rules, lock, log,
    refusal of unsafe job folders) and outcome; the job's RunConfig runs through `train`."""
    flags = train_flags(command)
    if flags is None or starts_processes(flags):
        return jobs.run_command(command)
    claim = jobs.JobClaim(command.output_dir)
    if claim.outcome is not None:
        return claim.outcome
    try:
        claim.write_log(f"{jobs.LOG_PREFIX} pid {os.getpid()} running in process: "
                        f"{command}")
        code = _call_train(flags, claim.log, train)
        claim.write_log(f"{jobs.LOG_PREFIX} exit code {code}")
        ok = code == 0 and jobs.is_done(command.output_dir)
        return jobs.Outcome(command.output_dir, "ok" if ok else "failed", code)
    finally:
        claim.release()


def _call_train(flags: Any, log: Callable[[str], Any], train: Train) -> Any:
    from domainbed.training.config import RunConfig

    with _output_to(log):
        try:
            train(RunConfig.from_argv(flags))
            return 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:   # argparse
            return e.code if isinstance(e.code, int) else 1
        except Exception:   # the job failed; run_config wrote err.txt with the traceback
            traceback.print_exc()
            return 1


# ---------------------------------------------------------------- the worker processes
def _worker_loop(conn: Any, train: Train) -> None:
    """A worker: run each command received, send back its Outcome; None ends it."""
    while True:
        command = conn.recv()
        if command is None:
            return
        try:
            conn.send(run_in_process(command, train))
        except Exception:   # a launcher bug, not a job failure: the parent raises it
            conn.send(traceback.format_exc())


class _Worker:
    """One long-lived process and the job it runs now (None when idle)."""

    def __init__(self, context: Any, train: Train) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_loop, args=(child, train), daemon=True)
        self.process.start()
        child.close()
        self.command: Any = None

    def give(self, command: Any) -> None:
        self.command, self.started = command, time.monotonic()
        self.conn.send(command)

    def result(self) -> Any:
        """The Outcome of its job, or None when the worker died without sending one."""
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        return None

    def stop(self, wait: bool = True) -> None:
        if wait and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        self.conn.close()


def died_outcome(command: Any, process: Any) -> Any:
    """A job whose worker died (kill -9, the out-of-memory killer): failed, with the
    reason appended to its launcher.log, where `sweep status` finds it."""
    code = process.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else \
        f"exit code {code}"
    reason = f"pooled worker {process.pid} died ({how}) while running this job"
    try:
        path = os.path.join(command.output_dir, jobs.LOG_FILE)
        with os.fdopen(jobs.open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                       "ab") as log:
            log.write(f"{reason}\n{jobs.LOG_PREFIX} exit code {code}\n".encode(
                "utf-8", "backslashreplace"))
    except (OSError, jobs.UnsafePath):
        pass   # the outcome still says failed
    return jobs.Outcome(command.output_dir, "failed", code)


def _run_workers(commands: Any, n_workers: Any, train: Train, on_idle: Any = None
                 ) -> Iterator[Any]:
    """Yield (Outcome, seconds it ran) of each command as it finishes, running them in
    `n_workers` processes; a worker that dies is replaced and its job reported failed.
    `on_idle` is called about every second while jobs run (the progress lines)."""
    context = multiprocessing.get_context("spawn")
    pending = list(reversed(commands))
    workers = [_Worker(context, train) for _ in range(n_workers)]
    try:
        for w in workers:
            if pending:
                w.give(pending.pop())
        while any(w.command is not None for w in workers):
            busy = [w for w in workers if w.command is not None]
            multiprocessing.connection.wait([w.conn for w in busy] +
                                            [w.process.sentinel for w in busy], timeout=1.0)
            if on_idle is not None:
                on_idle()
            for i, w in enumerate(workers):
                if w.command is None:
                    continue
                outcome = w.result()
                if outcome is None and w.process.is_alive():
                    continue   # still running
                if isinstance(outcome, str):
                    raise RuntimeError(f"pooled worker failed:\n{outcome}")
                seconds = time.monotonic() - w.started
                if outcome is None:
                    w.process.join()
                    outcome = died_outcome(w.command, w.process)
                    w.stop(wait=False)
                    w = workers[i] = _Worker(context, train)
                w.command = None
                if pending:
                    w.give(pending.pop())
                yield outcome, seconds
    finally:
        for w in workers:
            w.stop(wait=w.command is None)


def pooled_launcher(commands: Any, max_workers: int = 1, echo: Any = None,
                    train: Train = run_single_threaded, **_: Any) -> Any:
    """Run train jobs in `max_workers` long-lived processes (each job under its lock, as
    the local launcher), paying Python and torch start-up once per worker. Shows the
    local launcher's progress (a bar with ETA on a terminal, else status lines) and one
    line per finished job naming its algorithm, dataset and test environments. A worker
    that dies fails its job alone (with the reason in the job's launcher.log) and is
    replaced. `train`: what a worker runs each job's RunConfig with (a module-level
    function: the spawned workers import it, and at start only it and the launching script)."""
    max_workers = int(max_workers or 1)
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    if not commands:
        return []
    slots = min(max_workers, len(commands))
    progress = SweepProgress(len(commands), slots,
                             echo or (lambda line: print(line, flush=True)))
    names = {c.output_dir: c.describe() for c in commands}
    outcomes, waiting = [], len(commands)
    for _ in range(slots):  # type: ignore[assignment]  # a worker takes the next job as soon as it is free
        progress.job_started()
        waiting -= 1
    try:
        for outcome, seconds in _run_workers(commands, slots, train, progress.tick):
            outcomes.append(outcome)
            _report(outcome, progress.echo, names.get(outcome.output_dir))
            # the worker took the next job before this one was reported
            progress.job_finished(outcome, seconds, next_started=waiting > 0)
            waiting = max(0, waiting - 1)
    finally:
        progress.close()
    return outcomes
