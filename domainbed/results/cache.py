"""The records cache of an input directory, ``.records-cache.parquet``: the tables the
readers built from its results.jsonl files, so that reading an unchanged sweep again
reads one Parquet file instead of every results.jsonl.

Never trusted over the files: a cached file is taken only where its path and its (size,
mtime_ns, inode) are the cached ones. The Parquet metadata holds a SHA-256 of the whole
file (its own place zeroed), checked before polars parses a byte, and the polars version
that wrote it; a cache that is no regular file of this user, fails its checksum or does
not parse is ignored with one warning and rebuilt. Read without following symlinks,
written atomically (``oodutils.pinned_dir``); files changed in the last ``SETTLE_NS`` and
files with skipped lines are not cached.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
import time

import polars as pl

from domainbed.results.fast_reader import POLARS_ERRORS
from domainbed.results.reader import BLOCK_SCHEMA, Frame, subset
from oodutils.log import get_logger
from oodutils.pinned_dir import PinnedDir
from oodutils.untrusted import open_regular

logger = get_logger(__name__)

CACHE_FILE = ".records-cache.parquet"
FORMAT = "oodbed-records-cache/2"
SETTLE_NS = 2_000_000_000
MAX_CACHE_BYTES = 8 << 30
KEY_COLUMNS = ("size", "mtime_ns", "inode")


DIGEST_MARK = b"oodbed-sha256:"
_UNSET = b"0" * 64


def _sealed(data: bytes) -> bytes | None:
    """The file's bytes with its checksum written in (the place `DIGEST_MARK` opens, the
    last one: the Parquet footer), or None where there is no such place."""
    at = data.rfind(DIGEST_MARK + _UNSET)
    if at < 0:
        return None
    start = at + len(DIGEST_MARK)
    return data[:start] + hashlib.sha256(data).hexdigest().encode() + data[start + 64:]


def checksum_holds(data: bytes) -> bool:
    """Whether the checksum in these bytes is the SHA-256 of the bytes (its place zeroed)."""
    at = data.rfind(DIGEST_MARK)
    if at < 0:
        return False
    start = at + len(DIGEST_MARK)
    written, view = data[start:start + 64], memoryview(data)
    digest = hashlib.sha256(view[:start])
    digest.update(_UNSET)
    digest.update(view[start + 64:])
    return len(written) == 64 and digest.hexdigest().encode() == written


class Cache:
    """The cache of one input directory: `load` it, `take` the runs it holds unchanged,
    `save` the tables of a new read."""

    def __init__(self, top: str) -> None:
        self.top = top
        self.path = os.path.join(top, CACHE_FILE)
        self.table: pl.DataFrame | None = None   # a row per block, its records' as lists
        self.row_columns: list[str] = []
        self.warning: str | None = None

    def _ignore(self, why: str) -> None:
        self.warning = f"warning: ignored the records cache {self.path} ({why}); read " \
            "the results files"
        self.table = None

    def load(self) -> Cache:
        """Read the cache, if there is one this user wrote and it is whole."""
        try:
            with open_regular(self.path) as f:
                st = os.fstat(f.fileno())
                mine = st.st_uid == os.geteuid() and not st.st_mode & stat.S_IWOTH
                data = f.read(MAX_CACHE_BYTES + 1) if mine else b""
        except FileNotFoundError:
            return self
        except OSError as e:
            self._ignore(f"not a regular file: {e.strerror or e}")
            return self
        why = "another user's file, or writable by everyone" if not mine else \
            "too large" if len(data) > MAX_CACHE_BYTES else \
            "written by another version" if DIGEST_MARK not in data else \
            "its checksum does not match its content" if not checksum_holds(data) else \
            self._parsed(data)
        if why:
            self._ignore(why)
        return self

    def _parsed(self, data: bytes) -> str | None:
        """Parse the checksummed bytes into `table`; why they are not a cache, or None."""
        try:
            meta = pl.read_parquet_metadata(io.BytesIO(data))
            table = pl.read_parquet(io.BytesIO(data))
        except POLARS_ERRORS as e:  # a file this code did not write, panics included
            return f"not a readable Parquet file: {type(e).__name__}"
        if meta.get("format") != FORMAT or meta.get("polars") != pl.__version__:
            return "written by another version"
        self.row_columns = [c for c in table.columns
                            if c not in BLOCK_SCHEMA and c not in ("rel", *KEY_COLUMNS)]
        try:
            table.select([*(c for c in BLOCK_SCHEMA if c != "run_dir"), "rel",
                          *KEY_COLUMNS, *self.row_columns]).head(0).explode(self.row_columns)
        except POLARS_ERRORS as e:  # a checksummed table of another shape
            return f"an unexpected table: {type(e).__name__}"
        self.table = table
        return None

    def take(self, rels: list[str], keys: list[tuple[int, int, int] | None]
             ) -> tuple[Frame, list[int]] | None:
        """(the cached frame of the runs whose file key is the cached one, their indices
        in `rels`), or None."""
        if self.table is None or not self.table.height:
            return None
        columns = list(zip(*(key or (None,) * 3 for key in keys))) or [()] * 3
        wanted = pl.DataFrame({"rel": rels, **dict(zip(KEY_COLUMNS, columns)),
                               "at": range(len(rels))},
                              schema={"rel": pl.String, **dict.fromkeys(KEY_COLUMNS, pl.Int64),
                                      "at": pl.Int64})
        blocks = self.table.join(wanted, on=["rel", *KEY_COLUMNS], how="inner",
                                 maintain_order="left")
        if not blocks.height:
            return None
        try:
            rows = blocks.select(self.row_columns).with_columns(
                block=pl.int_range(pl.len(), dtype=pl.Int64)).explode(self.row_columns)
        except POLARS_ERRORS as e:
            self._ignore(f"an unexpected table: {type(e).__name__}")
            return None
        base = self.top if self.top.endswith(os.sep) else self.top + os.sep
        blocks = blocks.with_columns(run_dir=pl.when(pl.col("rel") == "")
                                     .then(pl.lit(self.top))
                                     .otherwise(pl.lit(base) + pl.col("rel")))
        taken = blocks["at"].unique(maintain_order=True).to_list()
        return Frame(rows, blocks.select(list(BLOCK_SCHEMA)).with_columns(
            at=blocks["at"])), taken

    def save(self, frame: Frame, rels: dict[str, str],
             keys: dict[str, tuple[int, int, int] | None]) -> None:
        """Write the blocks of runs with a settled file key (`keys`, `rels`: by run_dir)
        and their rows; errors are only logged."""
        settled = time.time_ns() - SETTLE_NS
        cached = {d for d, k in keys.items() if k is not None and k[1] < settled}
        frame = subset(frame, frame.blocks["run_dir"].is_in(list(cached)))
        run_dirs = frame.blocks["run_dir"].to_list()
        blocks = frame.blocks.with_columns(
            rel=pl.Series([rels[d] for d in run_dirs], dtype=pl.String),
            **{c: pl.Series([keys[d][i] for d in run_dirs], dtype=pl.Int64)  # type: ignore[index]
               for i, c in enumerate(KEY_COLUMNS)})
        lists = frame.rows.group_by("block", maintain_order=True).agg(pl.exclude("block"))
        table = pl.concat([blocks.select(*(c for c in BLOCK_SCHEMA if c != "run_dir"), "rel",
                                         *KEY_COLUMNS), lists.drop("block")], how="horizontal")
        buffer = io.BytesIO()
        try:
            table.write_parquet(buffer, compression="lz4",
                                metadata={"format": FORMAT, "polars": pl.__version__,
                                          "checksum": (DIGEST_MARK + _UNSET).decode()})
            sealed = _sealed(buffer.getvalue())
            if sealed is None:
                return
            with PinnedDir.open(self.top, follow=True) as folder:
                folder.write_bytes(CACHE_FILE, sealed)
        except OSError as e:
            logger.debug(f"could not write the records cache {self.path}: {e}")

