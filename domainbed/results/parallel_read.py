"""Reading many run directories on every core: the files of a cold sweep (100,000 runs)
parsed by worker processes, chunk by chunk, in order. Only worth its start-up where
thousands of files are to be read and the machine has more than one core.

A worker reads a chunk with the function it is given (a module-level one, found by name
in the worker) and sends back what it returns (``chunk_read.Chunk``: arrays, no object per
run); what crosses between the processes is never stored.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

MIN_FILES = 4000      # fewer: one process reads them sooner than workers start
CHUNK = 500

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
    jobs = [(chunk_reader, reader, run_dirs[i:i + CHUNK], fields)
            for i in range(0, len(run_dirs), CHUNK)]
    count = workers()
    if count < 2 or len(run_dirs) < MIN_FILES or "fork" not in \
            multiprocessing.get_all_start_methods():
        for i, job in enumerate(jobs):
            yield i * CHUNK, _read_chunk(job)
        return
    with multiprocessing.get_context("fork").Pool(count) as pool:
        for i, result in enumerate(pool.imap(_read_chunk, jobs)):
            yield i * CHUNK, result
