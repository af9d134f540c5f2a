"""Reading the results.jsonl files of a sweep into one polars table: threads read the
files, the fast reader (``domainbed.results.fast_reader``) takes each file it can prove
it reads as json does, the line reader the others (each line parsed by ``json`` and held
to ``domainbed.results.schema``; a bad line is skipped with one note).

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

from domainbed.results.fast_reader import BASE_SCHEMA, FastFile, HparamsMemo, fast_file, fast_rows
from domainbed.results.grouping import DATA_KEYS, hparams_key_text, num_envs
from domainbed.results.schema import record_problem
from oodutils.untrusted import parse_json, read_head_stat, read_lines

Record = dict[str, Any]
RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
MAX_LINE_BYTES = 4 << 20     # a record is a few kB; a longer line is skipped, never held
FAST_FILE_BYTES = 16 << 20   # a larger results.jsonl is read line by line
THREADS = min(8, os.cpu_count() or 1)   # (more readers than cores only contend)

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


_NO_DATA, _NO_DATA_KEY = [None] * len(DATA_KEYS), json.dumps([None] * len(DATA_KEYS))


SCALAR_COLUMNS = tuple(c for c in BLOCK_SCHEMA if c not in ("test_envs", "env_names"))


def block_row(run_dir: str | None, args: dict[str, Any], args_text: str,
              hparams_text: str | None, hparams_key: str) -> tuple[Any, ...]:
    """The blocks table's SCALAR_COLUMNS of one run's args and hparams (`hparams_key`:
    their hparams_key_text); its lists come from the args text (`blocks_table`)."""
    seed = args.get("hparams_seed")
    data = [args.get(k) for k in DATA_KEYS]
    return (run_dir, args_text, hparams_text, args.get("dataset"), args.get("algorithm"),
            _int_or_none(args.get("trial_seed")), _int_or_none(seed), str(seed),
            _NO_DATA_KEY if data == _NO_DATA else json.dumps(data),
            str(args.get("arithmetic") or "single"), hparams_key)


_LISTS = pl.Struct({k: BLOCK_SCHEMA[k] for k in ("test_envs", "env_names")})


def blocks_table(blocks: Sequence[tuple[Any, ...]]) -> pl.DataFrame:
    """The blocks table of these block rows, their list columns decoded from the args
    text by polars (the schema held them to lists of ints and of strings)."""
    columns = list(zip(*blocks)) or [()] * len(SCALAR_COLUMNS)
    scalars = {name: pl.Series(values, dtype=BLOCK_SCHEMA[name])
               for name, values in zip(SCALAR_COLUMNS, columns)}
    try:
        lists = scalars["args_text"].str.json_decode(_LISTS).struct.unnest()
    except pl.exceptions.ComputeError:   # (json's NaN or Infinity in some args)
        lists = pl.DataFrame([{k: json.loads(t).get(k) for k in _LISTS.to_schema()}
                              for t in scalars["args_text"]], schema=_LISTS.to_schema())
    names = lists["env_names"]
    return pl.DataFrame({**scalars, "test_envs": lists["test_envs"].fill_null([]),
                         "env_names": names.set(names.list.len() == 0, None)}
                        ).select(list(BLOCK_SCHEMA))


def frame_from_records(records: Iterable[Record]) -> Frame:
    """The table of record dicts (each with its ``run_dir``), a block per stretch of
    records of one run with the same args and hparams."""
    blocks: list[tuple[Any, ...]] = []
    rows: dict[str, list[Any]] = {name: [] for name in ROW_SCHEMA}
    envs: list[dict[str, float]] = []
    last: tuple[Any, ...] = ()
    for record in records:
        args, hparams = record["args"], record.get("hparams")
        key = (record.get("run_dir"), id(args), id(hparams))
        if key != last:
            args_text = json.dumps(args)
            hparams_text = None if hparams is None else json.dumps(hparams)
            if not blocks or blocks[-1][:3] != (record.get("run_dir"), args_text,
                                                 hparams_text):
                blocks.append(block_row(record.get("run_dir"), args, args_text,
                                        hparams_text, hparams_key_text(hparams)))
            last = key
        epoch = record.get("epoch")
        rows["block"].append(len(blocks) - 1)
        rows["step"].append(_int_or_none(record.get("step")))
        rows["epoch"].append(float(epoch) if isinstance(epoch, (int, float)) else None)
        rows["n_envs"].append(num_envs(record))
        envs.append({k: float(v) for k, v in record.items() if k.startswith("env") and
                     isinstance(v, (int, float)) and not isinstance(v, bool)})
    names = dict.fromkeys(k for e in envs for k in e)
    columns = {k: [e.get(k) for e in envs] for k in names}
    frame = pl.DataFrame({**rows, **columns},
                         schema={**ROW_SCHEMA, **dict.fromkeys(names, pl.Float64)})
    return Frame(frame, blocks_table(blocks))


def parse_lines(path: str, lines: Iterable[bytes | None], notes: list[str]) -> list[Record]:
    """The records of one results.jsonl's lines (None: a line over the cap), each parsed
    by json and held to the schema; a skipped line adds a note naming it."""
    records: list[Record] = []
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
            notes.append(f"{path} line {number}: {problem}")
            continue
        records.append(clean_strings(record) if _SURROGATE.search(raw) else record)  # type: ignore[arg-type]
    return records


# -- reading the files ------------------------------------------------------------------

@dataclass
class FileRead:
    """One run's results.jsonl read: its (size, mtime_ns, inode) before the read (None:
    not to be cached), why it is unreadable, notes on the lines skipped; while its batch
    is read, its bytes and, where the fast reader may take it, its FastFile and block."""
    run_dir: str
    key: tuple[int, int, int] | None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    data: bytes | None = field(default=None, repr=False)
    fast: FastFile | None = field(default=None, repr=False)
    block: tuple[Any, ...] = field(default=(), repr=False)


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
    file and appends its record dicts there too. Threads read and check the files of the
    next batch while polars parses this one."""
    reads: list[FileRead] = []
    step = 1024
    memo: HparamsMemo | None = {} if full is None else None
    schema = dict(BASE_SCHEMA)

    def prepare(part: Sequence[str]) -> list[FileRead]:
        return [_prepare(d, memo) for d in part]

    with ThreadPoolExecutor(THREADS) as pool:
        pending = None
        for start in range(0, len(run_dirs) + step, step):
            batch = run_dirs[start:start + step]
            future = pool.map(prepare, [batch[i:i + 64] for i in range(0, len(batch), 64)]
                              ) if batch else None
            if pending is not None:
                reads += _read_batch(pending[0], sum(pending[1], []), into, fields, full,
                                     schema)
            pending = (positions[start:start + step], future) if future is not None else None
    return reads


def _prepare(run_dir: str, fast: HparamsMemo | None) -> FileRead:
    """One file read, checked for the fast reader where `fast` (its memo) is given."""
    try:   # (up to FAST_FILE_BYTES + 1 bytes, the stat before the read)
        data, st = read_head_stat(os.path.join(run_dir, RESULTS_FILE), FAST_FILE_BYTES)
    except OSError as e:
        return FileRead(run_dir, None, e.strerror or str(e))
    read = FileRead(run_dir, (st.st_size, st.st_mtime_ns, st.st_ino), data=data)
    if fast is not None and len(data) <= FAST_FILE_BYTES:
        read.fast = f = fast_file(data, fast, MAX_LINE_BYTES)
        if f is not None:
            read.block = block_row(run_dir, f.args, f.args_text, f.hparams_text,
                                   f.hparams_key)
    return read


def _read_batch(positions: Sequence[int], files: list[FileRead], into: Assembler,
                fields: Sequence[str] | None, full: list[Record] | None,
                schema: dict[str, Any]) -> list[FileRead]:
    line_frames: dict[int, Frame] = {}
    fast = [(i, f.fast) for i, f in enumerate(files) if f.fast is not None]
    table, left = fast_rows(fast, schema)
    refused = {fast[j][0] for j in left}
    for i, f in enumerate(files):
        if f.error is None and (f.fast is None or i in refused):
            line_frames[i] = _line_read(f, fields, full)
    read_fast = [i for i, _ in fast if i not in refused]
    if read_fast:
        blocks = blocks_table([files[i].block for i in read_fast])
        number = {i: n for n, i in enumerate(read_fast)}   # (table: read_fast's rows)
        rows = _add_env_counts(table.with_columns(block=pl.col("block").replace_strict(
            number, return_dtype=pl.Int64)), blocks)
        into.add(Frame(rows, blocks), [positions[i] for i in read_fast])
    for i, frame in line_frames.items():
        into.add(frame, [positions[i]] * frame.blocks.height)
    for f in files:
        f.data, f.fast, f.block = None, None, ()
    return files


def _add_env_counts(rows: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """The rows with ``n_envs`` (num_envs of each record: the fast reader's rows hold no
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


def _line_read(result: FileRead, fields: Sequence[str] | None, full: list[Record] | None
               ) -> Frame:
    """One file by the line reader (its first bytes, read again line by line where it is
    larger than FAST_FILE_BYTES); a file with a skipped line is not cached."""
    path, data = os.path.join(result.run_dir, RESULTS_FILE), result.data
    try:
        lines: Iterable[bytes | None] = (
            data.splitlines(keepends=True) if data is not None and b"\r" not in data and
            len(data) <= FAST_FILE_BYTES
            else list(read_lines(path, MAX_LINE_BYTES)))
        lines = [line if line is None or len(line) <= MAX_LINE_BYTES else None
                 for line in lines]
        records = parse_lines(path, lines, result.notes)
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
