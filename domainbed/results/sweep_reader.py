"""Reading the runs under input directories into one ColumnTable: the walk
(``discovery``), each unread results.jsonl (``lines``; worker processes for many:
``parallel_read``), and, for the tables' fields, the records index (``record_index``),
which serves every run whose results.jsonl is unchanged as whole arrays.
``records.load_records`` is the entry point."""
from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from domainbed.results import discovery, parallel_read
from domainbed.results.block_values import as_list
from domainbed.results.chunk_read import Chunk, read_chunk
from domainbed.results.columns import (
    ColumnTable,
    Part,
    TableBuilder,
    concat_ranges,
    exclusive_cumsum,
    file_parts,
)
from domainbed.results.lines import (
    MAX_LINE_BYTES,
    parse_json_value,
    parse_run_lines,
    parse_whole_file,
    whole_file_coded,
)
from domainbed.results.record_index import (
    SETTLE_NS,
    Buffer,
    RecordIndex,
    StatKey,
    Stored,
    encode,
    index_cap,
    stat_key,
)
from domainbed.results.run_keys import KEY_FIELDS, KeysBuilder, key_texts
from oodutils.untrusted import open_regular, read_head_stat, read_lines

Record = dict[str, Any]
RESULTS_FILE = discovery.RESULTS_FILE
WHOLE_FILE_BYTES = 16 << 20   # a results.jsonl up to this size is parsed at once
_FILE_TYPE, _REGULAR = 0o170000, 0o100000     # stat.S_IFMT's mask, S_IFREG
_FILE_KEY = parallel_read.stat_columns("st_size", "st_mtime_ns", "st_ino", "st_dev",
                                       "st_ctime_ns")       # record_index.stat_key's order
_RESULTS_AFTER = os.sep + RESULTS_FILE   # a walk's run paths never end with a separator


def read_run(run_dir: str, notes: list[str] | None = None,
             fields: Sequence[str] | None = None) -> tuple[list[Record], int]:
    """(records, skipped_lines) of one run directory; raises OSError when unreadable (not a
    regular file included). Each skipped line adds a note naming it to `notes`."""
    path = os.path.join(run_dir, RESULTS_FILE)
    with open_regular(path) as f:
        data = f.read(WHOLE_FILE_BYTES + 1)
    found = parse_whole_file(data, fields) if len(data) <= WHOLE_FILE_BYTES else None
    if found is not None:
        records, skipped = found, 0
    else:
        records, skipped = parse_run_lines(path, read_lines(path, MAX_LINE_BYTES), notes,
                                           fields)
    for record in records:
        record["run_dir"] = run_dir
    return records, skipped


def read_run_parts(run_dir: str, notes: list[str] | None = None,
                   fields: Sequence[str] | None = None
                   ) -> tuple[list[tuple[Part, tuple[str, ...]]], StatKey]:
    """([(part, key texts)], the results.jsonl's stat key taken before it was read) of
    one run directory, as `read_run` reads it, column-wise: a file of the usual shape
    straight into one Part whose args and hparams are their JSON bytes (no record
    dicts), with its ``run_keys.key_texts``."""
    data, st = read_head_stat(os.path.join(run_dir, RESULTS_FILE), WHOLE_FILE_BYTES)
    found = whole_file_coded(data, fields) if len(data) <= WHOLE_FILE_BYTES else None
    if found is not None:
        return [found], stat_key(st)
    records, _ = read_run(run_dir, notes, fields)
    for record in records:
        del record["run_dir"]    # a block's run_dir is the block's, not a key
    return [(part, key_texts(part.args, part.hparams)) for part in file_parts(records)], \
        stat_key(st)


def _memory_cap() -> int:
    """The most bytes an index file is read into memory (a quarter of the machine's):
    its size is checked against the records' once the files are statted."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 4 << 30


class _Top:
    """What the index of one input directory is rebuilt from."""

    def __init__(self, index: RecordIndex, walked: discovery.Walk, first_block: int
                 ) -> None:
        self.index, self.walked, self.first_block = index, walked, first_block
        self.rels: list[str] = []
        self.stats: list[np.ndarray] = []          # (runs x 5 stat keys) a stretch
        self.block_counts: list[np.ndarray] = []
        self.notes: dict[int, list[str]] = {}
        self.keep: list[np.ndarray] = []   # whether each run goes into the new index
        self.changed = False

    def add(self, rels: list[str], stats: np.ndarray, block_counts: Sequence[int],
            keep: np.ndarray) -> None:
        """The next stretch of runs."""
        self.rels += rels
        self.stats.append(stats)
        self.block_counts.append(np.asarray(block_counts, dtype=np.int64))
        self.keep.append(keep)


class SweepReader:
    """What load_records gathers, one input directory at a time; `finish` gives the
    table and writes the indexes that changed."""

    def __init__(self, fields: Sequence[str] | None, indexed: bool, require_done: bool
                 ) -> None:
        self.fields, self.indexed, self.require_done = fields, indexed, require_done
        self.builder = TableBuilder(KeysBuilder(), parse_json_value)
        self.kept_dirs: list[str] = []
        self.notes: list[str] = []
        self.skipped_lines = self.skipped_runs = 0
        self.served = False
        self._tops: list[_Top] = []

    def read_tree(self, top: str) -> None:
        """Read the runs under `top`, through its index when indexed."""
        index = RecordIndex(top).load(_memory_cap()) if self.indexed else None
        stored = index.stored if index is not None else None
        if stored is None:
            own, children = discovery.split_walk(top)
            if len(children) >= parallel_read.MIN_FILES:
                self._read_unindexed(top, index, own, children)
                return
        walked = discovery.walk(top, stored.listings if stored is not None else None)
        runs = list(zip(walked.run_dirs, walked.rels)) if not self.require_done or \
            all(walked.done) else [(path, rel) for path, rel, done in zip(
                walked.run_dirs, walked.rels, walked.done) if done]
        self.skipped_runs += len(walked.run_dirs) - len(runs)
        keys = _stat_keys([path + _RESULTS_AFTER for path, _ in runs])
        cap = index_cap(keys[:, 0].tolist())
        if stored is not None and index is not None and index.size > cap:
            stored = index.ignore(f"larger than {cap} bytes").stored
        self.notes += index.notes if index is not None else []
        hits = _hits(stored, [rel for _, rel in runs], keys)
        top_info = None
        if index is not None:
            top_info = _Top(index, walked, len(self.builder.run_dirs))
            self._tops.append(top_info)
        misses = [] if (np.asarray(hits) >= 0).all() else \
            [path for (path, _), hit in zip(runs, hits) if hit < 0]
        chunks = _ChunkStream(parallel_read.read_chunks(read_chunk, read_run_parts, misses,
                                                        self.fields))
        settled = time.time_ns() - SETTLE_NS
        for start, stop in _segments(hits):
            if hits[start] >= 0:
                assert stored is not None   # a hit is a run of the index
                self._serve(stored, top_info, hits[start:stop], runs[start:stop],
                            keys[start:stop])
                continue
            at = start
            for chunk, lo, hi in chunks.take(stop - start):
                self._add_read(chunk, lo, hi, runs[at:at + hi - lo],
                               keys[at:at + hi - lo], top_info, settled)
                at += hi - lo
        if top_info is not None:
            top_info.changed = stored is None or bool(misses) or \
                len(stored.paths) != int((hits >= 0).sum()) or \
                walked.changed

    def _read_unindexed(self, top: str, index: RecordIndex | None, walked: discovery.Walk,
                        children: list[str]) -> None:
        """Read every run under `top` from its files, `top` listed (`walked`, with its
        `children`): the children's subtrees walked and their runs read together, batch
        by batch, in worker processes (``parallel_read``)."""
        self.notes += index.notes if index is not None else []
        top_info = None
        if index is not None:
            top_info = _Top(index, walked, len(self.builder.run_dirs))
            top_info.changed = True
            self._tops.append(top_info)
        settled = time.time_ns() - SETTLE_NS
        own = _walk_and_read((top, self.require_done, walked), [], self.fields)
        batches = parallel_read.read_chunks(_walk_and_read, (top, self.require_done, None),
                                            children, self.fields)
        for batch in itertools.chain([(0, own)], batches):
            subtrees = batch[1]
            if subtrees.walked is not walked:
                discovery.extend(walked, subtrees.walked)
            self.skipped_runs += subtrees.not_done
            self._add_read(subtrees.chunk, 0, len(subtrees.runs), subtrees.runs,
                           subtrees.keys, top_info, settled)

    def _serve(self, stored: Stored, top: _Top | None, runs: np.ndarray,
               paths: list[tuple[str, str]], keys: np.ndarray) -> None:
        """Add the blocks of these index runs, as arrays."""
        assert top is not None
        counts = stored.first_block[runs + 1] - stored.first_block[runs]
        blocks = concat_ranges(stored.first_block[runs], counts)
        run_dirs = [path for path, _ in paths] if (counts == 1).all() else \
            [path for (path, _), count in zip(paths, counts.tolist()) for _ in range(count)]
        kept = {}
        if stored.kept:
            for i, block in enumerate(blocks.tolist()):
                if block in stored.kept:
                    kept[i] = stored.kept[block]
                    for record in kept[i]:
                        record["run_dir"] = run_dirs[i]
        self.builder.add_blocks(stored.layouts, stored.matrices, stored.layout[blocks],
                                stored.offset[blocks], stored.rows[blocks], run_dirs,
                                stored.args.take(blocks), stored.hparams.take(blocks),
                                self._codes(stored, blocks), kept)
        if stored.notes:
            first = len(top.rels)
            for i, run in enumerate(runs.tolist()):
                notes = stored.notes.get(run)
                if notes:
                    path = paths[i][0]
                    self.notes += [f"{os.path.join(path, RESULTS_FILE)} {n}" for n in notes]
                    self.skipped_lines += len(notes)
                    top.notes[first + i] = notes
        top.add([rel for _, rel in paths], keys, counts, np.ones(len(paths), dtype=bool))
        self.kept_dirs += [path for path, _ in paths]
        self.served = True

    def _codes(self, stored: Stored, blocks: np.ndarray) -> np.ndarray:
        """The index's key codes of these blocks, as codes of this reader's tables."""
        codes = stored.key_codes[blocks]
        remapped = np.empty_like(codes)
        for field in range(len(KEY_FIELDS)):
            used = np.unique(codes[:, field])
            lookup = np.zeros(len(stored.texts[field]), dtype=np.int64)
            lookup[used] = [self.builder.keys.code_text(field, stored.texts[field][u],  # type: ignore[union-attr]
                                                        stored.values[field][u])
                            for u in used.tolist()]
            remapped[:, field] = lookup[codes[:, field]]
        return remapped

    def _add_read(self, chunk: Chunk, lo: int, hi: int, runs: list[tuple[str, str]],
                  keys: np.ndarray, top: _Top | None, settled: int) -> None:
        """Add runs lo .. hi of a chunk read from their files (`runs`: their paths)."""
        counts = chunk.block_counts[lo:hi]
        first = sum(chunk.block_counts[:lo])
        last = first + sum(counts)
        kept_runs: list[int] = []
        first_run = len(top.rels) if top is not None else 0
        errors, notes_of = chunk.errors[lo:hi], chunk.notes[lo:hi]
        if not any(errors) and not any(notes_of):    # (every run read, no line skipped)
            kept_runs = list(range(len(runs)))
            errors, notes_of = [], []
        for i, ((path, _), error, notes) in enumerate(zip(runs, errors, notes_of)):
            results = path + _RESULTS_AFTER
            if error is not None:
                self.skipped_runs += 1
                self.notes.append(f"{results}: unreadable ({error})")
                continue
            kept_runs.append(i)
            line_notes = [note[len(results) + 1:] for note in notes]
            if line_notes:
                self.notes += [f"{results} {note}" for note in line_notes]
                self.skipped_lines += len(line_notes)
                if top is not None:
                    top.notes[first_run + len(kept_runs) - 1] = line_notes
        every_run = len(kept_runs) == len(runs)
        if top is not None:
            kept_keys = keys if every_run else keys[kept_runs]
            # (a run's key: -1s where not a regular file)
            top.add([rel for _, rel in runs] if every_run else
                    [runs[i][1] for i in kept_runs], kept_keys,
                    counts if every_run else [counts[i] for i in kept_runs],
                    (kept_keys[:, 0] >= 0) & (kept_keys[:, 1] <= settled))
        paths = [path for path, _ in runs]
        self.kept_dirs += paths if every_run else [paths[i] for i in kept_runs]
        run_dirs = paths if counts.count(1) == len(counts) else \
            [path for path, count in zip(paths, counts) for _ in range(count)]
        kept = {}
        for block, records in chunk.kept.items():
            if first <= block < last:
                for record in records:
                    record["run_dir"] = run_dirs[block - first]
                kept[block - first] = records
        self.builder.add_blocks(chunk.layouts, chunk.matrices, chunk.layout[first:last],
                                chunk.offset[first:last], chunk.rows[first:last], run_dirs,
                                chunk.args[first:last], chunk.hparams[first:last],
                                self._chunk_codes(chunk, first, last), kept)

    def _chunk_codes(self, chunk: Chunk, first: int, last: int) -> np.ndarray:
        """A chunk's key codes of blocks first .. last, as codes of this reader's tables."""
        codes = chunk.codes[first:last]
        remapped = np.empty_like(codes)
        keys = self.builder.keys
        for field, texts in enumerate(chunk.texts):
            lookup = np.array([keys.code_text(field, text, None)  # type: ignore[union-attr]
                               for text in texts], dtype=np.int64)
            remapped[:, field] = lookup[codes[:, field]] if len(codes) else codes[:, field]
        return remapped

    def finish(self, background: bool = False) -> ColumnTable:
        """The table; each changed index written (in a thread where `background`)."""
        table = self.builder.finish()
        for top in self._tops:
            if top.changed or not all(keep.all() for keep in top.keep):
                top.index.save(_encode_top(table, top), background)
        return table


class _Subtrees(NamedTuple):
    """What a worker sends back for a batch of subtrees: their walk (rels relative to the
    top), how many runs lack ``done`` (when required), the runs read (path, rel), their
    stat keys (taken before the files are read) and the chunk read from them."""
    walked: discovery.Walk
    not_done: int
    runs: list[tuple[str, str]]
    keys: np.ndarray
    chunk: Chunk


def _walk_and_read(where: tuple[str, bool, discovery.Walk | None], names: Sequence[str],
                   fields: Sequence[str] | None) -> _Subtrees:
    """Walk the children `names` of the top (or take `walked`: the top's own walk) and
    read their runs."""
    top, require_done, walked = where
    if walked is None:
        walked = discovery.walk_children(top, names)
    runs = [(path, rel) for path, rel, done in zip(walked.run_dirs, walked.rels, walked.done)
            if done or not require_done]
    chunk = read_chunk(read_run_parts, [path for path, _ in runs], fields)
    return _Subtrees(walked, len(walked.run_dirs) - len(runs), runs, chunk.keys, chunk)


class _ChunkStream:
    """The chunks read from files, taken run by run as the walk's order needs them."""

    def __init__(self, chunks: Any) -> None:
        self.chunks, self.at = chunks, 0
        self.chunk: Chunk | None = None

    def take(self, count: int) -> list[tuple[Chunk, int, int]]:
        """(chunk, first run, end run) pieces holding the next `count` runs."""
        pieces: list[tuple[Chunk, int, int]] = []
        while count > 0:
            if self.chunk is None or self.at == len(self.chunk.errors):
                self.chunk, self.at = next(self.chunks)[1], 0
            chunk = self.chunk
            assert chunk is not None
            end = min(self.at + count, len(chunk.errors))
            pieces.append((chunk, self.at, end))
            count -= end - self.at
            self.at = end
        return pieces


def _stat_keys(paths: list[str]) -> np.ndarray:
    """The stat key of each file (``stat_key``: size, mtime ns, inode, device, ctime ns;
    -1s where it is missing or not a regular file), as rows of an int64 array."""
    rows = parallel_read.lstat_rows(paths)
    keys = rows[:, _FILE_KEY]
    keys[(rows[:, 0] & _FILE_TYPE) != _REGULAR] = -1
    return keys


def _hits(stored: Stored | None, rels: list[str], keys: np.ndarray) -> np.ndarray:
    """For each run, its run number in the index when its stat key is the stored one,
    else -1."""
    if stored is None or not rels:
        return np.full(len(rels), -1, dtype=np.int64)
    if rels == stored.paths:
        found = np.arange(len(rels), dtype=np.int64)
    else:
        position = dict(zip(stored.paths, range(len(stored.paths))))
        found = np.fromiter((position.get(rel, -1) for rel in rels), np.int64, len(rels))
    current = keys
    same = (stored.stats[np.maximum(found, 0)] == current).all(axis=1) if \
        len(stored.paths) else np.zeros(len(rels), dtype=bool)
    return np.where((found >= 0) & same & (current[:, 0] >= 0), found, -1)


def _segments(hits: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each stretch of runs served from the index (hits >= 0) or read
    from their files, in order."""
    if len(hits) == 0:
        return []
    served = hits >= 0
    cuts = np.flatnonzero(served[1:] != served[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(hits)]
    return list(zip(bounds, bounds[1:]))


def _json_bytes(value: Any) -> bytes:
    return value if type(value) is bytes else json.dumps(value).encode("utf-8")


def _encode_top(table: ColumnTable, top: _Top) -> list[Buffer]:
    """The new index of one input directory: its runs kept (settled, readable), their
    blocks' rows gathered per layout."""
    counts = np.concatenate([np.zeros(0, dtype=np.int64), *top.block_counts])
    keep = np.concatenate([np.zeros(0, dtype=bool), *top.keep])
    run_blocks = top.first_block + concat_ranges(exclusive_cumsum(counts), counts)
    blocks = run_blocks[np.repeat(keep, counts)] if len(counts) else run_blocks
    layout, offset, rows = table.layout[blocks], table.offset[blocks], table.rows[blocks]
    new_offset = np.zeros(len(blocks), dtype=np.int64)
    matrices = []
    for i, matrix in enumerate(table.store.matrices):
        chosen = np.flatnonzero(layout == i)
        starts = exclusive_cumsum(rows[chosen])
        whole = int(rows[chosen].sum()) == len(matrix) and np.array_equal(offset[chosen],
                                                                         starts)
        matrices.append(matrix if whole else matrix[concat_ranges(offset[chosen],
                                                                  rows[chosen])])
        new_offset[chosen] = starts
    block_list = blocks.tolist()
    every_block = np.array_equal(blocks, np.arange(table.n_blocks))
    kept = {i: [{k: v for k, v in r.items() if k != "run_dir"} for r in table.kept[b]]
            for i, b in enumerate(block_list) if b in table.kept} if table.kept else {}
    kept_runs = np.flatnonzero(keep).tolist()
    renumber = {old: new for new, old in enumerate(kept_runs)} if top.notes else {}
    return encode(
        {"paths": top.rels if len(kept_runs) == len(top.rels) else
         [top.rels[i] for i in kept_runs],
         "stats": np.concatenate([np.zeros((0, 5), dtype=np.int64), *top.stats])[keep],
         "block_counts": counts[keep],
         "notes": {renumber[r]: n for r, n in top.notes.items() if r in renumber}},
        {"layout": layout, "offset": new_offset, "rows": rows,
         "key_codes": table.keys.codes[blocks],
         "args": _json_texts(as_list(table.args), block_list, every_block),
         "hparams": _json_texts(as_list(table.hparams), block_list, every_block),
         "kept": kept},
        table.store.layouts, matrices, table.keys.texts, top.walked.listings)


def _json_texts(values: list[Any], blocks: list[int], every_block: bool) -> list[bytes]:
    """The JSON bytes of these blocks' values (bytes as they are): the list itself where
    it holds every block, all as bytes (a sweep read from its files)."""
    if every_block and set(map(type, values)) <= {bytes}:
        return values
    return [_json_bytes(values[b]) for b in blocks]
