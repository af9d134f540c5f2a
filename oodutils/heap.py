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
