"""An index of a sweep's records, so that an unchanged sweep is re-read in a fraction of
the time: for each results.jsonl, its stat key (size, modification time in ns, inode,
device, change time in ns) and its records as the tables read them (``TABLE_FIELDS``).

Never trusted over the files: an entry serves a file only while the file's stat key is
the one stored, and a file modified in the last ``SETTLE_NS`` is not stored at all (a write
in the same clock tick could leave its stat key unchanged), so a changed, touched,
replaced, truncated or new file is read again and a deleted one drops out. The index is
read as hostile input: a symlink, a file too large, a corrupt or crafted one (wrong magic,
truncated, an entry that does not fit) is ignored with a warning and rebuilt; no pickle:
JSON for the structure, raw float64 for the numbers. Every record read from it is held to
the records schema like a record read from a file.

Layout: ``MAGIC``, an 8-byte little-endian length, that many bytes of JSON ({"version",
"entries"}), then the float64 values of the entries' numeric columns. An entry whose
records share one args / hparams object and one key order, with float or int values
elsewhere (DomainBed's and ours), is stored as columns; any other as JSON records.
Written atomically in the sweep directory (``INDEX_FILE``), or where that is not writable,
in ``$XDG_CACHE_HOME/oodbed/records-index/`` under a hash of the sweep's real path.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from domainbed.results.columns import Part, concat_ranges, file_parts, rebuild_records
from domainbed.results.schema import record_problem
from oodutils.fileio import atomic_write_bytes
from oodutils.log import get_logger
from oodutils.untrusted import open_regular

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - a dependency; json reads the index without it
    _orjson = None  # type: ignore[assignment]
_ORJSON_DEPTH_SAFE = _orjson is not None and \
    tuple(int(p) for p in _orjson.__version__.split(".")[:2] if p.isdigit()) >= (3, 10)

logger = get_logger(__name__)

Record = dict[str, Any]
Entry = tuple["StatKey", list[Part], list[str]]     # (stat key, parts, notes)
StatKey = tuple[int, int, int, int, int]
INDEX_FILE = ".records-index"
MAGIC = b"OODBED-RECORDS-INDEX\n"
VERSION = 1
SETTLE_NS = 2_000_000_000
_EXACT_INT = 2 ** 53
_NUMERIC = {float: "f", int: "i"}


class CorruptIndex(ValueError):
    """The index file does not hold what this module writes."""


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def cache_path(top: str) -> str:
    """Where the index of `top` lives when `top` is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(os.path.realpath(top).encode("utf-8", "surrogateescape"))
    return os.path.join(base, "oodbed", "records-index", digest.hexdigest()[:32])


class RecordIndex:
    """The index of one input directory: `lookup` what is stored, `store` what was read,
    `save` when anything changed."""

    def __init__(self, top: str) -> None:
        self.top = top
        self.path = os.path.join(top, INDEX_FILE) if os.access(top, os.W_OK) \
            else cache_path(top)
        self.notes: list[str] = []
        self._stored: dict[str, Entry] = {}
        self._kept: dict[str, Entry] = {}
        self._changed = False

    def load(self, max_bytes: int) -> RecordIndex:
        """Read the index file, if any (at most `max_bytes`); a bad one is noted, not used."""
        try:
            with open_regular(self.path) as f:
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            return self
        except OSError as e:
            return self._ignore(f"unreadable ({e.strerror or e})")
        if len(data) > max_bytes:
            return self._ignore(f"larger than {max_bytes} bytes")
        try:
            self._stored = decode(data)
        except CorruptIndex as e:
            return self._ignore(str(e))
        return self

    def _ignore(self, why: str) -> RecordIndex:
        note = f"warning: ignored the records index {self.path} ({why}); rebuilding it"
        logger.warning(note)
        self.notes.append(note)
        self._changed = True
        return self

    def lookup(self, rel: str, key: StatKey) -> tuple[list[Part], list[str]] | None:
        """(parts, notes on skipped lines) stored for the file at `rel` when its stat key
        is still `key`, else None (the caller reads the file and calls `store`)."""
        entry = self._stored.get(rel)
        if entry is None or entry[0] != key:
            return None
        self._kept[rel] = entry
        return entry[1], entry[2]

    def store(self, rel: str, key: StatKey, parts: list[Part], notes: list[str]) -> None:
        """Remember what the file at `rel`, whose stat key was `key` before it was read,
        holds: its records' `parts` (table fields) and the `notes` on its skipped lines.
        A file modified less than SETTLE_NS ago is not remembered."""
        self._changed = True
        if key[1] <= time.time_ns() - SETTLE_NS:
            self._kept[rel] = (key, parts, notes)

    def save(self) -> None:
        """Write the index when an entry changed or one was dropped; a failed write only
        costs the next reader time."""
        if not self._changed and len(self._kept) == len(self._stored):
            return
        data = encode(self._kept)
        for path in dict.fromkeys([self.path, cache_path(self.top)]):
            try:
                atomic_write_bytes(path, data)
                return
            except OSError as e:
                logger.debug(f"could not write the records index {path}: {e}")


def encode(entries: dict[str, Entry]) -> bytes:
    """The bytes of an index file holding `entries` ({rel: (stat key, parts, notes)}): a
    file of one lossless part as columns, any other as JSON records."""
    header: list[dict[str, Any]] = []
    blocks: list[np.ndarray] = []
    at = 0
    for rel, (key, parts, notes) in entries.items():
        entry: dict[str, Any] = {"path": rel, "stat": list(key), "notes": notes}
        if len(parts) == 1 and parts[0].records is None:
            (keys, types), args, hparams, values, _ = parts[0]
            numeric = [j for j, t in enumerate(types) if t in "fi"]
            block = values[:, numeric]
            entry.update(args=args, keys=list(keys), types=types, rows=len(values), at=at)
            if "h" in types:
                entry["hparams"] = hparams
            blocks.append(block.ravel())
            at += block.size
        else:
            entry["records"] = [{k: v for k, v in r.items() if k != "run_dir"}
                                for part in parts for r in part.to_records()]
        header.append(entry)
    text = json.dumps({"version": VERSION, "entries": header}).encode("utf-8")
    values = np.concatenate(blocks) if blocks else np.zeros(0)
    return MAGIC + len(text).to_bytes(8, "little") + text + values.astype("<f8").tobytes()


def decode(data: bytes) -> dict[str, Entry]:
    """The entries of an index file's bytes; CorruptIndex when they are not what `encode`
    writes or a record does not fit the records schema."""
    if not data.startswith(MAGIC):
        raise CorruptIndex("not a records index")
    start = len(MAGIC) + 8
    length = int.from_bytes(data[len(MAGIC):start], "little")
    if len(data) < start + length or (len(data) - start - length) % 8:
        raise CorruptIndex("truncated")
    header = _parse_header(data[start:start + length])
    if not isinstance(header, dict) or header.get("version") != VERSION or \
            not isinstance(header.get("entries"), list):
        raise CorruptIndex(f"not version {VERSION}")
    values = np.frombuffer(data, dtype="<f8", offset=start + length)
    entries: dict[str, Entry] = {}
    columns: dict[tuple[tuple[str, ...], str], list[_ColumnEntry]] = {}
    at = 0   # column blocks follow each other: no two entries read the same values
    for entry in header["entries"]:
        rel, key, notes = _entry_head(entry)
        if "records" in entry:
            entries[rel] = (key, _record_parts(entry), notes)
            continue
        column = _column_head(entry, at, rel, key, notes)
        columns.setdefault(column.layout, []).append(column)
        at += column.rows * column.width
    if at != values.size:
        raise CorruptIndex("its values do not match its entries")
    for layout, found in columns.items():
        for column, part in zip(found, _column_parts(layout, found, values)):
            entries[column.rel] = (column.key, [part], column.notes)
    return entries


def _parse_header(text: bytes) -> Any:
    """The JSON of the header: orjson (3x faster) where it can, json where orjson cannot
    (NaN in an args value, which json writes). orjson before 3.10 crashes on nesting
    150,000 deep (3.10 stops at 1,024): json reads the index there."""
    if _ORJSON_DEPTH_SAFE:
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise CorruptIndex("its header is not JSON") from None


def _entry_head(entry: Any) -> tuple[str, StatKey, list[str]]:
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise CorruptIndex("an entry has no path")
    key, notes = entry.get("stat"), entry.get("notes")
    if not (isinstance(key, list) and len(key) == 5 and all(type(k) is int for k in key)):
        raise CorruptIndex(f"entry {entry['path']!r} has no stat key")
    if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        raise CorruptIndex(f"entry {entry['path']!r} has no notes list")
    return entry["path"], (key[0], key[1], key[2], key[3], key[4]), notes


def _check(record: Record, rel: str) -> None:
    problem = record_problem(record)
    if problem is not None:
        raise CorruptIndex(f"entry {rel!r}: a record {problem}")


def _record_parts(entry: dict[str, Any]) -> list[Part]:
    records = entry["records"]
    if not isinstance(records, list):
        raise CorruptIndex(f"entry {entry['path']!r} has no records")
    for record in records:
        _check(record, entry["path"])
    return file_parts(records)


class _ColumnEntry(NamedTuple):
    rel: str
    key: StatKey
    notes: list[str]
    layout: tuple[tuple[str, ...], str]
    args: dict[str, Any]
    hparams: Any
    at: int
    rows: int
    width: int      # numeric columns


def _column_head(entry: dict[str, Any], at_expected: int, rel: str, key: StatKey,
                 notes: list[str]) -> _ColumnEntry:
    """The column entry's layout and place, checked (its values are checked per layout)."""
    keys, types, rows, at = (entry.get(k) for k in ("keys", "types", "rows", "at"))
    if at != at_expected:
        raise CorruptIndex("its entries' values overlap or leave gaps")
    if not (isinstance(keys, list) and isinstance(types, str) and _fits_column_form(
            tuple(keys) if all(type(k) is str for k in keys) else (), types) and
            type(rows) is int and rows >= 1 and isinstance(entry.get("args"), dict) and
            ("h" not in types or isinstance(entry.get("hparams"), dict))):
        raise CorruptIndex(f"entry {rel!r} does not fit the column form")
    width = len(types) - types.count("a") - types.count("h")
    return _ColumnEntry(rel, key, notes, (tuple(keys), types), entry["args"],
                        entry.get("hparams"), at, rows, width)


_LAYOUTS_SEEN: dict[tuple[tuple[str, ...], str], bool] = {}


def _fits_column_form(keys: tuple[str, ...], types: str) -> bool:
    """Whether keys and types make a column layout (worked out once per layout)."""
    found = _LAYOUTS_SEEN.get((keys, types))
    if found is None:
        found = bool(keys) and len(set(keys)) == len(keys) and \
            len(types) == len(keys) and set(types) <= set("ahfi") and \
            types.count("a") == 1 and types.count("h") <= 1 and \
            [keys[types.index(t)] for t in "ah" if t in types] == \
            ["args", "hparams"][:1 + types.count("h")] and "run_dir" not in keys
        if len(_LAYOUTS_SEEN) < 1024:
            _LAYOUTS_SEEN[(keys, types)] = found
    return found


def _column_parts(layout: tuple[tuple[str, ...], str], entries: list[_ColumnEntry],
                  values: np.ndarray) -> list[Part]:
    """The parts of the column entries of one layout: their values gathered into one
    matrix and checked at once (ints that are ints, steps >= 0), each entry's first record
    held to the records schema (the others share its args, hparams and keys)."""
    keys, types = layout
    numeric = [i for i, t in enumerate(types) if t in "fi"]
    rows = np.fromiter((e.rows for e in entries), np.int64, len(entries))
    starts = np.fromiter((e.at for e in entries), np.int64, len(entries))
    block = values[concat_ranges(starts, rows * len(numeric))].reshape(-1, len(numeric))
    ints = block[:, [j for j, i in enumerate(numeric) if types[i] == "i"]]
    if ints.size and not (np.isfinite(ints).all() and (np.abs(ints) <= _EXACT_INT).all()
                          and (ints == np.round(ints)).all()):
        raise CorruptIndex(f"entry {entries[0].rel!r}'s layout holds an integer that is not "
                           f"one")
    if "step" in keys and types[keys.index("step")] == "i" and \
            block[:, numeric.index(keys.index("step"))].min() < 0:
        raise CorruptIndex(f"entry {entries[0].rel!r}'s layout holds a negative step")
    full = np.full((len(block), len(keys)), np.nan)
    full[:, numeric] = block
    parts = []
    offset = 0
    for entry in entries:
        matrix = full[offset:offset + entry.rows]
        offset += entry.rows
        _check(rebuild_records(layout, entry.args, entry.hparams, matrix[:1])[0], entry.rel)
        parts.append(Part(layout, entry.args, entry.hparams, matrix, None))
    return parts


def index_cap(sizes: Sequence[int]) -> int:
    """The most bytes an index of files of these sizes may take (more is not ours)."""
    return 2 * sum(sizes) + (16 << 20)


def is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)
