"""One job of a sweep, whatever launches it: its command, lock, log and outcome.

Every job runs through :func:`run_command`, which

- skips a job whose ``done`` file exists, or which another process is running;
- refuses a job folder, `.lock` or `launcher.log` that is a symlink (or not a folder or
  regular file): a planted link would redirect the job's writes; the job fails with the
  reason (``last_error``), the others go on;
- holds an exclusive ``flock`` on ``<output_dir>/.lock`` while the job runs, and hands
  the locked descriptor to the job itself, so the lock lives exactly as long as the
  job (even when the sweep that started it is killed). ``job_state`` uses the lock to
  tell a running job from a failed or interrupted one;
- appends the job's stdout and stderr to ``<output_dir>/launcher.log``.
"""
import errno
import fcntl
import os
import shlex
import signal
import stat
import subprocess
from dataclasses import dataclass, field
from typing import Any

from oodutils.log import get_logger
from oodutils.pinned_dir import PinnedDir, UnsafePath, unsafe_entry_reason

LOG = get_logger(__name__)
LOCK_FILE = ".lock"
LOG_FILE = "launcher.log"
DONE_FILE = "done"
LOG_PREFIX = "[launcher]"

# Job states, as `status` prints them.
DONE = "done"
RUNNING = "running"
FAILED = "failed"
INTERRUPTED = "interrupted"
NOT_LAUNCHED = "not launched"
# States a relaunch resumes.
INCOMPLETE = (FAILED, INTERRUPTED)


@dataclass
class Command:
    argv: list
    output_dir: str
    env: dict = field(default_factory=dict)   # extra environment variables
    label: str = ""   # what the job is, for people: "ERM on ColoredMNIST, test envs [0]"

    def __str__(self) -> str:
        return shlex.join(str(a) for a in self.argv)

    def describe(self) -> Any:
        """The job for a status line: its label and directory (a directory alone names
        nothing a person recognises)."""
        return f"{self.label} ({self.output_dir})" if self.label else self.output_dir


@dataclass
class Outcome:
    output_dir: str
    status: str            # "ok", "failed", "skipped_done", "skipped_running"
    returncode: int | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


# ---------------------------------------------------------------- job state and locks
REMOVE_HINT = " (remove it to run this job)"


def open_in_place(path: str, flags: Any, mode: int = 0o666) -> Any:
    """os.open of a job's file that follows no symlink, neither at the file nor at its job
    folder, never blocks on a FIFO, and refuses anything but a regular file
    (UnsafePath). `mode` is narrowed by the umask, as for every other output."""
    with PinnedDir.open(os.path.dirname(path) or ".") as folder:
        return folder.open_file(os.path.basename(path), flags, mode)


def unsafe_reason(output_dir: str) -> Any:
    """Why the launcher refuses a job folder (it, its .lock or its launcher.log is a
    symlink or not what it should be), or None."""
    entries = [(output_dir, True)] + [(os.path.join(output_dir, name), False)
                                      for name in (LOCK_FILE, LOG_FILE)]
    for path, want_dir in entries:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        reason = unsafe_entry_reason(path, st, want_dir, writing=True)
        if reason:
            return reason + REMOVE_HINT
    return None


def _try_lock(path: str) -> Any:
    """An fd holding an exclusive flock on `path`, or None if someone else holds it."""
    fd = open_in_place(path, os.O_RDWR | os.O_CREAT)
    return _locked_or_none(fd)


def _locked_or_none(fd: Any) -> Any:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_running(output_dir: str) -> bool:
    """Whether a live process holds the job's lock."""
    path = os.path.join(output_dir, LOCK_FILE)
    if not os.path.exists(path):
        return False
    try:
        fd = open_in_place(path, os.O_RDONLY)
    except (FileNotFoundError, UnsafePath):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # closing releases a lock we took
    return False


DONE_HINT = ("relaunch the sweep (the job's run removes it and resumes from its last "
             "checkpoint), or remove the job with `sweep delete_incomplete` (a single run: "
             "train it again with --restart)")


def done_problem(output_dir: str) -> str | None:
    """Why the job's `done` is not the marker a finished run writes (a symlink, dangling
    or not, a FIFO, a folder: nothing a run makes), with the way out; None when it is a
    regular file or absent."""
    path = os.path.join(output_dir, DONE_FILE)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else \
        "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    return f"{path} is {kind}, not the marker a finished run writes; {DONE_HINT}"


def is_done(output_dir: str) -> Any:
    """Whether the job finished: its `done` is a regular file (a symlink there, even to
    a file, is someone else's and marks nothing)."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(output_dir, DONE_FILE)).st_mode)
    except OSError:
        return False


def job_state(output_dir: str) -> Any:
    """done / running / interrupted / failed (incomplete, no live lock, or refused) /
    not launched."""
    if not os.path.lexists(output_dir):
        return NOT_LAUNCHED
    if unsafe_reason(output_dir):
        return FAILED
    if is_done(output_dir):
        return DONE
    if is_running(output_dir):
        return RUNNING
    return INTERRUPTED if was_interrupted(output_dir) else FAILED


# Exit codes of a job a person stopped: Ctrl-C (run_cli's 130), SIGINT, SIGTERM, SIGHUP.
# SIGKILL is not among them: the out-of-memory killer sends it, and that is a failure.
_INTERRUPT_EXIT_CODES = {130, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP}


def was_interrupted(output_dir: str) -> bool:
    """Whether the job's last attempt was stopped rather than failed: no err.txt, and its
    launcher.log ends that attempt without an exit line (the launcher itself was stopped)
    or with the exit code of Ctrl-C, SIGINT, SIGTERM or SIGHUP."""
    if os.path.exists(os.path.join(output_dir, "err.txt")):
        return False
    last = _last_line(os.path.join(output_dir, LOG_FILE), keep_prefix=LOG_PREFIX)
    if last is None:
        return False
    if "exit code" not in last:
        return True   # the attempt's "running" header is the last launcher line
    try:
        code = int(last.rsplit(" ", 1)[-1])
    except ValueError:
        return False
    return code in _INTERRUPT_EXIT_CODES


def _last_line(path: str, skip_prefix: Any = None, keep_prefix: Any = None) -> Any:
    try:
        with os.fdopen(open_in_place(path, os.O_RDONLY), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except (OSError, UnsafePath):
        return None
    for line in reversed(lines):
        line = line.strip()
        if not line or (skip_prefix and line.startswith(skip_prefix)):
            continue
        if keep_prefix is None or line.startswith(keep_prefix):
            return line
    return None


def last_error(output_dir: str) -> Any:
    """The last line a failed job wrote to err.txt (else to launcher.log), or None; for
    a job directory the launcher refuses, the reason."""
    reason = unsafe_reason(output_dir) or done_problem(output_dir)
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
class JobClaim:
    """The right to run one job: its lock held (the pid written in it) and its
    launcher.log open for appending, both reached through the pinned job folder; else
    `outcome` says why not (done, running elsewhere, or refused as unsafe: failed)."""

    def __init__(self, output_dir: str) -> None:
        self.out = output_dir
        self.lock_fd: Any
        self.log: Any
        self.lock_fd = self.log = None
        self.outcome = self._claim()

    def _claim(self) -> Any:
        out = self.out
        if is_done(out) and not unsafe_reason(out):
            return Outcome(out, "skipped_done")
        try:
            with PinnedDir.open(out, create=True) as folder:
                self.lock_fd = _locked_or_none(folder.open_file(
                    LOCK_FILE, os.O_RDWR | os.O_CREAT))
                if self.lock_fd is None:
                    return Outcome(out, "skipped_running")
                self.log = os.fdopen(folder.open_file(
                    LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
                if is_done(out):   # finished while we waited
                    self.release()
                    return Outcome(out, "skipped_done")
        except UnsafePath:   # reported by job_state/last_error; nothing is written
            self.release()
            return Outcome(out, "failed")
        self.mark_pid(os.getpid())
        return None

    def mark_pid(self, pid: Any) -> None:
        os.ftruncate(self.lock_fd, 0)
        os.pwrite(self.lock_fd, f"{pid}\n".encode(), 0)

    def write_log(self, line: str) -> None:
        """Append a line; on a full disk the line is lost, not the sweep (the run's own
        writes fail with one line naming the file)."""
        try:
            self.log.write(f"{line}\n".encode("utf-8", "backslashreplace"))
            self.log.flush()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise

    def release(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)
        self.log = self.lock_fd = None


def run_command(command: Any, extra_env: Any = None, echo: Any = None) -> Any:
    """Run one job to completion under its lock; return an Outcome. Never raises for a
    failing job (the failure is in the Outcome and the job's log)."""
    claim = JobClaim(command.output_dir)
    if claim.outcome is not None:
        return claim.outcome
    out = command.output_dir
    try:
        env = dict(os.environ)
        env.update(command.env or {})
        env.update(extra_env or {})
        claim.write_log(f"{LOG_PREFIX} pid {os.getpid()} running: {command}")
        if echo:
            echo(f"Running: {command}")
        try:
            proc = subprocess.Popen([str(a) for a in command.argv], stdout=claim.log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, pass_fds=(claim.lock_fd,))
        except OSError as e:
            claim.write_log(f"{e}\n{LOG_PREFIX} exit code 127")
            return Outcome(out, "failed", 127)
        claim.mark_pid(proc.pid)
        try:
            returncode: Any = proc.wait()
        except BaseException:   # interrupted: stop the job too, then re-raise
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        claim.write_log(f"{LOG_PREFIX} exit code {returncode}")
        ok = returncode == 0 and is_done(out)
        return Outcome(out, "ok" if ok else "failed", returncode)
    finally:
        claim.release()
