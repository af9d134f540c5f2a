"""Freed memory kept by the process for its next allocations (glibc's ``mallopt``), for
processes that free and allocate the same hundreds of MB over and over: a worker reading
batch after batch of results files, or collect_results building then reporting its
tables. glibc otherwise hands large freed blocks back to the kernel at once (``munmap``,
a trimmed heap) and the next allocation faults them in again, page by page; on virtual
machines whose freed pages go back to the host, each of those faults is a host fault
too (measured on the 2-core VM: 92,000 faults a 100,000-run read in the workers; 11,000
with this). No library offers it; a no-op where the C library has no ``mallopt``."""
from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20    # glibc's ceiling: larger blocks are still mapped apart
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to MMAP_THRESHOLD bytes, and up to TRIM_THRESHOLD free
    bytes at the heap's top, for reuse (until the process exits); whether the C library
    took the settings."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):    # not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def small_array_pages() -> bool:
    """Stop numpy advising transparent huge pages for its large arrays (what
    NUMPY_MADVISE_HUGEPAGE=0 does at import; numpy has no public call for it), for
    processes whose big arrays are written once and read a few times: a huge page is
    zeroed, and on a kernel that compacts memory for advised regions (THP defrag
    "madvise", the default) often compacted, at its first touch, which costs more than
    the TLB misses it saves (measured on the 2-core VM: a warm collect of 100,000 runs
    2.7-2.8 s -> 2.1-2.5 s, system time 1.8 -> 1.2 s). Whether numpy took it."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]
    except ImportError:
        try:     # numpy < 2
            from numpy.core.multiarray import _set_madvise_hugepage  # type: ignore
        except ImportError:   # pragma: no cover - a numpy without it
            return False
    _set_madvise_hugepage(False)
    return True


def tune_for_tables() -> None:
    """Both settings: what collect_results and its reading workers ask for."""
    keep_freed_memory()
    small_array_pages()
