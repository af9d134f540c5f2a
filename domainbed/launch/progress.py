"""Live progress of a sweep: a tqdm bar on a terminal, status lines in a log.

On a terminal: jobs done / failed / running / total, elapsed and an ETA from the
finished jobs' durations. Elsewhere (a log file, CI): one status line per finished job
and every `interval` seconds while jobs run.
"""
import os
import sys
import threading
import time
from typing import Any

from tqdm import tqdm

# The bar's width and the screen's height where the terminal does not say its own (a
# pseudo-terminal opened without a window size, as `script` or a CI runner's may be: 0 x 0,
# where tqdm would draw nothing).
FALLBACK_COLUMNS, FALLBACK_ROWS = 80, 24


def terminal_columns(stream: Any) -> Any:
    """The width of the terminal `stream` writes to, 0 when it does not say."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def format_duration(seconds: float) -> Any:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class SweepProgress:
    """Counts of a pool of jobs run `slots` at a time; thread-safe."""

    def __init__(self, total: Any, slots: int = 1, echo: Any = print, interval: float = 60.0,
                 stream: Any = None, clock: Any = None) -> None:
        self.total, self.slots, self.interval = total, max(1, slots), interval
        self.clock = clock or time.monotonic
        self.start_time = self.last_line = self.clock()
        self.done = self.failed = self.running = 0
        self.durations: list[Any] = []
        self.lock = threading.Lock()
        stream = stream if stream is not None else sys.stderr
        self.bar: Any = None
        if echo is not None and hasattr(stream, "isatty") and stream.isatty():
            sized = terminal_columns(stream) > 0   # else tqdm would draw 0 columns: nothing
            self.bar = tqdm(total=total, file=stream, unit="job", dynamic_ncols=sized,
                            ncols=None if sized else FALLBACK_COLUMNS,
                            nrows=None if sized else FALLBACK_ROWS, desc="sweep")
            self.echo = lambda message: self.bar.write(message, file=stream)
        else:
            self.echo = echo

    def eta(self) -> Any:
        """Seconds left: mean finished-job duration x jobs left / parallel slots."""
        left = self.total - self.done - self.failed
        if not self.durations or left <= 0:
            return None if left > 0 else 0.0
        mean = sum(self.durations) / len(self.durations)
        return mean * left / self.slots

    def status_line(self) -> str:
        waiting = self.total - self.done - self.failed - self.running
        eta = self.eta()
        return (f"[sweep] {self.done}/{self.total} done, {self.failed} failed, "
                f"{self.running} running, {waiting} waiting; elapsed "
                f"{format_duration(self.clock() - self.start_time)}, ETA "
                f"{'unknown' if eta is None else format_duration(eta)}")

    def job_started(self) -> None:
        with self.lock:
            self.running += 1
            self._refresh()

    def job_finished(self, outcome: Any, seconds: float, next_started: bool = False) -> None:
        """`outcome.status`: ok / failed / skipped_done / skipped_running. `next_started`:
        the freed slot has already taken the next job (counted as running, not started
        again), so the line printed now counts the jobs really running."""
        with self.lock:
            if not next_started:
                self.running -= 1
            if outcome.status == "failed":
                self.failed += 1
            else:
                self.done += 1
            if outcome.status in ("ok", "failed"):
                self.durations.append(seconds)
            if self.bar is not None:
                self.bar.update(1)
            self._refresh(force_line=True)

    def tick(self) -> None:
        """Called periodically: a status line when `interval` seconds have passed."""
        with self.lock:
            self._refresh()

    def _refresh(self, force_line: bool = False) -> None:
        if self.bar is not None:
            eta = self.eta()
            self.bar.set_postfix_str(
                f"failed {self.failed}, running {self.running}, ETA "
                f"{'?' if eta is None else format_duration(eta)}")
            return
        if self.echo is None:
            return
        now = self.clock()
        if force_line or now - self.last_line >= self.interval:
            self.last_line = now
            self.echo(self.status_line())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
