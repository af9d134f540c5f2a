"""Command launchers: run a sweep's jobs locally, on several GPUs, on Slurm or on Ray.

A launcher is a callable ``launcher(commands, **options) -> list`` registered by name
with ``@register_launcher("name")``. Each command is a :class:`Command`: an argv list
(never a shell string) plus the job's output directory. Launchers that wait for their
jobs return one :class:`Outcome` per command; launchers that only submit (slurm) return
an empty list. Options a launcher does not use are ignored, so the sweep can pass them
all (``max_workers``, ``slurm_partition`` ...).

Every job runs through :func:`run_command`, which

- skips a job whose ``done`` file exists, or which another process is running;
- holds an exclusive ``flock`` on ``<output_dir>/.lock`` while the job runs, and hands
  the locked descriptor to the job itself, so the lock lives exactly as long as the
  job (even when the sweep that started it is killed). ``job_state`` uses the lock to
  tell a running job from a failed or interrupted one;
- appends the job's stdout and stderr to ``<output_dir>/launcher.log``.
"""
import fcntl
import os
import queue
import shlex
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field

from domainbed.errors import UnknownNameError, UserError, require
from oodutils.log import get_logger

LOG = get_logger(__name__)
LOCK_FILE = ".lock"
LOG_FILE = "launcher.log"
DONE_FILE = "done"
LOG_PREFIX = "[launcher]"

# Job states, as `status` prints them.
DONE = "done"
RUNNING = "running"
FAILED = "failed"
NOT_LAUNCHED = "not launched"


@dataclass
class Command:
    argv: list
    output_dir: str
    env: dict = field(default_factory=dict)   # extra environment variables

    def __str__(self):
        return shlex.join(str(a) for a in self.argv)


@dataclass
class Outcome:
    output_dir: str
    status: str            # "ok", "failed", "skipped_done", "skipped_running"
    returncode: int = None

    @property
    def failed(self):
        return self.status == "failed"


# ---------------------------------------------------------------- job state and locks
class UnsafeJobFile(UserError):
    """A job's .lock or launcher.log is a symlink or not a regular file (a planted link
    would make the launcher write through it into someone else's file)."""


def open_in_place(path, flags, mode=0o644):
    """os.open that never follows a symlink at `path` (O_NOFOLLOW) and never blocks on a
    FIFO; anything but a regular file is refused with UnsafeJobFile."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as e:
        reason = _unsafe_file_reason(path)
        if reason:
            raise UnsafeJobFile(reason) from None
        raise e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeJobFile(f"{path} is not a regular file; refusing to use it "
                                f"(remove it to run this job)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unsafe_file_reason(path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link; refusing to use it (remove it to run this job)"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file; refusing to use it (remove it to run this job)"
    return None


def unsafe_reason(output_dir):
    """Why the launcher refuses a job directory (its .lock or launcher.log is a symlink
    or not a regular file), or None."""
    for name in (LOCK_FILE, LOG_FILE):
        reason = _unsafe_file_reason(os.path.join(output_dir, name))
        if reason:
            return reason
    return None


def _try_lock(path):
    """An fd holding an exclusive flock on `path`, or None if someone else holds it."""
    fd = open_in_place(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_running(output_dir):
    """Whether a live process holds the job's lock."""
    path = os.path.join(output_dir, LOCK_FILE)
    if not os.path.exists(path):
        return False
    try:
        fd = open_in_place(path, os.O_RDONLY)
    except (FileNotFoundError, UnsafeJobFile):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # closing releases a lock we took
    return False


def job_state(output_dir):
    """done / running / failed (incomplete, no live lock) / not launched."""
    if os.path.exists(os.path.join(output_dir, DONE_FILE)):
        return DONE
    if not os.path.isdir(output_dir):
        return NOT_LAUNCHED
    if unsafe_reason(output_dir):
        return FAILED
    return RUNNING if is_running(output_dir) else FAILED


def _last_line(path, skip_prefix=None):
    try:
        with os.fdopen(open_in_place(path, os.O_RDONLY), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except (OSError, UnsafeJobFile):
        return None
    for line in reversed(lines):
        line = line.strip()
        if line and not (skip_prefix and line.startswith(skip_prefix)):
            return line
    return None


def last_error(output_dir):
    """The last line a failed job wrote to err.txt (else to launcher.log), or None; for
    a job directory the launcher refuses, the reason."""
    reason = unsafe_reason(output_dir)
    if reason:
        return reason
    line = _last_line(os.path.join(output_dir, "err.txt"))
    if line is None:
        line = _last_line(os.path.join(output_dir, LOG_FILE), skip_prefix=LOG_PREFIX)
    exit_line = _last_line(os.path.join(output_dir, LOG_FILE))
    if exit_line and exit_line.startswith(LOG_PREFIX) and "exit code" in exit_line:
        code = exit_line.rsplit(" ", 1)[-1]
        line = f"{line} (exit code {code})" if line else f"exit code {code}"
    return line


# ---------------------------------------------------------------- running one job
def run_command(command, extra_env=None, echo=None):
    """Run one job to completion under its lock; return an Outcome. Never raises for a
    failing job (the failure is in the Outcome and the job's log)."""
    out = command.output_dir
    if os.path.exists(os.path.join(out, DONE_FILE)):
        return Outcome(out, "skipped_done")
    os.makedirs(out, exist_ok=True)
    fd = log_fd = None
    try:
        fd = _try_lock(os.path.join(out, LOCK_FILE))
        if fd is not None:
            log_fd = open_in_place(os.path.join(out, LOG_FILE),
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except UnsafeJobFile:   # reported by job_state/last_error; nothing is written
        if fd is not None:
            os.close(fd)
        return Outcome(out, "failed")
    if fd is None:
        return Outcome(out, "skipped_running")
    try:
        if os.path.exists(os.path.join(out, DONE_FILE)):  # finished while we waited
            return Outcome(out, "skipped_done")
        env = dict(os.environ)
        env.update(command.env or {})
        env.update(extra_env or {})
        with os.fdopen(log_fd, "ab") as log:
            log_fd = None
            header = f"{LOG_PREFIX} pid {os.getpid()} running: {command}\n"
            log.write(header.encode())
            log.flush()
            if echo:
                echo(f"Running: {command}")
            try:
                proc = subprocess.Popen([str(a) for a in command.argv], stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, pass_fds=(fd,))
            except OSError as e:
                log.write(f"{e}\n{LOG_PREFIX} exit code 127\n".encode())
                return Outcome(out, "failed", 127)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{proc.pid}\n".encode(), 0)
            try:
                returncode = proc.wait()
            except BaseException:   # interrupted: stop the job too, then re-raise
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
            log.write(f"{LOG_PREFIX} exit code {returncode}\n".encode())
        ok = returncode == 0 and os.path.exists(os.path.join(out, DONE_FILE))
        return Outcome(out, "ok" if ok else "failed", returncode)
    finally:
        os.close(fd)
        if log_fd is not None:
            os.close(log_fd)


# ---------------------------------------------------------------- registry
LAUNCHERS = {}


def register_launcher(name):
    def decorator(fn):
        LAUNCHERS[name] = fn
        return fn
    return decorator


def get_launcher(name):
    if name not in LAUNCHERS:
        raise UnknownNameError("command launcher", name, LAUNCHERS)
    return LAUNCHERS[name]


def _run_pool(commands, slots, echo=print):
    """Run `commands` with one worker thread per slot; each slot is a dict of extra
    environment variables (e.g. CUDA_VISIBLE_DEVICES). Outcomes keep command order."""
    todo = queue.Queue()
    for i, c in enumerate(commands):
        todo.put((i, c))
    outcomes = [None] * len(commands)
    errors = []
    stop = threading.Event()
    from domainbed.progress import SweepProgress
    progress = SweepProgress(len(commands), len(slots), echo)
    echo = progress.echo

    def worker(slot_env):
        while not stop.is_set():
            try:
                i, c = todo.get_nowait()
            except queue.Empty:
                return
            progress.job_started()
            started = time.monotonic()
            try:
                outcomes[i] = run_command(c, extra_env=slot_env, echo=echo)
            except BaseException as e:  # a launcher bug, not a job failure
                errors.append(e)
                stop.set()
                return
            _report(outcomes[i], echo)
            progress.job_finished(outcomes[i], time.monotonic() - started)

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


def _report(outcome, echo):
    if echo is None:
        return
    if outcome.status == "failed" and outcome.returncode is None:
        echo(f"Failed: {outcome.output_dir}: {last_error(outcome.output_dir)}")
    elif outcome.status == "failed":
        echo(f"Failed (exit code {outcome.returncode}): {outcome.output_dir}: "
             f"{last_error(outcome.output_dir)}")
    elif outcome.status == "skipped_running":
        echo(f"Skipped (running elsewhere): {outcome.output_dir}")
    elif outcome.status == "ok":
        echo(f"Done: {outcome.output_dir}")


# ---------------------------------------------------------------- launchers
@register_launcher("dummy")
def dummy_launcher(commands, **_):
    """Run nothing; print each command (for checking a sweep before launching it)."""
    for c in commands:
        print(f"Dummy launcher: {c}")
    return []


@register_launcher("local")
def local_launcher(commands, max_workers=1, **_):
    """Run the jobs on this machine, `max_workers` at a time (1 = one after another)."""
    max_workers = int(max_workers or 1)
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    return _run_pool(commands, [{}] * min(max_workers, max(1, len(commands))))


def visible_gpus():
    """GPU ids from CUDA_VISIBLE_DEVICES (empty entries dropped), else all torch sees."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [g.strip() for g in value.split(",") if g.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


@register_launcher("multi_gpu")
def multi_gpu_launcher(commands, **_):
    """Run the jobs on this machine, one per visible GPU at a time; each job sees only
    its GPU through CUDA_VISIBLE_DEVICES."""
    gpus = visible_gpus()
    if not gpus:
        raise UserError("the multi_gpu launcher found no GPU (CUDA_VISIBLE_DEVICES is empty "
                        "or torch sees no CUDA device); use --command_launcher local")
    LOG.info(f"multi_gpu launcher: {len(gpus)} GPU(s): {', '.join(gpus)}")
    return _run_pool(commands, [{"CUDA_VISIBLE_DEVICES": g} for g in gpus])


def _run_command_quietly(command):
    """Entry point for remote executors (slurm, ray): run one job, return its Outcome."""
    return run_command(command)


@register_launcher("slurm")
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


@register_launcher("ray")
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
