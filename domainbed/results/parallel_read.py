"""Reading many run directories on every core: the files of a cold sweep (100,000 runs)
parsed by worker processes, chunk by chunk, in order. Only worth its start-up where
thousands of files are to be read and the machine has more than one core.

A worker reads with the function it is given (a module-level one, found by name in the
worker) and sends back, per run, (parts, notes) or the OSError's text; what crosses
between the processes is never stored.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

MIN_FILES = 4000      # fewer: one process reads them sooner than workers start
CHUNK = 500

Reader = Callable[[str, list[str], Any], tuple[Any, int]]
Result = tuple[Any, list[str], str | None]     # (parts, notes, error)


def workers() -> int:
    """How many worker processes pay: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(cores, 8)


def _read_each(reader: Reader, run_dirs: Sequence[str], fields: Any) -> Iterator[Result]:
    for run_dir in run_dirs:
        notes: list[str] = []
        try:
            parts, _ = reader(run_dir, notes, fields)
        except OSError as e:
            yield None, [], e.strerror or str(e)
            continue
        yield parts, notes, None


def _read_chunk(job: tuple[Reader, Sequence[str], Any]) -> list[Result]:
    return list(_read_each(*job))


def read_all(reader: Reader, run_dirs: Sequence[str], fields: Any) -> Iterator[Result]:
    """reader(run_dir, notes, fields)'s (parts, notes, error) for each run dir, in order:
    in worker processes when there are many, else here."""
    count = workers()
    if count < 2 or len(run_dirs) < MIN_FILES or "fork" not in \
            multiprocessing.get_all_start_methods():
        yield from _read_each(reader, run_dirs, fields)
        return
    jobs = [(reader, run_dirs[i:i + CHUNK], fields) for i in range(0, len(run_dirs), CHUNK)]
    with multiprocessing.get_context("fork").Pool(count) as pool:
        for result in pool.imap(_read_chunk, jobs):
            yield from result
