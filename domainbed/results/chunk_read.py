"""Many results.jsonl files read into one bundle of arrays: what a worker process sends
back for a chunk of runs (one matrix per layout, per-block arrays, the args / hparams
JSON bytes, key codes into the chunk's own tables of key texts), so that neither side
pays for a Python object per run beyond its bytes, and the reader adds the chunk's blocks
at once (``columns.TableBuilder.add_blocks``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from domainbed.results.columns import Layout, Part
from domainbed.results.run_keys import KEY_FIELDS

Record = dict[str, Any]
RunReader = Callable[[str, list[str], Any],
                     tuple[list[tuple[Part, tuple[str, ...]]], tuple[int, ...]]]
NO_KEY = (-1, -1, -1, -1, -1)


class Chunk(NamedTuple):
    """The runs of a chunk, in order: `errors` (None, or why the file is unreadable),
    `notes` (skipped lines, named by path), `block_counts`, `keys` (runs x 5: each
    results.jsonl's stat key, taken before it was read; -1s where unreadable); their
    blocks: `layouts` /
    `matrices` (chunk-local), `layout`, `offset`, `rows`, `args`, `hparams`, `codes`
    (blocks x KEY_FIELDS) into `texts` (per field), `kept` ({block: record dicts})."""
    errors: list[str | None]
    notes: list[list[str]]
    block_counts: list[int]
    keys: np.ndarray
    layouts: list[Layout]
    matrices: list[np.ndarray]
    layout: np.ndarray
    offset: np.ndarray
    rows: np.ndarray
    args: list[Any]
    hparams: list[Any]
    codes: np.ndarray
    texts: list[list[str]]
    kept: dict[int, list[Record]]


def read_chunk(reader: RunReader, run_dirs: Sequence[str], fields: Any) -> Chunk:
    """reader(run_dir, notes, fields) -> (parts, stat key) of each run directory,
    bundled."""
    errors: list[str | None] = []
    notes_of: list[list[str]] = []
    counts: list[int] = []
    keys: list[tuple[int, ...]] = []
    layout_ids: dict[Layout, int] = {}
    pieces: list[list[np.ndarray]] = []
    sizes: list[int] = []
    layout: list[Any] = []
    offset: list[Any] = []
    rows: list[Any] = []
    args: list[Any] = []
    hparams: list[Any] = []
    kept: dict[Any, Any] = {}
    text_ids: list[dict[str, int]] = [{} for _ in KEY_FIELDS]
    codes: list[list[int]] = []
    for run_dir in run_dirs:
        notes: list[str] = []
        try:
            parts, key = reader(run_dir, notes, fields)
        except OSError as e:
            errors.append(e.strerror or str(e))
            notes_of.append([])
            counts.append(0)
            keys.append(NO_KEY)
            continue
        errors.append(None)
        keys.append(key)
        notes_of.append(notes)
        counts.append(len(parts))
        for part, texts in parts:
            at = layout_ids.setdefault(part.layout, len(layout_ids))
            if at == len(pieces):
                pieces.append([])
                sizes.append(0)
            if part.records is not None:
                kept[len(layout)] = part.records
            layout.append(at)
            offset.append(sizes[at])
            rows.append(len(part.values))
            pieces[at].append(part.values)
            sizes[at] += len(part.values)
            args.append(part.args)
            hparams.append(part.hparams)
            codes.append([ids.setdefault(text, len(ids))
                          for ids, text in zip(text_ids, texts)])
    return Chunk(errors, notes_of, counts,
                 np.array(keys, dtype=np.int64).reshape(-1, len(NO_KEY)), list(layout_ids),
                 [np.concatenate(p) if len(p) > 1 else p[0] for p in pieces],
                 np.asarray(layout, dtype=np.int64), np.asarray(offset, dtype=np.int64),
                 np.asarray(rows, dtype=np.int64), args, hparams,
                 np.asarray(codes, dtype=np.int64).reshape(-1, len(KEY_FIELDS)),
                 [list(ids) for ids in text_ids], kept)
