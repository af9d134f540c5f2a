"""Records held column-wise: what lets a sweep of a million checkpoints be read, selected
and tabulated without a Python dict per checkpoint.

A *block* is a run of consecutive records of one run directory that share their ``args``
and ``hparams`` objects and their keys, in the same order and of the same kinds. Blocks of
the same key layout keep their numbers in one float64 matrix (one row per record, one
column per key); a `ColumnTable` lists the blocks in reading order, so that row order is
record order. The record dicts themselves are built only when asked for
(`ColumnTable.records`), exactly as they were read.

Kinds of a key (a layout's ``types``): ``a`` the args object, ``h`` the hparams object,
``f`` a float, ``i`` an int that a float64 holds exactly; ``o`` anything else (None, a
bool, a string, a list, a big int). A block with an ``o`` key keeps its record dicts; its
matrix holds NaN there (selection reads a missing, non-finite or non-numeric value alike:
no value).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

Record = dict[str, Any]
Layout = tuple[tuple[str, ...], str]     # (keys, types)
_EXACT_INT = 2 ** 53


class Block:
    """Records `start` .. `start + rows` (global row numbers) of `run_dir`, in layout
    `layout`; `records`: their dicts when the layout cannot rebuild them (an ``o`` key)."""
    __slots__ = ("run_dir", "args", "hparams", "layout", "start", "offset", "rows",
                 "records")

    def __init__(self, run_dir: str | None, args: Any, hparams: Any, layout: int, start: int,
                 offset: int, rows: int, records: list[Record] | None) -> None:
        self.run_dir, self.args, self.hparams = run_dir, args, hparams
        self.layout, self.start, self.offset, self.rows = layout, start, offset, rows
        self.records = records


def kind_of(key: str, value: Any) -> str:
    """The kind (module docstring) of `value` under `key`."""
    if key == "args" and type(value) is dict:
        return "a"
    if key == "hparams" and type(value) is dict:
        return "h"
    if type(value) is float:
        return "f"
    if type(value) is int and -_EXACT_INT <= value <= _EXACT_INT:
        return "i"
    return "o"


def _number(value: Any) -> float:
    """A value as selection reads it: a finite or infinite float, NaN for no number."""
    if type(value) is float:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return float("nan")
    return float("nan")


def split_blocks(records: Sequence[Record], keep_records: bool
                 ) -> Iterable[tuple[Layout, list[Record], bool]]:
    """(layout, records, lossless) of each run of consecutive `records` that share args,
    hparams, run_dir and layout. lossless: the layout rebuilds them (no ``o`` key and no
    run_dir key); `keep_records` keeps the dicts anyway."""
    current: list[Record] = []
    signature: tuple[Any, ...] | None = None
    layout: Layout = ((), "")
    for record in records:
        kinds = tuple(map(type, record.values()))
        sig = (id(record.get("args")), id(record.get("hparams")), record.get("run_dir"),
               tuple(record), kinds)
        if sig != signature or (int in kinds and _has_big_int(record)):
            types = "".join(kind_of(k, v) for k, v in record.items())
            if sig != signature or types != layout[1]:
                if current:
                    yield layout, current, _lossless(layout, keep_records)
                current, signature, layout = [], sig, (sig[3], types)
        current.append(record)
    if current:
        yield layout, current, _lossless(layout, keep_records)


def _has_big_int(record: Record) -> bool:
    return any(type(v) is int and not -_EXACT_INT <= v <= _EXACT_INT
               for v in record.values())


class Part(NamedTuple):
    """The records of one block of one file, before it has a place in a table."""
    layout: Layout
    args: Any
    hparams: Any
    values: np.ndarray
    records: list[Record] | None     # None: the layout rebuilds them from `values`

    def to_records(self) -> list[Record]:
        """The record dicts (without run_dir)."""
        if self.records is not None:
            return self.records
        return rebuild_records(self.layout, self.args, self.hparams, self.values)


def file_parts(records: Sequence[Record]) -> list[Part]:
    """The parts of one file's records (dicts without run_dir)."""
    return [Part(layout, part[0].get("args"), part[0].get("hparams"),
                 numeric_block(layout, part), None if lossless else part)
            for layout, part, lossless in split_blocks(records, keep_records=False)]


def _lossless(layout: Layout, keep_records: bool) -> bool:
    keys, types = layout
    return not keep_records and "o" not in types and types.count("a") == 1 and \
        "run_dir" not in keys


def numeric_block(layout: Layout, records: Sequence[Record]) -> np.ndarray:
    """The rows x keys float64 matrix of `records` (args / hparams columns NaN)."""
    keys, types = layout
    numeric = [k if t in "fi" else None for k, t in zip(keys, types)]
    if "o" not in types:
        return np.array([[r[k] if k is not None else np.nan for k in numeric]
                         for r in records], dtype=np.float64).reshape(len(records), len(keys))
    return np.array([[_number(r[k]) if k is not None else np.nan for k in keys]
                     for r in records], dtype=np.float64).reshape(len(records), len(keys))


def rebuild_records(layout: Layout, args: Any, hparams: Any, values: np.ndarray
                    ) -> list[Record]:
    """The record dicts of a lossless block: its matrix rows with ints made ints again and
    the shared args / hparams objects in their places, keys in their order."""
    keys, types = layout
    ints = [j for j, t in enumerate(types) if t == "i"]
    inserts = [(j, args if t == "a" else hparams) for j, t in enumerate(types) if t in "ah"]
    records = []
    for row in values.tolist():
        for j in ints:
            row[j] = int(row[j])
        for j, value in inserts:
            row[j] = value
        records.append(dict(zip(keys, row)))
    return records


class ColumnStore:
    """The matrices of every layout, and which global rows each holds."""

    def __init__(self) -> None:
        self.layouts: list[Layout] = []
        self._layout_ids: dict[Layout, int] = {}
        self._parts: list[list[np.ndarray]] = []
        self._starts: list[list[np.ndarray]] = []
        self._sizes: list[int] = []
        self.matrices: list[np.ndarray] = []
        self.rows_of: list[np.ndarray] = []    # layout -> the global row of each matrix row
        self.n_rows = 0
        self._columns: dict[str, np.ndarray] = {}

    def layout_id(self, layout: Layout) -> int:
        found = self._layout_ids.get(layout)
        if found is None:
            found = self._layout_ids[layout] = len(self.layouts)
            self.layouts.append(layout)
            self._parts.append([])
            self._starts.append([])
            self._sizes.append(0)
        return found

    def add(self, layout: int, values: np.ndarray) -> tuple[int, int]:
        """Append `values` (rows x keys of `layout`); returns (their first global row, their
        first row in the layout's matrix)."""
        start, offset = self.n_rows, self._sizes[layout]
        self._parts[layout].append(values)
        self._starts[layout].append(np.arange(start, start + len(values)))
        self._sizes[layout] += len(values)
        self.n_rows += len(values)
        return start, offset

    def finish(self) -> ColumnStore:
        for parts, starts, (keys, _) in zip(self._parts, self._starts, self.layouts):
            self.matrices.append(np.concatenate(parts) if parts
                                 else np.zeros((0, len(keys))))
            self.rows_of.append(np.concatenate(starts) if starts
                                else np.zeros(0, dtype=np.int64))
        self._parts = self._starts = []
        return self

    def column(self, key: str) -> np.ndarray:
        """The value of `key` in every global row: NaN where a row has no number there."""
        found = self._columns.get(key)
        if found is None:
            found = np.full(self.n_rows, np.nan)
            for (keys, _), matrix, rows in zip(self.layouts, self.matrices, self.rows_of):
                if key in keys:
                    found[rows] = matrix[:, keys.index(key)]
            if len(self._columns) < 256:
                self._columns[key] = found
        return found

    def has_key(self, layout: int, key: str) -> bool:
        return key in self.layouts[layout][0]


class ColumnTable:
    """Records as blocks over a ColumnStore, in reading order (see the module docstring)."""

    def __init__(self, store: ColumnStore, blocks: list[Block]) -> None:
        self.store, self.blocks = store, blocks
        self.cache: dict[Any, Any] = {}    # what selection works out once per table
        self._records: list[Record] | None = None

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> ColumnTable:
        """The table of record dicts (kept: `records` gives back these very objects)."""
        builder = TableBuilder()
        builder.add_records(None, list(records), keep_records=True)
        return builder.finish()

    def __len__(self) -> int:
        return sum(b.rows for b in self.blocks)

    def subset(self, blocks: list[Block]) -> ColumnTable:
        return ColumnTable(self.store, blocks)

    def keys(self, block: Block) -> tuple[str, ...]:
        return self.store.layouts[block.layout][0]

    def block_records(self, block: Block, rows: int | None = None) -> list[Record]:
        """The record dicts of `block` (built from its matrix when it has none); `rows`:
        only the first so many."""
        rows = block.rows if rows is None else rows
        if block.records is not None:
            return block.records[:rows]
        values = self.store.matrices[block.layout][block.offset:block.offset + rows]
        records = rebuild_records(self.store.layouts[block.layout], block.args,
                                  block.hparams, values)
        if block.run_dir is not None:
            for record in records:
                record["run_dir"] = block.run_dir
        return records

    def first_record(self, block: Block) -> Record:
        """The first record of `block` (its keys and args stand for the whole block)."""
        return self.block_records(block, 1)[0]

    @property
    def records(self) -> list[Record]:
        """Every record dict, in reading order (built once, on first use)."""
        if self._records is None:
            self._records = [r for b in self.blocks for r in self.block_records(b)]
        return self._records

    def block_of_rows(self) -> np.ndarray:
        """For each global row, the index of its block in `blocks` (-1: not in this
        table)."""
        found = self.cache.get("block_of_rows")
        if found is None:
            found = np.full(self.store.n_rows, -1, dtype=np.int64)
            starts = np.fromiter((b.start for b in self.blocks), np.int64, len(self.blocks))
            sizes = np.fromiter((b.rows for b in self.blocks), np.int64, len(self.blocks))
            found[concat_ranges(starts, sizes)] = np.repeat(np.arange(len(self.blocks)), sizes)
            self.cache["block_of_rows"] = found
        return found


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenation of range(start, start + size) for each pair."""
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
    return np.arange(total, dtype=np.int64) + offsets


class TableBuilder:
    """Gathers blocks in reading order, then `finish` gives the ColumnTable."""

    def __init__(self) -> None:
        self.store = ColumnStore()
        self.blocks: list[Block] = []

    def add_block(self, run_dir: str | None, layout: Layout, args: Any, hparams: Any,
                  values: np.ndarray, records: list[Record] | None) -> None:
        layout_id = self.store.layout_id(layout)
        start, offset = self.store.add(layout_id, values)
        self.blocks.append(Block(run_dir, args, hparams, layout_id, start, offset,
                                 len(values), records))

    def add_records(self, run_dir: str | None, records: list[Record], keep_records: bool
                    ) -> None:
        """Add the blocks of `records` (all of `run_dir` when given)."""
        for layout, part, lossless in split_blocks(records, keep_records):
            first = part[0]
            self.add_block(run_dir if run_dir is not None else first.get("run_dir"),
                           layout, first.get("args"), first.get("hparams"),
                           numeric_block(layout, part), None if lossless else part)

    def add_part(self, run_dir: str, part: Part) -> None:
        """Add one file's part; dicts it keeps get their run_dir."""
        if part.records is not None:
            for record in part.records:
                record["run_dir"] = run_dir
        self.add_block(run_dir, part.layout, part.args, part.hparams, part.values,
                       part.records)

    def finish(self) -> ColumnTable:
        return ColumnTable(self.store.finish(), self.blocks)
