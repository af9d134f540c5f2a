"""Reading the results.jsonl files of a sweep into one polars table.

The fast reader reads files in threads; each file's ``args`` and ``hparams`` are parsed
once, by ``json``, from its first line and stubbed out of every line (`reduce_file`), and
polars parses the rest of a batch of files, byte counts proving it read what json reads
(`_batch_fits`). Any other file (a bad line, other types, a lone surrogate, an odd number
literal, a FIFO, a line over ``MAX_LINE_BYTES``) goes to the line reader: each line parsed
by ``json`` and held to ``domainbed.results.schema``; a bad line is skipped with one note.

A `Frame`: ``rows``, one per record (``block``, ``step``, ``epoch``, ``n_envs``, the
``env*`` values as floats), and ``blocks``, one per stretch of records of one run sharing
their args and hparams (their JSON text, and the args the tables group by as columns).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from domainbed.results.grouping import DATA_KEYS
from domainbed.results.schema import MAX_ENVS, env_index, record_problem
from oodutils.untrusted import parse_json, read_head_stat, read_lines

Record = dict[str, Any]
RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
MAX_LINE_BYTES = 4 << 20     # a record is a few kB; a longer line is skipped, never held
FAST_FILE_BYTES = 16 << 20   # a larger results.jsonl is read line by line
THREADS = min(8, (os.cpu_count() or 1) + 2)

BLOCK_SCHEMA: dict[str, Any] = {
    "run_dir": pl.String, "args_text": pl.String, "hparams_text": pl.String,
    "dataset": pl.String, "algorithm": pl.String, "test_envs": pl.List(pl.Int64),
    "trial_seed": pl.Int64, "hparams_seed": pl.Int64, "hparams_seed_text": pl.String,
    "env_names": pl.List(pl.String),
    "data_key": pl.String, "arithmetic": pl.String, "hparams_key": pl.String,
}
ROW_SCHEMA: dict[str, Any] = {"block": pl.Int64, "step": pl.Int64, "epoch": pl.Float64,
                              "n_envs": pl.Int64}
# a lone surrogate escape (or half of a pair: read line by line, replaced there)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# what polars raises on bytes it cannot read: its errors, and a panic of its Rust code
# (a BaseException) on some corrupt input
POLARS_ERRORS = (Exception, pl.exceptions.PanicException)
# bytes mapped to a shape: digits to "0", "+" and "-" to "s", "e" and "E" to "e", others
# to a space; an "e", a sign or none, and four digits open an exponent of 4 digits or more
_SHAPE = bytes(48 if 48 <= b <= 57 else 115 if b in b"+-" else 101 if b in b"eE" else 32
               for b in range(256))
_LONG_EXPONENTS = (b"e0000", b"es0000")


@dataclass
class Frame:
    """The records of some runs as two polars tables (module docstring); `memo` holds
    what model selection derives from them once for every method."""
    rows: pl.DataFrame
    blocks: pl.DataFrame
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


def subset(frame: Frame, keep: pl.Series) -> Frame:
    """The blocks where `keep` (one bool per block) holds, and their rows."""
    number = keep.cast(pl.Int64).cum_sum() - 1
    rows = frame.rows.filter(keep.gather(frame.rows["block"]))
    rows = rows.with_columns(block=number.gather(rows["block"]))
    return Frame(rows, frame.blocks.filter(keep))


def clean_strings(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (and keys) replaced by U+FFFD: what
    json reads from ``\\ud800`` cannot be written as UTF-8, nor held by polars."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [clean_strings(v) for v in value]
    if isinstance(value, dict):
        return {clean_strings(k): clean_strings(v) for k, v in value.items()}
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def block_row(run_dir: str | None, args: dict[str, Any], hparams: Any, args_text: str,
              hparams_text: str | None) -> dict[str, Any]:
    """The blocks table's row of one run's args and hparams."""
    names = args.get("env_names")
    seed = args.get("hparams_seed")
    return {
        "run_dir": run_dir, "args_text": args_text, "hparams_text": hparams_text,
        "dataset": args.get("dataset"), "algorithm": args.get("algorithm"),
        "test_envs": list(args.get("test_envs") or []),
        "trial_seed": _int_or_none(args.get("trial_seed")),
        "hparams_seed": _int_or_none(seed), "hparams_seed_text": str(seed),
        "env_names": names if names else None,
        "data_key": json.dumps([args.get(k) for k in DATA_KEYS]),
        "arithmetic": str(args.get("arithmetic") or "single"),
        "hparams_key": json.dumps(hparams, sort_keys=True, default=str),
    }


def count_envs(record: Record) -> int:
    """DomainBed's num_envs: env_names' length, else env0_out_acc, env1_out_acc, ... ."""
    names = record["args"].get("env_names")
    if names:
        return len(names)
    i = 0
    while f"env{i}_out_acc" in record:
        i += 1
    return i


def frame_from_records(records: Iterable[Record]) -> Frame:
    """The table of record dicts (each with its ``run_dir``), a block per stretch of
    records of one run with the same args and hparams."""
    blocks: list[dict[str, Any]] = []
    rows: dict[str, list[Any]] = {name: [] for name in ROW_SCHEMA}
    env_values: dict[str, list[Any]] = {}
    last: tuple[Any, ...] = ()
    for n, record in enumerate(records):
        args, hparams = record["args"], record.get("hparams")
        key = (record.get("run_dir"), id(args), id(hparams))
        if key != last:
            args_text = json.dumps(args)
            hparams_text = None if hparams is None else json.dumps(hparams)
            previous = blocks[-1] if blocks else None
            if previous is None or (previous["run_dir"], previous["args_text"],
                                    previous["hparams_text"]) != \
                    (record.get("run_dir"), args_text, hparams_text):
                blocks.append(block_row(record.get("run_dir"), args, hparams,
                                        args_text, hparams_text))
            last = key
        rows["block"].append(len(blocks) - 1)
        rows["step"].append(_int_or_none(record.get("step")))
        epoch = record.get("epoch")
        rows["epoch"].append(float(epoch) if isinstance(epoch, (int, float)) else None)
        rows["n_envs"].append(count_envs(record))
        for name, value in record.items():
            if name.startswith("env") and isinstance(value, (int, float)) and \
                    not isinstance(value, bool):
                column = env_values.get(name)
                if column is None:
                    column = env_values[name] = [None] * n
                column.append(float(value))
        for column in env_values.values():
            if len(column) <= n:
                column.append(None)
    frame = pl.DataFrame({**rows, **env_values},
                         schema={**ROW_SCHEMA, **{k: pl.Float64 for k in env_values}})
    return Frame(frame, pl.DataFrame(blocks, schema=BLOCK_SCHEMA))


def parse_lines(path: str, lines: Iterable[bytes | None], notes: list[str]
                ) -> tuple[list[Record], int]:
    """(records, skipped) of one results.jsonl's lines (None: a line over the cap), each
    parsed by json and held to the schema; a skipped line adds a note naming it."""
    records: list[Record] = []
    skipped = 0
    for number, raw in enumerate(lines, start=1):
        if raw is not None and not raw.strip():
            continue
        record = None if raw is None else parse_json(raw)
        if raw is None:
            problem: str | None = f"longer than {MAX_LINE_BYTES} bytes"
        elif record is None:
            problem = "not JSON (corrupt, truncated or nested too deeply)"
        else:
            problem = record_problem(record)
        if problem is not None or raw is None:
            skipped += 1
            notes.append(f"{path} line {number}: {problem}")
            continue
        records.append(clean_strings(record) if _SURROGATE.search(raw) else record)  # type: ignore[arg-type]
    return records, skipped


# -- the fast reader ---------------------------------------------------------------------

ARGS_STUB, HPARAMS_STUB = b'"args": 0', b'"hparams": 0'


@dataclass
class _Reduced:
    """A file the fast reader takes: its first line as json reads it, its args and
    hparams as json spells them, and its bytes with every line's args and hparams replaced
    by a stub (`reduce_file`)."""
    lines: int
    record: Record
    args_text: str
    hparams_text: str
    data: bytes


_POLARS_TYPES = {int: pl.Float64, float: pl.Float64, str: pl.String, bool: pl.Boolean}


def _stubbed(data: bytes, key: bytes, text: str, stub: bytes, lines: int) -> bytes | None:
    """`data` with each ``"key": text`` replaced by `stub`, where there is one a line
    (by count: the bytes removed are `lines` spellings), else None."""
    spelled = key + text.encode()
    reduced = data.replace(spelled, stub)
    return reduced if len(data) - len(reduced) == lines * (len(spelled) - len(stub)) \
        else None


def reduce_file(data: bytes) -> _Reduced | None:
    """The file for the fast reader, or None where it is not for it: every line spells
    the first line's args and hparams as ``json.dumps`` does (what DomainBed and this
    project write), its other values are scalars, no backslash and no non-ASCII byte
    outside args and hparams, no line over MAX_LINE_BYTES (the line reader takes the
    rest). The batch's counts (`_batch_fits`) prove each line holds one of each."""
    end = data.find(b"\n")
    first = data if end < 0 else data[:end]
    if not first.startswith(b"{") or _SURROGATE.search(first):
        return None
    record = parse_json(first)
    if type(record) is not dict or type(record.get("args")) is not dict or \
            type(record.get("hparams")) is not dict or record_problem(record) is not None:
        return None
    if any(type(v) not in _POLARS_TYPES for k, v in record.items()
           if k not in ("args", "hparams")):
        return None
    if len(data) > MAX_LINE_BYTES and max(map(len, data.split(b"\n"))) >= MAX_LINE_BYTES:
        return None
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    args_text, hparams_text = json.dumps(record["args"]), json.dumps(record["hparams"])
    reduced = _stubbed(data, b'"args": ', args_text, ARGS_STUB, lines)
    reduced = reduced and _stubbed(reduced, b'"hparams": ', hparams_text, HPARAMS_STUB,
                                   lines)
    if not reduced or b"\\" in reduced or not reduced.isascii():
        return None
    return _Reduced(lines, record, args_text, hparams_text, reduced)


def _schema(files: Sequence[_Reduced]) -> dict[str, Any]:
    """Every key of the files' first lines: the stubs and step ints, the env* and epoch
    values floats, the others typed by their first value (they are not kept)."""
    schema: dict[str, Any] = {"args": pl.Int64, "hparams": pl.Int64}
    for f in files:
        for key, value in f.record.items():
            if key not in schema:
                schema[key] = pl.Int64 if key == "step" else pl.Float64 \
                    if key.startswith("env") or key == "epoch" else _POLARS_TYPES[type(value)]
    return schema


def _beyond_env_count(table: pl.DataFrame, files: Sequence[_Reduced]) -> bool:
    """Whether a row holds an ``env<i>_...acc...`` value with i at or beyond its file's
    environment count (a key of another file's first line: the schema refuses it)."""
    limits = pl.Series([len(f.record["args"].get("env_names") or ()) or MAX_ENVS
                        for f in files], dtype=pl.Int64)
    limit = limits.repeat_by(pl.Series([f.lines for f in files])).explode()
    return any((table[key].is_not_null() & (limit <= env)).any()
               for key in table.columns if (env := env_index(key)) is not None)


def _batch_fits(data: bytes, files: Sequence[_Reduced], table: pl.DataFrame | None
                ) -> bool:
    """Whether `table` (polars' read of these reduced files' joined bytes) is what json
    reads line by line. Each count below is a sum over lines of a per-line count at least
    what is asked, so an equal sum makes each line's equal: every line has exactly the
    schema's keys it has values for, each once and not null (the colons; json keeps the
    last of twins, polars the first), no nested value (one bracket a line; json's depth
    limit cannot differ), and where a number literal has an exponent (an "e" beyond the
    keys', true's, false's and the strings'), none of 4 digits or more (polars' number
    parser wraps long exponents)."""
    rows = sum(f.lines for f in files)
    if table is None or table.height != rows or table["step"].null_count() or \
            table["args"].null_count() or table["hparams"].null_count() or \
            _beyond_env_count(table, files):
        return False
    nonnull = {k: rows - table[k].null_count() for k in table.columns}
    if data.count(b":") != sum(nonnull.values()) or \
            data.count(b"{") + data.count(b"[") != rows or (table["step"] < 0).any():
        return False
    letters = sum((k.count("e") + k.count("E")) * n for k, n in nonnull.items()) + sum(
        nonnull[k] if t == pl.Boolean else table[k].str.count_matches("[eE]").sum()
        for k, t in table.schema.items() if t in (pl.Boolean, pl.String))
    if data.count(b"e") + data.count(b"E") == letters:
        return True      # no number literal has an exponent
    shape = data.translate(_SHAPE)
    return not any(long in shape for long in _LONG_EXPONENTS)


def _parse(data: bytes, schema: dict[str, Any]) -> pl.DataFrame | None:
    try:
        return pl.read_ndjson(data, schema=schema)
    except POLARS_ERRORS:  # any is a "not here"
        return None


def _fast_rows(files: Sequence[tuple[int, _Reduced]]) -> tuple[pl.DataFrame, list[int]]:
    """(rows of the files the fast reader reads, the indices of `files` it leaves)."""
    if not files:
        return pl.DataFrame(), []
    joined = b"".join(f.data if f.data.endswith(b"\n") else f.data + b"\n"
                      for _, f in files)
    table = _parse(joined, _schema([f for _, f in files]))
    if _batch_fits(joined, [f for _, f in files], table):
        return _with_blocks(table, files), []   # type: ignore[arg-type]
    if len(files) == 1:
        return pl.DataFrame(), [0]
    step = -(-len(files) // 8)   # some file does not fit: eighths of the batch, until found
    tables, left = [], []
    for start in range(0, len(files), step):
        part, missed = _fast_rows(files[start:start + step])
        tables += [part] if part.width else []
        left += [start + i for i in missed]
    return pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame(), left


def _with_blocks(table: pl.DataFrame, files: Sequence[tuple[int, _Reduced]]
                 ) -> pl.DataFrame:
    """The table with each row's file index (in the batch) as its ``block``."""
    blocks = pl.Series("block", [b for b, _ in files], dtype=pl.Int64)
    lines = pl.Series([f.lines for _, f in files], dtype=pl.Int64)
    kept = [c for c in table.columns if c in ("step", "epoch") or c.startswith("env")]
    return table.select(kept).with_columns(block=blocks.repeat_by(lines).explode())


# -- reading the files ------------------------------------------------------------------

def read_file(path: str) -> tuple[bytes | None, os.stat_result | None, str | None]:
    """(up to FAST_FILE_BYTES + 1 bytes, the stat before the read, None), or (None, None,
    why the file cannot be read)."""
    try:
        data, st = read_head_stat(path, FAST_FILE_BYTES)
    except OSError as e:
        return None, None, e.strerror or str(e)
    return data, st, None


@dataclass
class FileRead:
    """One run's results.jsonl read: its (size, mtime_ns, inode) before the read (None:
    not to be cached), why it is unreadable, notes on the lines skipped."""
    run_dir: str
    key: tuple[int, int, int] | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class Assembler:
    """Blocks and rows gathered run by run: each block gets the next number (``block``)
    and the walk position of its run (``run``); `frame` gives the table sorted by run."""

    def __init__(self) -> None:
        self.rows: list[pl.DataFrame] = []
        self.blocks: list[pl.DataFrame] = []
        self.count = 0

    def add(self, frame: Frame, runs: Sequence[int]) -> None:
        """Add a frame (blocks numbered from 0) whose blocks belong to these runs."""
        n = frame.blocks.height
        if not n:
            return
        self.blocks.append(frame.blocks.with_columns(
            run=pl.Series(runs, dtype=pl.Int64), uid=pl.int_range(n, dtype=pl.Int64)
            + self.count))
        self.rows.append(frame.rows.with_columns(pl.col("block") + self.count))
        self.count += n

    def frame(self) -> Frame:
        if not self.blocks:
            return frame_from_records([])
        blocks = pl.concat(self.blocks, how="diagonal_relaxed").sort(
            "run", "uid", maintain_order=True)
        order = blocks.select(block=pl.col("uid"), new=pl.int_range(pl.len(), dtype=pl.Int64))
        rows = pl.concat(self.rows, how="diagonal_relaxed")
        if not blocks["uid"].is_sorted():
            rows = rows.join(order, on="block", how="left", maintain_order="left") \
                .with_columns(block=pl.col("new")).drop("new") \
                .sort("block", maintain_order=True)
        return Frame(rows, blocks.drop("uid"))


def read_runs(run_dirs: Sequence[str], positions: Sequence[int], into: Assembler,
              fields: Sequence[str] | None, full: list[Record] | None = None
              ) -> list[FileRead]:
    """Read these runs (at these walk positions) into `into`: the fast reader where it
    can, the line reader elsewhere. `full`: every key kept, the line reader reads every
    file and appends its record dicts there too. Threads read and reduce the files of the
    next batch while polars parses this one."""
    reads: list[FileRead] = []
    step = 1024
    fast = full is None

    def prepare(part: Sequence[str]) -> list[_Prepared]:
        return [_prepare(d, fast) for d in part]

    with ThreadPoolExecutor(THREADS) as pool:
        pending = None
        for start in range(0, len(run_dirs) + step, step):
            batch = run_dirs[start:start + step]
            future = pool.map(prepare, [batch[i:i + 64] for i in range(0, len(batch), 64)]
                              ) if batch else None
            if pending is not None:
                reads += _read_batch(pending[0], sum(pending[1], []), into, fields, full)
            pending = (positions[start:start + step], future) if future is not None else None
    return reads


@dataclass
class _Prepared:
    """One file read (its bytes kept for the line reader), reduced where it fits."""
    read: FileRead
    data: bytes | None
    reduced: _Reduced | None = None
    block: dict[str, Any] | None = None


def _prepare(run_dir: str, fast: bool) -> _Prepared:
    data, st, error = read_file(os.path.join(run_dir, RESULTS_FILE))
    key = None if st is None else (st.st_size, st.st_mtime_ns, st.st_ino)
    prepared = _Prepared(FileRead(run_dir, key, error), data)
    if fast and data is not None and len(data) <= FAST_FILE_BYTES:
        reduced = reduce_file(data)
        if reduced is not None:
            prepared.reduced = reduced
            prepared.block = block_row(run_dir, reduced.record["args"],
                                       reduced.record["hparams"], reduced.args_text,
                                       reduced.hparams_text)
    return prepared


def _read_batch(positions: Sequence[int], files: list[_Prepared], into: Assembler,
                fields: Sequence[str] | None, full: list[Record] | None) -> list[FileRead]:
    line_frames: dict[int, Frame] = {}
    fast = [(i, f.reduced) for i, f in enumerate(files) if f.reduced is not None]
    table, left = _fast_rows(fast)
    refused = {fast[j][0] for j in left}
    for i, f in enumerate(files):
        if f.read.error is None and (f.reduced is None or i in refused):
            line_frames[i] = _line_read(f.read, f.data, fields, full)
    read_fast = [i for i, _ in fast if i not in refused]
    if read_fast:
        blocks = pl.DataFrame({name: pl.Series([files[i].block[name]  # type: ignore[index]
                                                for i in read_fast], dtype=dtype)
                               for name, dtype in BLOCK_SCHEMA.items()})
        number = {i: n for n, i in enumerate(read_fast)}
        rows = table.filter(pl.col("block").is_in(list(number))) if refused else table
        rows = _add_env_counts(rows.with_columns(block=pl.col("block").replace_strict(
            number, return_dtype=pl.Int64)), blocks)
        into.add(Frame(rows, blocks), [positions[i] for i in read_fast])
    for i, frame in line_frames.items():
        into.add(frame, [positions[i]] * frame.blocks.height)
    return [f.read for f in files]


def _add_env_counts(rows: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """The rows with ``n_envs`` (count_envs of each record: the fast reader's rows hold no
    null, so a value is a key) and an ``epoch`` column."""
    names = blocks["env_names"].list.len().fill_null(0).gather(rows["block"])
    count: Any = pl.lit(0, pl.Int64)
    alive: Any = pl.lit(True)
    i = 0
    while f"env{i}_out_acc" in rows.columns:
        alive = alive & pl.col(f"env{i}_out_acc").is_not_null()
        count = count + alive.cast(pl.Int64)
        i += 1
    if "epoch" not in rows.columns:
        rows = rows.with_columns(epoch=pl.lit(None, pl.Float64))
    return rows.with_columns(n_envs=pl.when(names > 0).then(names.cast(pl.Int64))
                             .otherwise(count))


def _line_read(result: FileRead, data: bytes | None, fields: Sequence[str] | None,
               full: list[Record] | None) -> Frame:
    """One file by the line reader (`data`: its first bytes, read again line by line
    where it is larger than FAST_FILE_BYTES); a file with a skipped line is not cached."""
    path = os.path.join(result.run_dir, RESULTS_FILE)
    try:
        lines: Iterable[bytes | None] = (
            data.splitlines(keepends=True) if data is not None and b"\r" not in data and
            len(data) <= FAST_FILE_BYTES
            else list(read_lines(path, MAX_LINE_BYTES)))
        lines = [line if line is None or len(line) <= MAX_LINE_BYTES else None
                 for line in lines]
        records, _ = parse_lines(path, lines, result.notes)
    except OSError as e:
        result.error, result.key = e.strerror or str(e), None
        return frame_from_records([])
    for record in records:
        record["run_dir"] = result.run_dir
    if full is not None:
        full.extend(records)
    if result.notes:
        result.key = None
    return frame_from_records(records if fields is None else (
        {k: v for k, v in r.items() if k in fields or k.startswith("env") or k == "run_dir"}
        for r in records))


# -- finding the runs -------------------------------------------------------------------
