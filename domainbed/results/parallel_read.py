"""Reading many run directories on every core: the files of a cold sweep (100,000 runs)
parsed by worker processes, chunk by chunk, in order. Only worth its start-up where
thousands of files are to be read and the machine has more than one core.

The stats of a warm re-collect (one per directory and one per results.jsonl) are taken
on every core too (``lstat_rows``): by compiled code (``stat_rows.c``) in one thread a
core, or without a C compiler, half in a forked child.

A worker reads a chunk with the function it is given (a module-level one, found by name
in the worker) and sends back what it returns (``chunk_read.Chunk``: arrays, no object per
run); what crosses between the processes is never stored. Each worker keeps the memory
it frees for its next chunk (``oodutils.heap``).
"""
from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

from domainbed.results.rows_kernel import compiled_function
from oodutils.heap import tune_for_tables

MIN_FILES = 4000      # fewer: one process reads them sooner than workers start
CHUNK = 2000          # the most run directories in one chunk ...
MIN_CHUNK = 250       # ... and the fewest: chunks shrink toward the end (`_bounds`)

ChunkReader = Callable[[Any, Sequence[str], Any], Any]


def workers() -> int:
    """How many worker processes pay: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(cores, 8)


def _read_chunk(job: tuple[ChunkReader, Any, Sequence[str], Any]) -> Any:
    chunk_reader, reader, run_dirs, fields = job
    return chunk_reader(reader, run_dirs, fields)


def read_chunks(chunk_reader: ChunkReader, reader: Any, run_dirs: Sequence[str],
                fields: Any) -> Iterator[tuple[int, Any]]:
    """(first run's index, chunk_reader(reader, chunk, fields)) for each chunk of
    `run_dirs`, in order: in worker processes when there are many, else here."""
    count = workers()
    bounds = _bounds(len(run_dirs), count)
    jobs = [(chunk_reader, reader, run_dirs[start:stop], fields) for start, stop in bounds]
    starts = [start for start, _ in bounds]
    if count < 2 or len(run_dirs) < MIN_FILES or "fork" not in \
            multiprocessing.get_all_start_methods():
        for start, job in zip(starts, jobs):
            yield start, _read_chunk(job)
        return
    with multiprocessing.get_context("fork").Pool(count, tune_for_tables) as pool:
        _widen_result_pipe(pool)
        yield from zip(starts, pool.imap(_read_chunk, jobs))


RESULT_PIPE_BYTES = 1 << 20     # Linux's default ceiling for a user (pipe-max-size)


def _widen_result_pipe(pool: Any) -> None:
    """Give the pipe the workers send their chunks through (4 MB a chunk of 2,000 runs)
    a 1 MiB buffer instead of 64 KiB: fewer wake-ups of each side (measured on the 2-core
    VM: 227 -> 355 MB/s between two processes). The pipe is reached through the pool's
    private `_outqueue` (multiprocessing has no public handle on it): where a Python keeps
    it elsewhere, or the system refuses, the pipe stays as it is."""
    try:
        import fcntl
        fcntl.fcntl(pool._outqueue._reader.fileno(), fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
    except (ImportError, AttributeError, OSError, ValueError):
        pass


def _bounds(total: int, count: int) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of `total` run directories for `count` workers:
    guided, each a 1 / (2 count) share of what is left, between MIN_CHUNK and CHUNK
    (few chunks, so little is paid per chunk, and small ones last, so the workers end
    together)."""
    bounds: list[tuple[int, int]] = []
    smallest, start = min(MIN_CHUNK, CHUNK), 0
    while start < total:
        size = max(smallest, min(CHUNK, (total - start) // (2 * count)))
        bounds.append((start, min(start + size, total)))
        start += size
    return bounds


STAT_FIELDS = ("st_mode", "st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")
MIN_STATS = 20000     # fewer: a forked helper costs more than the stats it takes over
_MISSING = (-1,) * len(STAT_FIELDS)


def stat_columns(*fields: str) -> list[int]:
    """Where these STAT_FIELDS are in `lstat_rows`' rows."""
    return [STAT_FIELDS.index(field) for field in fields]


def lstat_rows(paths: Sequence[str]) -> np.ndarray:
    """Each path's lstat as a row of STAT_FIELDS (-1s where it fails), int64, taken on
    every core where there are many: by the compiled stat kernel in threads, else half
    in a forked child (a stat is a system call: the parts run at once; what the child
    sends back is checked for its size, and a failed child's half is statted here)."""
    kernel = _stat_kernel()
    if kernel is not None:
        return _kernel_rows(kernel, paths)
    if len(paths) < MIN_STATS or workers() < 2 or not hasattr(os, "fork"):
        return _stat_rows(paths)
    half = len(paths) // 2
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:     # pragma: no cover - the child (coverage does not follow it)
        status = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "wb") as out:
                out.write(_stat_rows(paths[half:]).tobytes())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        first = _stat_rows(paths[:half])
        with os.fdopen(read_end, "rb") as sent:
            data = sent.read()
    finally:
        os.waitpid(pid, 0)
    width = len(STAT_FIELDS) * 8
    if len(data) != (len(paths) - half) * width:
        return np.concatenate([first, _stat_rows(paths[half:])])
    return np.concatenate([first, np.frombuffer(data, dtype=np.int64).reshape(
        -1, len(STAT_FIELDS))])


STAT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stat_rows.c")
MIN_THREADED_STATS = 4000     # fewer: one thread takes them sooner than threads start


@functools.lru_cache(maxsize=None)
def _stat_kernel() -> Any:
    """The compiled `lstat_rows` (ctypes function, which lets go of the GIL while it
    runs), or None: no compiler, a failed build, or DOMAINBED_RECORDS_KERNEL=python."""
    return compiled_function(STAT_SOURCE, "lstat_rows",
                             [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_void_p], ctypes.c_int64, "stat kernel",
                             "files are statted by Python")


def _kernel_rows(kernel: Any, paths: Sequence[str]) -> np.ndarray:
    """`lstat_rows` by the compiled kernel: a part of the paths in each of up to
    `workers()` threads (a part whose bytes do not split into its paths, which a NUL in
    a path would cause, is statted by Python)."""
    rows = np.empty((len(paths), len(STAT_FIELDS)), dtype=np.int64)
    parts = workers() if len(paths) >= MIN_THREADED_STATS else 1
    bounds = [len(paths) * k // parts for k in range(parts + 1)]
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    blobs = [("\0".join(paths[start:stop]) + "\0").encode(encoding, errors)
             for start, stop in zip(bounds, bounds[1:])]
    done = [0] * parts

    def stat_part(k: int) -> None:
        start, stop = bounds[k], bounds[k + 1]
        if blobs[k].count(b"\0") == stop - start:
            done[k] = kernel(blobs[k], len(blobs[k]), stop - start,
                             rows[start:stop].ctypes.data)

    threads = [threading.Thread(target=stat_part, args=(k,), name=f"lstat-{k}")
               for k in range(1, parts)]
    for thread in threads:
        thread.start()
    stat_part(0)
    for thread in threads:
        thread.join()
    for k in range(parts):
        start, stop = bounds[k], bounds[k + 1]
        if done[k] != stop - start:
            rows[start:stop] = _stat_rows(paths[start:stop])
    return rows


def _stat_rows(paths: Sequence[str]) -> np.ndarray:
    lstat = os.lstat
    try:
        found: list[os.stat_result | None] = [lstat(path) for path in paths]
    except OSError:
        found = [_lstat(path) for path in paths]
    return np.fromiter(chain.from_iterable(   # (flat: no nested sequences to discover)
        (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        if st is not None else _MISSING for st in found), dtype=np.int64,
        count=len(found) * len(STAT_FIELDS)).reshape(-1, len(STAT_FIELDS))


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None
