"""The `pooled` command launcher: many short train jobs in a few long-lived processes.

On a 2-core CPU a short ColoredMNIST run (a few hundred MLP steps) costs a few seconds of
arithmetic, but starting a Python process that imports torch and the registry costs
seconds more; the pooled launcher pays that start once per worker, not once per job.
Each job is still an ordinary train job: the same argv, the same run directory, records,
predictions, `done`, lock and `launcher.log` as with the local launcher, and a rerun
resumes it from its last checkpoint.
"""
import contextlib
import multiprocessing
import os
import sys
import time

from domainbed.launch import jobs
from oodutils.errors import UserError

TRAIN_MODULE = "domainbed.scripts.train"

def train_flags(command):
    """The train flags of a `python -m domainbed.scripts.train ...` command, else None."""
    argv = [str(a) for a in command.argv]
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == TRAIN_MODULE:
        return argv[3:]
    return None


@contextlib.contextmanager
def _output_to(path):
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
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


def run_in_process(command):
    """`jobs.run_command` without a new process: the same skip rules, lock, log
    and outcome; the job runs through the train CLI's own `main`."""
    flags = train_flags(command)
    if flags is None:
        return jobs.run_command(command)
    out = command.output_dir
    done = os.path.join(out, jobs.DONE_FILE)
    if os.path.exists(done):
        return jobs.Outcome(out, "skipped_done")
    os.makedirs(out, exist_ok=True)
    fd = jobs._try_lock(os.path.join(out, jobs.LOCK_FILE))
    if fd is None:
        return jobs.Outcome(out, "skipped_running")
    try:
        if os.path.exists(done):
            return jobs.Outcome(out, "skipped_done")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        log_path = os.path.join(out, jobs.LOG_FILE)
        with open(log_path, "ab") as log:
            log.write(f"{jobs.LOG_PREFIX} pid {os.getpid()} running in process: "
                      f"{command}\n".encode())
        code = _call_train(flags, log_path)
        with open(log_path, "ab") as log:
            log.write(f"{jobs.LOG_PREFIX} exit code {code}\n".encode())
        ok = code == 0 and os.path.exists(done)
        return jobs.Outcome(out, "ok" if ok else "failed", code)
    finally:
        os.close(fd)


def _call_train(flags, log_path):
    from domainbed.api import run_config
    from domainbed.config import RunConfig
    with _output_to(log_path):
        try:
            run_config(RunConfig.from_argv(flags))
            return 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:   # argparse
            return e.code if isinstance(e.code, int) else 1
        except Exception:   # the job failed; run_config wrote err.txt with the traceback
            import traceback
            traceback.print_exc()
            return 1


def _worker_init():
    import torch
    torch.set_num_threads(1)


def pooled_launcher(commands, max_workers=1, echo=None, **_):
    """Run train jobs in `max_workers` long-lived processes (each job under its lock, as
    the local launcher), paying Python and torch start-up once per worker. Prints one
    progress line per finished job."""
    max_workers = int(max_workers or 1)
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    if not commands:
        return []
    echo = echo or (lambda line: print(line, flush=True))
    start, outcomes = time.time(), []
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with context.Pool(min(max_workers, len(commands)), initializer=_worker_init) as pool:
        for outcome in pool.imap_unordered(run_in_process, commands):
            outcomes.append(outcome)
            if echo and outcome.status in ("ok", "failed"):
                elapsed = time.time() - start
                ran = sum(o.status in ("ok", "failed") for o in outcomes)
                echo(f"[{len(outcomes)}/{len(commands)}] {outcome.status}: "
                     f"{outcome.output_dir} ({elapsed:.0f} s, "
                     f"{3600 * ran / max(elapsed, 1e-9):.0f} runs/hour)")
                if outcome.status == "failed":
                    echo(f"  {jobs.last_error(outcome.output_dir)}")
    return outcomes
