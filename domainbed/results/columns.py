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

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from domainbed.results.block_values import Values, ValuesBuilder, take
from domainbed.results.run_keys import KeysBuilder, RunKeys
from oodutils.errors import UserError

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

    def __init__(self, layouts: list[Layout], matrices: list[np.ndarray],
                 rows_of: list[np.ndarray], n_rows: int) -> None:
        self.layouts, self.matrices, self.rows_of = layouts, matrices, rows_of
        self.n_rows = n_rows
        self._columns: dict[str, np.ndarray] = {}
        self._only: int | None = None

    def column(self, key: str) -> np.ndarray:
        """The value of `key` in every global row: NaN where a row has no number there."""
        found = self._columns.get(key)
        if found is None:
            only = self._only_layout()
            if only is not None and key in self.layouts[only][0]:
                found = self.matrices[only][:, self.layouts[only][0].index(key)]  # a view
            else:
                found = np.full(self.n_rows, np.nan)
                for (keys, _), matrix, rows in zip(self.layouts, self.matrices,
                                                   self.rows_of):
                    if key in keys:
                        found[rows] = matrix[:, keys.index(key)]
            if len(self._columns) < 256:
                self._columns[key] = found
        return found

    def values_at(self, rows: np.ndarray, keys: Sequence[str], which: np.ndarray
                  ) -> np.ndarray:
        """The value of key ``keys[which[i]]`` at global row ``rows[i]`` (NaN where
        which[i] < 0 or the row has no number there): one gather from the matrix where one
        layout holds every row, else a column per key."""
        only = self._only_layout()
        if only is not None:
            names = self.layouts[only][0]
            places = np.array([names.index(k) if k in names else -1 for k in keys] + [-1],
                              dtype=np.int64)[which]      # which = -1: the last, -1
            matrix = self.matrices[only]
            if matrix.flags.c_contiguous:     # one flat gather: a third of a 2-d one's time
                out = matrix.reshape(-1)[rows * len(names) + np.maximum(places, 0)]
            else:
                out = matrix[rows, np.maximum(places, 0)]
            out[places < 0] = np.nan
            return out
        out = np.full(len(rows), np.nan)
        for i in np.unique(which[which >= 0]).tolist():
            mask = which == i
            out[mask] = self.column(keys[i])[rows[mask]]
        return out

    def _only_layout(self) -> int | None:
        """The layout holding every row in row order, if one does (then a column is a
        view of its matrix)."""
        if self._only is None:
            self._only = -1
            for i, rows in enumerate(self.rows_of):
                if len(rows) == self.n_rows and np.array_equal(
                        rows, np.arange(self.n_rows)):
                    self._only = i
        return self._only if self._only >= 0 else None

    def has_key(self, layout: int, key: str) -> bool:
        return key in self.layouts[layout][0]


Decoder = Callable[[bytes], Any]


class ColumnTable:
    """Records as blocks over a ColumnStore, in reading order (see the module docstring).

    Per block (arrays): `layout`, `start` (its first global row), `offset` (its first row
    in its layout's matrix), `rows`; lists: `run_dirs`, `args` and `hparams` (objects, or
    the JSON bytes they are decoded from on first use by `decode`; a list, or a
    ``block_values.BlockValues`` that cuts the bytes from a records index's blob on
    access); `kept`: {block: its record dicts} for blocks that keep them. `keys`: the
    blocks' ``run_keys.RunKeys``."""

    def __init__(self, store: ColumnStore, layout: np.ndarray, start: np.ndarray,
                 offset: np.ndarray, rows: np.ndarray, run_dirs: list[str | None],
                 args: Values, hparams: Values, kept: dict[int, list[Record]],
                 keys: RunKeys | None = None, decode: Decoder | None = None) -> None:
        self.store, self.layout, self.start, self.offset, self.rows = \
            store, layout, start, offset, rows
        self.run_dirs, self.args, self.hparams, self.kept = run_dirs, args, hparams, kept
        self.decode = decode
        self.before_records: Callable[[ColumnTable], None] | None = None   # run once
        self._keys = keys
        self.cache: dict[Any, Any] = {}    # what selection works out once per table
        self._records: list[Record] | None = None

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> ColumnTable:
        """The table of record dicts (kept: `records` gives back these very objects)."""
        builder = TableBuilder()
        builder.add_records(None, list(records), keep_records=True)
        return builder.finish()

    def __len__(self) -> int:
        return int(self.rows.sum())

    @property
    def n_blocks(self) -> int:
        return len(self.layout)

    @property
    def keys(self) -> RunKeys:
        """The blocks' key codes (worked out from their args on first use where the
        reader did not give them)."""
        if self._keys is None:
            builder = KeysBuilder()
            for i in range(self.n_blocks):
                builder.add_objects(self.args_of(i), self.hparams_of(i))
            self._keys = builder.finish()
        return self._keys

    def args_of(self, block: int) -> Any:
        found = self.args[block]
        if type(found) is bytes:
            found = self.args[block] = self.decode(found)  # type: ignore[misc]
        return found

    def hparams_of(self, block: int) -> Any:
        found = self.hparams[block]
        if type(found) is bytes:
            found = self.hparams[block] = self.decode(found)  # type: ignore[misc]
        return found

    def subset(self, blocks: Sequence[int] | np.ndarray) -> ColumnTable:
        """The table of these blocks (numbers into this one), in this order."""
        picked = np.asarray(blocks, dtype=np.int64).reshape(-1)
        index = picked.tolist()
        kept = {new: self.kept[old] for new, old in enumerate(index) if old in self.kept} \
            if self.kept else {}
        args, hparams = take(self.args, picked), take(self.hparams, picked)
        table = ColumnTable(self.store, self.layout[picked], self.start[picked],
                            self.offset[picked], self.rows[picked],
                            [self.run_dirs[i] for i in index], args, hparams, kept,
                            self.keys.subset(picked), self.decode)
        if self.before_records is not None:
            table.before_records = self._check_for_subset
        return table

    def _check_for_subset(self, subset: ColumnTable) -> None:
        """A subset's records need this table's check; a table it replaced leaves the
        subset stale."""
        hook, self.before_records = self.before_records, None
        if hook is not None:
            store = self.store
            hook(self)
            if self.store is not store:
                raise UserError("the records index did not match its records and was "
                                "rebuilt from the files: run the command again")

    @property
    def blocks(self) -> BlockList:
        """The blocks as Block objects (made on access; args decoded then)."""
        return BlockList(self)

    def block(self, i: int) -> Block:
        return Block(self.run_dirs[i], self.args_of(i), self.hparams_of(i),
                     int(self.layout[i]), int(self.start[i]), int(self.offset[i]),
                     int(self.rows[i]), self.kept.get(i))

    def keys_of(self, block: Block) -> tuple[str, ...]:
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
        """Every record dict, in reading order (built once, on first use, after the
        `before_records` hook: a reader's check of what it decodes)."""
        hook, self.before_records = self.before_records, None
        if hook is not None:
            hook(self)
        if self._records is None:
            self._records = [r for b in self.blocks for r in self.block_records(b)]
        return self._records

    def block_of_rows(self) -> np.ndarray:
        """For each global row, the index of its block (-1: not in this table)."""
        found = self.cache.get("block_of_rows")
        if found is None:
            found = np.full(self.store.n_rows, -1, dtype=np.int64)
            found[concat_ranges(self.start, self.rows)] = np.repeat(
                np.arange(self.n_blocks), self.rows)
            self.cache["block_of_rows"] = found
        return found


class BlockList(Sequence[Block]):
    """A table's blocks, each made when asked for."""

    def __init__(self, table: ColumnTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.n_blocks

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.table.block(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.table.block(i)

    def __iter__(self) -> Iterator[Block]:
        return (self.table.block(i) for i in range(len(self)))


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenation of range(start, start + size) for each pair."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - exclusive_cumsum(sizes), sizes)
    return np.arange(total, dtype=np.int64) + offsets


def _matrix_rows(of_layout: np.ndarray, offset: np.ndarray, start: np.ndarray,
                 rows: np.ndarray, size: int) -> np.ndarray:
    """The table row of each row of a layout's matrix (`size` rows; its blocks: where
    `of_layout`): where every block is of the layout and its rows are in table order
    (a single-layout sweep read in order), each row's own number."""
    if of_layout.all() and np.array_equal(offset, start):
        return np.arange(size, dtype=np.int64)
    chosen = np.flatnonzero(of_layout)
    found = np.zeros(size, dtype=np.int64)
    found[concat_ranges(offset[chosen], rows[chosen])] = \
        concat_ranges(start[chosen], rows[chosen])
    return found


def exclusive_cumsum(sizes: np.ndarray) -> np.ndarray:
    """Where each of consecutive pieces of these sizes starts (0 first), int64."""
    out = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], out=out[1:])
    return out


class TableBuilder:
    """Gathers blocks in reading order (one by one, or many at once from another table's
    arrays), then `finish` gives the ColumnTable. `keys`: a KeysBuilder that codes each
    block's key values as it is added (else the table works them out when asked)."""

    def __init__(self, keys: KeysBuilder | None = None, decode: Decoder | None = None
                 ) -> None:
        self.layouts: list[Layout] = []
        self._layout_ids: dict[Layout, int] = {}
        self._chunks: list[list[np.ndarray]] = []
        self._sizes: list[int] = []
        self._segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._single: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.run_dirs: list[str | None] = []
        self.args = ValuesBuilder()
        self.hparams = ValuesBuilder()
        self.kept: dict[int, list[Record]] = {}
        self.keys, self.decode = keys, decode

    def layout_id(self, layout: Layout) -> int:
        found = self._layout_ids.get(layout)
        if found is None:
            found = self._layout_ids[layout] = len(self.layouts)
            self.layouts.append(layout)
            self._chunks.append([])
            self._sizes.append(0)
        return found

    def add_block(self, run_dir: str | None, layout: Layout, args: Any, hparams: Any,
                  values: np.ndarray, records: list[Record] | None,
                  key_texts: Sequence[str] | None = None) -> None:
        """One block; `args` / `hparams` objects or their JSON bytes (then `key_texts`,
        the block's ``run_keys.key_texts``, are needed where the builder codes keys)."""
        layout_id = self.layout_id(layout)
        for column, value in zip(self._single, (layout_id, self._sizes[layout_id],
                                                len(values))):
            column.append(value)
        self._chunks[layout_id].append(values)
        self._sizes[layout_id] += len(values)
        if records is not None:
            self.kept[len(self.run_dirs)] = records
        self.run_dirs.append(run_dir)
        self.args.append(args)
        self.hparams.append(hparams)
        if self.keys is not None:
            if key_texts is not None:
                self.keys.add_texts(key_texts)
            else:
                self.keys.add_objects(args, hparams)

    def add_blocks(self, layouts: list[Layout], matrices: list[np.ndarray],
                   layout: np.ndarray, offset: np.ndarray, rows: np.ndarray,
                   run_dirs: list[str], args: Sequence[Any], hparams: Sequence[Any],
                   key_codes: np.ndarray, kept: dict[int, list[Record]]) -> None:
        """Many blocks at once: block i holds rows offset[i] .. offset[i] + rows[i] of
        matrices[layout[i]] (layouts: what those numbers mean); `key_codes` in the
        KeysBuilder's tables; kept: {i: record dicts}; `args` / `hparams`: lists, or
        ``block_values.Texts`` (kept as they are: cut on access)."""
        self._flush()
        ids = np.array([self.layout_id(one) for one in layouts], dtype=np.int64)
        new_layout = ids[layout] if len(ids) else np.zeros(0, dtype=np.int64)
        new_offset = np.zeros(len(layout), dtype=np.int64)
        for source in np.unique(layout):
            chosen = np.flatnonzero(layout == source)
            target = int(ids[source])
            taken = concat_ranges(offset[chosen], rows[chosen])
            matrix = matrices[source]
            whole = len(taken) == len(matrix) and np.array_equal(
                taken, np.arange(len(matrix)))
            new_offset[chosen] = self._sizes[target] + exclusive_cumsum(rows[chosen])
            self._chunks[target].append(matrix if whole else matrix[taken])
            self._sizes[target] += len(taken)
        self._segments.append((new_layout, new_offset, np.asarray(rows, dtype=np.int64)))
        base = len(self.run_dirs)
        self.kept.update({base + i: records for i, records in kept.items()})
        self.run_dirs += run_dirs
        self.args.extend(args)
        self.hparams.extend(hparams)
        if self.keys is not None:
            self.keys.add_code_rows(key_codes)

    def _flush(self) -> None:
        if self._single[0]:
            self._segments.append(tuple(np.asarray(c, dtype=np.int64)  # type: ignore
                                        for c in self._single))
            self._single = ([], [], [])
        if self.keys is not None:
            self.keys.flush()

    def add_records(self, run_dir: str | None, records: list[Record], keep_records: bool
                    ) -> None:
        """Add the blocks of `records` (all of `run_dir` when given)."""
        for layout, part, lossless in split_blocks(records, keep_records):
            first = part[0]
            self.add_block(run_dir if run_dir is not None else first.get("run_dir"),
                           layout, first.get("args"), first.get("hparams"),
                           numeric_block(layout, part), None if lossless else part)

    def add_part(self, run_dir: str, part: Part, key_texts: Sequence[str] | None = None
                 ) -> None:
        """Add one file's part; dicts it keeps get their run_dir."""
        if part.records is not None:
            for record in part.records:
                record["run_dir"] = run_dir
        self.add_block(run_dir, part.layout, part.args, part.hparams, part.values,
                       part.records, key_texts)

    def finish(self) -> ColumnTable:
        self._flush()
        empty = np.zeros(0, dtype=np.int64)
        layout, offset, rows = (np.concatenate([s[i] for s in self._segments])
                                if self._segments else empty for i in range(3))
        start = exclusive_cumsum(rows)
        matrices, rows_of = [], []
        for layout_id, ((keys, _), chunks) in enumerate(zip(self.layouts, self._chunks)):
            matrices.append(chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
                            if chunks else np.zeros((0, len(keys))))
            rows_of.append(_matrix_rows(layout == layout_id, offset, start, rows,
                                        self._sizes[layout_id]))
        store = ColumnStore(self.layouts, matrices, rows_of, int(rows.sum()))
        run_keys = self.keys.finish() if self.keys is not None else None
        return ColumnTable(store, layout, start, offset, rows, self.run_dirs,
                           self.args.finish(), self.hparams.finish(), self.kept, run_keys,
                           self.decode)
