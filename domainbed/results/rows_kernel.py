"""The numbers of a results.jsonl of the usual shape read by compiled code (`rows_kernel.c`).

What the whole-file reader (`lines.py`) otherwise does in Python for every file of the
usual shape (every line the first line's args bytes, then keys with numbers and the first
line's hparams bytes): splice each line into a JSON array, parse it, check every line's
keys and kinds against the first line's and turn the numbers into float64, about 60% of
reading a 100,000-run sweep. The C reader reads only what it knows json reads the same
way (see its header) and declines any other file whole, which the Python reader then
reads as before, so what it returns is what the Python reader returns, not a second
opinion (tests compare the two on every variant of the usual shape).

Compiled once per machine (`oodutils.c_kernel`); without a C compiler, or with
DOMAINBED_RECORDS_KERNEL=python, `load()` is None and the Python reader reads every file.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any, NamedTuple

import numpy as np

from oodutils import c_kernel

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rows_kernel.c")
FLAGS = ["-O2", "-fPIC", "-shared"]
MAX_KEYS = 512            # keys a line may hold (a record has a few dozen; KEY_LIMIT in C)
LAYOUT_BYTES = 32768      # their names and kinds
_KINDS: dict[int, type] = {1: int, 2: float, 3: str}   # (str: hparams, as the stand-in)


@functools.lru_cache(maxsize=None)
def load() -> Any:
    """The compiled reader (ctypes function), or None: no compiler, a failed build, or
    DOMAINBED_RECORDS_KERNEL=python."""
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    return compiled_function(SOURCE, "results_rows",
                             [ctypes.c_char_p, size, size, ctypes.c_char_p, size, size, size,
                              size, pointer, pointer, pointer], size, "records kernel",
                             "results files are read by the Python reader")


def compiled_function(source: str, name: str, argtypes: list[Any], restype: Any, what: str,
                      otherwise: str) -> Any:
    """The C function `name` of `source` (ctypes, with these types), compiled once per
    machine, or None: no compiler, a failed build (warned as `c_kernel.build` does), or
    DOMAINBED_RECORDS_KERNEL=python, which every compiled reader of records obeys."""
    if os.environ.get("DOMAINBED_RECORDS_KERNEL", "c") == "python":
        return None
    lib = c_kernel.build(source, FLAGS, what, otherwise)
    if lib is None:
        return None
    function = getattr(lib, name)
    function.argtypes, function.restype = argtypes, restype
    return function


class RowLayout(NamedTuple):
    """The keys of a file's lines, their kinds (int, float, str for hparams) and the keys
    whose numbers are ints."""
    keys: list[str]
    kinds: list[type]
    int_keys: tuple[str, ...]


_LAYOUTS: dict[bytes, RowLayout] = {}   # the kernel's layout text -> its RowLayout


def read_rows(read: Any, data: bytes, cut: int, hparams_text: bytes
              ) -> tuple[RowLayout, np.ndarray] | None:
    """(the RowLayout of the lines, a (lines, keys) float64 array of their numbers (0 for
    hparams)) of `data`, whose first line starts with `cut` bytes of args and holds the
    hparams object `hparams_text`; None where the compiled reader declines the file."""
    max_rows = len(data) // max(cut, 1) + 1    # (each line holds the `cut` bytes)
    buffers = _buffers(max_rows)
    rows = read(data, len(data), cut, hparams_text, len(hparams_text), max_rows, MAX_KEYS,
                LAYOUT_BYTES, *buffers.pointers)
    if rows <= 0:
        return None
    width, used = buffers.sizes
    text = ctypes.string_at(buffers.layout_address, used)
    layout = _LAYOUTS.get(text)
    if layout is None:
        layout = _row_layout(text, width)
    return layout, buffers.values[:rows * width].reshape(rows, width).copy()


def _row_layout(text: bytes, width: int) -> RowLayout:
    """The RowLayout of the kernel's layout text (each key and a '"', then a kind byte a
    key), remembered for the layouts seen so far."""
    keys = [name.decode("ascii") for name in text[:-width].split(b'"')[:-1]]
    kinds = [_KINDS[kind] for kind in text[-width:]]
    layout = RowLayout(keys, kinds, tuple(k for k, kind in zip(keys, kinds) if kind is int))
    if len(_LAYOUTS) < 1024 and len(text) <= 4096:
        _LAYOUTS[text] = layout
    return layout


class _Buffers:
    """One thread's output arrays of the reader, and their addresses as it takes them."""

    def __init__(self, rows: int):
        self.rows = rows
        self.values = np.empty(rows * MAX_KEYS, dtype=np.float64)
        self.layout = ctypes.create_string_buffer(LAYOUT_BYTES)
        self.layout_address = ctypes.addressof(self.layout)
        self.sizes = (ctypes.c_int64 * 2)()
        self.pointers = (self.sizes, self.layout, self.values.ctypes.data)


_THREAD = threading.local()


def _buffers(rows: int) -> _Buffers:
    """This thread's buffers, for at least `rows` lines (allocated once, grown as needed:
    a fresh 200 kB a file costs more than reading it)."""
    found = getattr(_THREAD, "buffers", None)
    if found is None or found.rows < rows:
        found = _THREAD.buffers = _Buffers(max(rows, 64))
    return found
