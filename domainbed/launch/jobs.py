"""One job of a sweep, whatever launches it: its command, lock, log and outcome.

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
import shlex
import stat
import subprocess
from dataclasses import dataclass, field

from oodutils.errors import UserError
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


