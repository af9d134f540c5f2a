"""An index of a sweep's records, so that an unchanged sweep is re-read in a fraction of
the time: the whole sweep as arrays (per run: its path, the stat key of its results.jsonl,
how many blocks; per block: layout, rows, key codes (``run_keys``), args and hparams JSON;
per layout: one float64 matrix), and the listing of every directory the walk visited
(``discovery``), so an unchanged directory is not listed again.

Never trusted over the files: a run is served only while its results.jsonl's stat key
(size, mtime ns, inode, device, ctime ns) is the stored one, and a file modified in the
last ``SETTLE_NS`` is not stored (a write in the same clock tick could leave its stat key
unchanged), so a changed, touched, replaced, truncated or new file is read again and a
deleted one drops out. The index is read as hostile input: a symlink, a file too large, a
corrupt or crafted one (wrong magic, truncated, arrays that do not fit together, codes out
of range, integers that are not, a layout or a key value the records schema refuses) is
ignored with a warning and rebuilt. No pickle: a JSON header names each array (dtype from
an allowlist, shape, byte offset) that follows it raw. Checks run per array, per layout and
per distinct key value, not per run; the args and hparams objects are decoded (and held to
the schema) only where a caller asks for record dicts (``records.Records``).

Layout: ``MAGIC``, the header's length and the head's length (8-byte little-endian each),
the JSON header, then the arrays, each at an 8-byte aligned offset, the args and hparams
blobs last: a reader reads the head (everything before them) and the blobs only where a
caller asks for an args or hparams text (a report never does: 63 of a 100,000-run
index's 200 MB), from the file it opened. Written atomically in the sweep directory
(``INDEX_FILE``), or where that is not writable, in ``$XDG_CACHE_HOME/oodbed/records-index/``
under a hash of the sweep's real path.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from domainbed.results.block_values import Texts
from domainbed.results.discovery import Listings
from domainbed.results.index_checks import (
    CorruptIndex,
    check_header,
    check_keys,
    check_layouts,
    check_matrix,
    check_tiling,
    kept_parts,
)
from domainbed.results.run_keys import KEY_FIELDS
from oodutils.errors import UserError
from oodutils.fileio import Buffer, atomic_write_bytes
from oodutils.gc_pause import paused_gc
from oodutils.log import get_logger
from oodutils.untrusted import open_regular

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - a dependency; json reads the index without it
    _orjson = None  # type: ignore[assignment]
_ORJSON_DEPTH_SAFE = _orjson is not None and \
    tuple(int(p) for p in _orjson.__version__.split(".")[:2] if p.isdigit()) >= (3, 10)

logger = get_logger(__name__)

StatKey = tuple[int, int, int, int, int]
INDEX_FILE = ".records-index"
MAGIC = b"OODBED-RECORDS-INDEX-3\n"
OLD_MAGICS = (b"OODBED-RECORDS-INDEX\n", b"OODBED-RECORDS-INDEX-2\n")   # rebuilt quietly
VERSION = 3
PREFIX = len(MAGIC) + 16                  # the magic, the header's and the head's lengths
LAZY_ARRAYS = ("args_blob", "hparams_blob")     # last in the file, read when asked for
SETTLE_NS = 2_000_000_000
DTYPES = {"<i8": np.int64, "<f8": np.float64, "|u1": np.uint8}


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def cache_path(top: str) -> str:
    """Where the index of `top` lives when `top` is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(os.path.realpath(top).encode("utf-8", "surrogateescape"))
    return os.path.join(base, "oodbed", "records-index", digest.hexdigest()[:32])


class Stored(NamedTuple):
    """A decoded index: the runs (`paths`, `stats`: n x 5, `first_block`: n + 1 bounds
    into the blocks, `notes`), the blocks (`layout`, `offset`, `rows`, `key_codes`,
    `args` / `hparams` JSON bytes, cut from the file's bytes when asked for: `take` the
    blocks served, `kept`: {block: record dicts}), the `layouts` and their `matrices`,
    the key `values` / `texts` tables and the directory `listings`."""
    paths: list[str]
    stats: np.ndarray
    first_block: np.ndarray
    notes: dict[int, list[str]]
    layout: np.ndarray
    offset: np.ndarray
    rows: np.ndarray
    key_codes: np.ndarray
    args: Texts
    hparams: Texts
    kept: dict[int, list[dict[str, Any]]]
    layouts: list[tuple[tuple[str, ...], str]]
    matrices: list[np.ndarray]
    values: list[list[Any]]
    texts: list[list[str]]
    listings: Listings


class RecordIndex:
    """The index file of one input directory: `load` it, `save` a new one."""

    def __init__(self, top: str) -> None:
        self.top = top
        self.path = os.path.join(top, INDEX_FILE) if os.access(top, os.W_OK) \
            else cache_path(top)
        self.notes: list[str] = []
        self.stored: Stored | None = None
        self.size = 0

    def load(self, max_bytes: int) -> RecordIndex:
        """Read the index file, if any (at most `max_bytes`); a bad one is noted, not used.
        A write of it this process has under way is waited for."""
        _wait_for_write(self.path)
        try:
            f = open_regular(self.path)
        except FileNotFoundError:
            return self
        except OSError as e:
            return self.ignore(f"unreadable ({e.strerror or e})")
        try:
            self.size = os.fstat(f.fileno()).st_size
            if self.size > max_bytes:
                return self.ignore(f"larger than {max_bytes} bytes")
            prefix = f.read(PREFIX)
            if prefix.startswith(OLD_MAGICS):
                logger.debug(f"rebuilding the records index {self.path} (an older format)")
                return self
            head = int.from_bytes(prefix[len(MAGIC) + 8:PREFIX], "little") \
                if prefix.startswith(MAGIC) else 0
            head = head if PREFIX <= head <= self.size else self.size
            f.seek(0)
            data = f.read(head)      # (once more from the start: no joined copy)
            tail = FileTail(f, len(data), self.size - len(data))
        except OSError as e:
            f.close()
            return self.ignore(f"unreadable ({e.strerror or e})")
        try:
            with paused_gc():     # its listings are 4 lists per directory
                self.stored = decode(data, tail)
        except CorruptIndex as e:
            return self.ignore(str(e))
        finally:
            if self.stored is None or not tail.size:
                tail.close()
        return self

    def ignore(self, why: str) -> RecordIndex:
        note = f"warning: ignored the records index {self.path} ({why}); rebuilding it"
        logger.warning(note)
        self.notes.append(note)
        self.stored = None
        return self

    def save(self, data: Sequence[Buffer], background: bool = False) -> None:
        """Write the index (`encode`'s pieces); a failed write only costs the next reader
        time. background: in a thread (the write and its fsync wait on the disk, not on
        this process), joined before this process reads the index again or exits."""
        if background:
            _wait_for_write(self.path)
            writer = threading.Thread(target=self._save_quietly, args=(data,),
                                      name="records-index-writer")
            _WRITES[self.path] = writer
            writer.start()
            return
        self._save_quietly(data)

    def _save_quietly(self, data: Sequence[Buffer]) -> None:
        for path in dict.fromkeys([self.path, cache_path(self.top)]):
            try:
                atomic_write_bytes(path, data)
                return
            except (OSError, UserError) as e:   # (UserError: the disk is full)
                logger.debug(f"could not write the records index {path}: {e}")


_WRITES: dict[str, threading.Thread] = {}     # index path -> its write under way


def _wait_for_write(path: str) -> None:
    writer = _WRITES.pop(path, None)
    if writer is not None:
        writer.join()


def _blob(texts: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(the concatenated bytes, each text's end offset)."""
    ends = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
    return np.frombuffer(b"".join(texts), dtype=np.uint8), ends


def encode(runs: dict[str, Any], blocks: dict[str, Any], layouts: list[Any],
           matrices: list[np.ndarray], texts: list[list[str]],
           listings: Listings) -> list[Buffer]:
    """The bytes of an index file, in pieces (the arrays' own memory, not copied).
    runs: {"paths", "stats" (n x 5), "block_counts", "notes" ({run: notes})};
    blocks: {"layout", "offset", "rows", "key_codes", "args", "hparams" (JSON bytes
    each), "kept" ({block: records without run_dir})}."""
    paths = "\0".join(runs["paths"]).encode("utf-8", "surrogateescape")
    args_blob, args_ends = _blob(blocks["args"])
    hparams_blob, hparams_ends = _blob(blocks["hparams"])
    dir_names = listings.rels
    dir_children = listings.children
    arrays = {
        "run_paths": np.frombuffer(paths, dtype=np.uint8),
        "run_stats": np.asarray(runs["stats"], dtype=np.int64).reshape(-1, 5),
        "run_blocks": np.asarray(runs["block_counts"], dtype=np.int64),
        "block_layout": blocks["layout"], "block_offset": blocks["offset"],
        "block_rows": blocks["rows"], "block_keys": blocks["key_codes"],
        "args_blob": args_blob, "args_ends": args_ends,
        "hparams_blob": hparams_blob, "hparams_ends": hparams_ends,
        "dir_paths": np.frombuffer("\0".join(dir_names).encode("utf-8", "surrogateescape"),
                                   dtype=np.uint8),
        "dir_children": np.frombuffer("\0".join(dir_children).encode(
            "utf-8", "surrogateescape"), dtype=np.uint8),
        "dir_keys": np.array(listings.keys, dtype=np.int64).reshape(-1, 4),
        "dir_flags": np.array(listings.flags, dtype=np.int64),
        **{f"matrix{i}": m for i, m in enumerate(matrices)}}
    for name in LAZY_ARRAYS:     # last: read only when asked for
        arrays[name] = arrays.pop(name)
    described: dict[str, list[Any]] = {}
    at = 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        arrays[name] = array
        dtype = {np.dtype(np.int64): "<i8", np.dtype(np.float64): "<f8",
                 np.dtype(np.uint8): "|u1"}[array.dtype]
        described[name] = [dtype, list(array.shape), at]
        at += -(-array.nbytes // 8) * 8
    header = {"version": VERSION, "arrays": described,
              "layouts": [[list(k), t] for k, t in layouts], "values": texts,
              "notes": {str(k): v for k, v in runs["notes"].items()},
              "kept": {str(k): v for k, v in blocks["kept"].items()},
              "n_runs": len(runs["paths"]), "n_dirs": len(dir_names)}
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-(PREFIX + len(text)) % 8)
    head_end = PREFIX + len(text) + described[LAZY_ARRAYS[0]][2]   # (where the tail starts)
    pieces: list[Buffer] = [MAGIC + len(text).to_bytes(8, "little") +
                            head_end.to_bytes(8, "little") + text]
    for array in arrays.values():
        if array.nbytes:
            pieces.append(memoryview(array).cast("B"))
        pieces.append(b"\0" * (-array.nbytes % 8))
    return pieces


def decode(data: bytes, tail: FileTail | None = None) -> Stored:
    """The index in `data` (the whole file, or its head with the rest in `tail`);
    CorruptIndex where it is not what `encode` writes or does not fit the records
    schema."""
    if not data.startswith(MAGIC):
        raise CorruptIndex("not a records index")
    start = PREFIX
    length = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    if len(data) < start + length:
        raise CorruptIndex("truncated")
    header = check_header(_parse_header(data[start:start + length]), VERSION)
    arrays, lazy = _arrays(header["arrays"], data, start + length,
                           len(data) + (tail.size if tail is not None else 0))
    n_runs, n_dirs = header["n_runs"], header["n_dirs"]
    paths = _strings(arrays["run_paths"], n_runs, "run paths")
    stats, counts = arrays["run_stats"], arrays["run_blocks"]
    if stats.shape != (n_runs, 5) or counts.shape != (n_runs,) or (counts < 0).any():
        raise CorruptIndex("its runs do not fit together")
    first_block = np.concatenate(([0], np.cumsum(counts)))
    n_blocks = int(first_block[-1])
    layout, offset, rows, codes = (arrays[k] for k in ("block_layout", "block_offset",
                                                       "block_rows", "block_keys"))
    if layout.shape != (n_blocks,) or offset.shape != (n_blocks,) or \
            rows.shape != (n_blocks,) or codes.shape != (n_blocks, len(KEY_FIELDS)):
        raise CorruptIndex("its blocks do not fit together")
    layouts = check_layouts(header["layouts"])
    found = [arrays.get(f"matrix{i}") for i in range(len(layouts))]
    matrices = [m for m in found if m is not None]
    if len(matrices) != len(layouts) or any(m.ndim != 2 or m.shape[1] != len(keys)
                                            for m, (keys, _) in zip(matrices, layouts)) or \
            len([k for k in arrays if k.startswith("matrix")]) != len(layouts):
        raise CorruptIndex("its matrices do not fit its layouts")
    if n_blocks and (layout.min() < 0 or layout.max() >= len(layouts)):
        raise CorruptIndex("a block's layout is out of range")
    kept = kept_parts(header["kept"], layouts, layout, rows)
    check_tiling(layout, offset, rows, [len(m) for m in matrices])
    for i, matrix in enumerate(matrices):
        check_matrix(layouts[i], matrix, [(int(offset[b]), int(rows[b]), records)
                                          for b, records in kept.items() if layout[b] == i])
    values = check_keys(header["values"], codes, layouts, layout)
    notes = {int(k): v for k, v in header["notes"].items() if k.isdigit()}
    if len(notes) != len(header["notes"]) or any(not 0 <= k < n_runs for k in notes):
        raise CorruptIndex("a note names no run")
    at = start + length
    args, hparams = (_texts(tail if f"{what}_blob" in lazy else data,
                            at + header["arrays"][f"{what}_blob"][2],
                            header["arrays"][f"{what}_blob"][1][0],
                            arrays[f"{what}_ends"], n_blocks, what)
                     for what in ("args", "hparams"))
    return Stored(paths, stats, first_block, notes, layout, offset, rows, codes, args,
                  hparams, kept, layouts, matrices, values, header["values"],
                  _listings(arrays, n_dirs))


def _parse_header(text: bytes) -> Any:
    """The JSON of the header: orjson where it can, json where orjson cannot (NaN in a key
    value, which json writes). orjson before 3.10 crashes on nesting 150,000 deep (3.10
    stops at 1,024): json reads the index there."""
    if _ORJSON_DEPTH_SAFE:
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise CorruptIndex("its header is not JSON") from None


def _arrays(described: Any, data: bytes, base: int, total: int
            ) -> tuple[dict[str, np.ndarray], set[str]]:
    """(the arrays the header describes, as views of `data`; the names of those past
    its end, in the file's tail: LAZY_ARRAYS only): each of an allowed dtype, inside the
    file of `total` bytes, none overlapping another, nothing after the last."""
    if not isinstance(described, dict):
        raise CorruptIndex("it describes no arrays")
    arrays, lazy, end = {}, set(), 0
    for name, spec in described.items():
        if not (isinstance(spec, list) and len(spec) == 3 and spec[0] in DTYPES and
                isinstance(spec[1], list) and len(spec[1]) in (1, 2) and
                all(type(n) is int and n >= 0 for n in spec[1]) and type(spec[2]) is int
                and spec[2] >= end and spec[2] % 8 == 0):
            raise CorruptIndex(f"array {name!r} is not described right")
        dtype = np.dtype(DTYPES[spec[0]]).newbyteorder("<")
        size = int(np.prod(spec[1])) * dtype.itemsize
        if base + spec[2] + size > total:
            raise CorruptIndex("truncated")
        end = spec[2] + size
        if base + end > len(data):
            if name not in LAZY_ARRAYS or spec[0] != "|u1" or base + spec[2] < len(data):
                raise CorruptIndex(f"array {name!r} is not described right")
            lazy.add(name)
            continue
        arrays[name] = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize,
                                     offset=base + spec[2]).reshape(spec[1])
    if base + -(-end // 8) * 8 != total:
        raise CorruptIndex("its arrays do not fill it")
    needed = ("run_paths", "run_stats", "run_blocks", "block_layout", "block_offset",
              "block_rows", "block_keys", "args_blob", "args_ends", "hparams_blob",
              "hparams_ends", "dir_paths", "dir_children", "dir_keys", "dir_flags")
    if any(name not in arrays and name not in lazy for name in needed):
        raise CorruptIndex("an array is missing")
    return arrays, lazy


def _strings(blob: np.ndarray, count: int, what: str) -> list[str]:
    """The `count` NUL-separated strings of `blob` (no name holds a NUL)."""
    text = blob.tobytes().decode("utf-8", "surrogateescape")
    found = text.split("\0") if count else []
    if len(found) != count or (not count and text):
        raise CorruptIndex(f"its {what} do not match its count")
    return found


def _texts(data: bytes | FileTail | None, at: int, size: int, ends: np.ndarray, count: int,
           what: str) -> Texts:
    """The `count` texts of the `size` bytes of `data` (the file's bytes, or its tail)
    from offset `at`, each ending at its `ends` offset: cut when asked for."""
    if ends.shape != (count,) or (count and (ends[-1] != size or ends.min() < 0 or
                                             (np.diff(ends) < 0).any())):
        raise CorruptIndex(f"its {what} texts do not fit together")
    assert data is not None     # (a lazy array is one past the data: there is a tail)
    return Texts.from_ends(data, ends, at)


class FileTail:
    """The bytes of an open file from offset `start` (`size` of them), read from it on the
    first cut (``tail[a:b]``, offsets in the file), from the file opened, not from
    whatever the path names by then; a file cut short since gives short texts (which
    the records schema then refuses). The file is closed once read, or with the tail."""

    def __init__(self, f: Any, start: int, size: int) -> None:
        self.start, self.size = start, size
        self._bytes: bytes | None = None
        self._file = f
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, f.close)

    def __getitem__(self, cut: slice) -> bytes:
        return self.read()[cut.start - self.start:cut.stop - self.start]

    def read(self) -> bytes:
        with self._lock:
            if self._bytes is None:
                pieces, at = [], self.start
                try:
                    while at < self.start + self.size:
                        piece = os.pread(self._file.fileno(),
                                         min(self.start + self.size - at, 1 << 30), at)
                        if not piece:
                            break
                        pieces.append(piece)
                        at += len(piece)
                except (OSError, ValueError):    # (ValueError: closed)
                    pass
                self._bytes = b"".join(pieces)
                self.close()
            return self._bytes

    def close(self) -> None:
        self._closer()

    def __getstate__(self) -> dict[str, Any]:     # (a copy holds the bytes, not the file)
        return {"start": self.start, "size": self.size, "_bytes": self.read()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, lambda: None)


def _listings(arrays: dict[str, np.ndarray], n_dirs: int) -> Listings:
    names = _strings(arrays["dir_paths"], n_dirs, "directories")
    kids = _strings(arrays["dir_children"], n_dirs, "directory listings")
    keys, flags = arrays["dir_keys"], arrays["dir_flags"]
    if keys.shape != (n_dirs, 4) or flags.shape != (n_dirs,):
        raise CorruptIndex("its directories do not fit together")
    for kid in filter(None, kids):     # names a walk joins to a path: never "", ".", ".."
        bounded = f"/{kid}/"
        if "//" in bounded or "/./" in bounded or "/../" in bounded:
            raise CorruptIndex("a directory listing names no child directory")
    return Listings(names, keys.tolist(), flags.tolist(), kids)


def index_cap(sizes: Sequence[int]) -> int:
    """The most bytes an index of files of these sizes may take (more is not ours)."""
    return 2 * sum(sizes) + (16 << 20)


def is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)
