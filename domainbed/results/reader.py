"""Reading the results.jsonl files of a sweep into one polars table.

The fast reader reads files in threads, joins a batch of them and parses it with
``polars.read_ndjson`` and a schema of the first lines' keys; each file's ``args`` and
``hparams`` are parsed once, with ``json``, from its first line, and byte counts over the
batch prove that polars read what json reads (`_batch_fits`). Any file it cannot read
exactly (a bad line, other types, a lone surrogate, an odd number literal, a FIFO, a line
over ``MAX_LINE_BYTES``) goes to the line reader: each line parsed by ``json`` and held to
``domainbed.results.schema``; a bad line is skipped with one note naming file and line.

A `Frame`: ``rows``, one per record (``block``, ``step``, ``epoch``, ``n_envs``, the
``env*`` values as floats), and ``blocks``, one per stretch of records of one run sharing
their args and hparams (their JSON text, and the args the tables group by as columns).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from domainbed.results.grouping import DATA_KEYS
from domainbed.results.schema import record_problem
from oodutils.untrusted import parse_json, read_head_stat, read_lines

Record = dict[str, Any]
RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
MAX_LINE_BYTES = 4 << 20     # a record is a few kB; a longer line is skipped, never held
FAST_FILE_BYTES = 16 << 20   # a larger results.jsonl is read line by line
THREADS = min(8, (os.cpu_count() or 1) + 2)
MAX_DEPTH_EXTRA = 31         # see `_batch_fits`: brackets beyond args and hparams

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
# bytes mapped to a shape: digits, ".", "+" and "-" to "0", "e" and "E" to "e", "{" and
# "[" to "(", others to a space; a run of 25 "0" or an "e" and five more is a literal
# polars might read otherwise than json (long mantissas, huge exponents): line by line
_SHAPE = bytes(48 if (48 <= b <= 57 or b in b".+-") else 101 if b in b"eE" else
               40 if b in b"{[" else 32 for b in range(256))
_ODD_NUMBERS = (b"0" * 25, b"e00000", b"(")


@dataclass
class Frame:
    """The records of some runs as two polars tables (module docstring)."""
    rows: pl.DataFrame
    blocks: pl.DataFrame


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

@dataclass
class _Head:
    """What the first line of a file gives the fast reader."""
    lines: int
    record: Record
    args_bytes: bytes        # the args and hparams as the line spells them
    hparams_bytes: bytes
    args_pattern: bytes      # b'"args": {...}' as the line spells it
    hparams_pattern: bytes
    keys: list[str]          # the first line's keys but args and hparams


_COLON = re.compile(r"\s*:\s*")
_DECODER = json.JSONDecoder()


def _value_span(text: str, key: str, outside: tuple[int, int] = (0, 0)
                ) -> tuple[int, int, int, Any] | None:
    """(token start, value start, value end, value) of the one ``"key":`` of `text`
    outside the span `outside`, or None where there is not exactly one."""
    token = f'"{key}"'
    inside = text.count(token, outside[0], outside[1])
    if text.count(token) - inside != 1:
        return None
    at = text.find(token)
    if outside[0] <= at < outside[1]:
        at = text.find(token, outside[1])
    colon = _COLON.match(text, at + len(token))
    if colon is None:
        return None
    try:
        value, end = _DECODER.raw_decode(text, colon.end())
    except (ValueError, RecursionError):
        return None
    return at, colon.end(), end, value


def _head(data: bytes) -> _Head | None:
    """The first line's record and the spelling of its args and hparams (each parsed
    once: the rest of the line with stand-ins), or None where the file is not for the
    fast reader (see the module docstring)."""
    if not data.startswith(b"{"):
        return None
    end = data.find(b"\n")
    try:
        text = (data if end < 0 else data[:end]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    args = _value_span(text, "args")
    hparams = _value_span(text, "hparams", args[1:3]) if args else None
    if args is None or hparams is None or type(args[3]) is not dict or \
            type(hparams[3]) is not dict:
        return None
    (a0, a1), (h0, h1) = sorted([args[1:3], hparams[1:3]])
    record = parse_json(text[:a0] + "0" + text[a1:h0] + "0" + text[h1:])
    if not isinstance(record, dict):
        return None
    record["args"], record["hparams"] = args[3], hparams[3]
    if record_problem(record) is not None:
        return None
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if len(data) > MAX_LINE_BYTES and max(map(len, data.split(b"\n"))) >= MAX_LINE_BYTES:
        return None
    keys = [k for k in record if k not in ("args", "hparams")]
    if any(type(record[k]) not in _POLARS_TYPES for k in keys):
        return None
    a, h = (text[v[1]:v[2]].encode() for v in (args, hparams))
    return _Head(lines, record, a, h, text[args[0]:args[1]].encode() + a,
                 text[hparams[0]:hparams[1]].encode() + h, keys)


_POLARS_TYPES = {int: pl.Float64, float: pl.Float64, str: pl.String, bool: pl.Boolean}


def _schema(heads: Sequence[_Head]) -> dict[str, Any]:
    """Every key of the files' first lines: step an int, the env* and epoch values
    floats, the others typed by their first value (they are not kept)."""
    schema: dict[str, Any] = {"args": pl.Struct({"dataset": pl.String}),
                              "hparams": pl.Struct({"_": pl.String})}
    for h in heads:
        for key in h.keys:
            if key not in schema:
                schema[key] = pl.Int64 if key == "step" else pl.Float64 \
                    if key.startswith("env") or key == "epoch" else \
                    _POLARS_TYPES[type(h.record[key])]
    return schema


def _shared_counts(heads: Sequence[_Head], tokens: Sequence[bytes], shaped: bool = False
                   ) -> list[int]:
    """For each token: how often the files' args and hparams hold it (as `_SHAPE` maps
    them where `shaped`), times their lines."""
    by_lines: dict[int, list[bytes]] = {}
    for h in heads:
        by_lines.setdefault(h.lines, []).extend((h.args_bytes, h.hparams_bytes))
    joined = {n: b"\0".join(parts).translate(_SHAPE if shaped else None)
              for n, parts in by_lines.items()}
    return [sum(n * text.count(token) for n, text in joined.items()) for token in tokens]


def _batch_fits(data: bytes, heads: Sequence[_Head], parsing: Future[Any]) -> bool:
    """Whether the polars table of these files' joined bytes is what json reads line by
    line. Each count below is a sum over lines of a per-line count that is at least what
    is asked, so an equal sum makes each line's equal: every line has one top-level
    ``args`` and ``hparams`` spelled as its file's first line spells them (no other such
    token), and beyond them only keys of the schema, each once, none null (json keeps the
    last of twins, polars the first; a null goes line by line), at most MAX_DEPTH_EXTRA
    brackets beyond its args and hparams (so no line nests deeper than the first lines,
    which the schema checked), and number literals of an odd shape only inside args and
    hparams (parsed by json). Each file's args and hparams are then counted in its own
    bytes (`_file_fits`). Bytes are counted while polars parses them (`parsing`)."""
    rows = sum(h.lines for h in heads)
    tokens = [b'args"', b'hparams"', b":"]   # (one-byte or rare first bytes: fast scans)
    found = [data.count(t) - s for t, s in zip(tokens, _shared_counts(heads, tokens))]
    shape = data.translate(_SHAPE)       # odd numbers, then brackets ("(")
    odd = [shape.count(s) - n for s, n in zip(_ODD_NUMBERS,
                                              _shared_counts(heads, _ODD_NUMBERS, True))]
    table = parsing.result()
    if table is None or table.height != rows or odd[:2] != [0, 0] or \
            odd[2] - rows > MAX_DEPTH_EXTRA:
        return False
    nonnull = sum(rows - table[k].null_count() for k in table.columns)
    return found == [rows, rows, nonnull] and not (table["args"].null_count() or table[
        "hparams"].null_count() or table["step"].null_count()) and table["step"].min() >= 0


def _file_fits(data: bytes, head: _Head) -> bool:
    """Every line of the file holds its first line's args and hparams: ``"args": `` (one a
    line, by the batch's counts) and the args as often as there are lines, as ``"hparams": ``
    and the hparams (the others in the args). Two such never overlap (a key token has no
    border, a value ends with "}") unless the value holds the key token: refused."""
    for pattern, value in ((head.args_pattern, head.args_bytes),
                           (head.hparams_pattern, head.hparams_bytes)):
        if pattern[:len(pattern) - len(value)] in value or data.count(pattern) != head.lines:
            return False
    inside = head.args_bytes.split(head.hparams_pattern[:-len(head.hparams_bytes)])
    return not any(p.startswith(head.hparams_bytes) for p in inside[1:])


def _quick_refusal(data: bytes) -> bool:
    """Whether bytes hold a surrogate escape (polars reads it otherwise than json)."""
    return b"\\" in data and b"\\u" in data and _SURROGATE.search(data) is not None


def _parse(data: bytes, schema: dict[str, Any]) -> pl.DataFrame | None:
    try:
        return pl.read_ndjson(data, schema=schema)
    except Exception:  # noqa: BLE001 - polars' errors: any is a "not here"
        return None


def _fast_rows(files: Sequence[tuple[int, bytes, _Head]], parser: ThreadPoolExecutor
               ) -> tuple[pl.DataFrame, list[int]]:
    """(rows of the files the fast reader reads, the indices of `files` it leaves)."""
    if not files:
        return pl.DataFrame(), []
    joined = b"".join(d if d.endswith(b"\n") else d + b"\n" for _, d, _ in files)
    heads = [h for _, _, h in files]
    parsing = None if _quick_refusal(joined) else parser.submit(_parse, joined, _schema(heads))
    if parsing and _batch_fits(joined, heads, parsing) and \
            all(_file_fits(data, h) for _, data, h in files):
        return _with_blocks(parsing.result(), files), []   # type: ignore[arg-type]
    if len(files) == 1:
        return pl.DataFrame(), [0]
    step = -(-len(files) // 8)   # some file does not fit: eighths of the batch, until found
    tables, left = [], []
    for start in range(0, len(files), step):
        table, missed = _fast_rows(files[start:start + step], parser)
        tables += [table] if table.width else []
        left += [start + i for i in missed]
    return pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame(), left


def _with_blocks(table: pl.DataFrame, files: Sequence[tuple[int, bytes, _Head]]
                 ) -> pl.DataFrame:
    """The table with each row's file index (in the batch) as its ``block``."""
    blocks = pl.Series("block", [b for b, _, _ in files], dtype=pl.Int64)
    lines = pl.Series([h.lines for _, _, h in files], dtype=pl.Int64)
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
    file and appends its record dicts there too."""
    paths = [os.path.join(d, RESULTS_FILE) for d in run_dirs]
    reads: list[FileRead] = []
    step = 1024
    with ThreadPoolExecutor(THREADS) as pool:
        pending = None
        for start in range(0, len(paths) + step, step):
            batch = paths[start:start + step]
            future = pool.map(lambda part: list(map(read_file, part)), [  # 64 files a task
                batch[i:i + 64] for i in range(0, len(batch), 64)]) if batch else None
            if pending is not None:
                reads += _read_batch(pending[0], pending[1], sum(pending[2], []), into,
                                     fields, full)
            pending = (run_dirs[start:start + step], positions[start:start + step],
                       future) if future is not None else None
    return reads


def _read_batch(run_dirs: Sequence[str], positions: Sequence[int],
                reads: list[tuple[Any, Any, Any]], into: Assembler,
                fields: Sequence[str] | None, full: list[Record] | None) -> list[FileRead]:
    results: list[FileRead] = []
    line_frames: dict[int, Frame] = {}
    fast: list[tuple[int, bytes, _Head]] = []
    for i, (run_dir, (data, st, error)) in enumerate(zip(run_dirs, reads)):
        key = None if st is None else (st.st_size, st.st_mtime_ns, st.st_ino)
        results.append(FileRead(run_dir, key, error))
        if error is not None:
            continue
        head = _head(data) if full is None and len(data) <= FAST_FILE_BYTES else None
        if head is None:
            line_frames[i] = _line_read(results[i], data, fields, full)
        else:
            fast.append((i, data, head))
    with ThreadPoolExecutor(1) as parser:
        table, left = _fast_rows(fast, parser)
    for j in left:
        i, data, _ = fast[j]
        line_frames[i] = _line_read(results[i], data, fields, full)
    refused = {fast[j][0] for j in left}
    read_fast = [(i, h) for i, _, h in fast if i not in refused]
    if read_fast:
        blocks = pl.DataFrame([block_row(run_dirs[i], h.record["args"], h.record["hparams"],
                                         h.args_bytes.decode(), h.hparams_bytes.decode())
                               for i, h in read_fast], schema=BLOCK_SCHEMA)
        number = {i: n for n, (i, _) in enumerate(read_fast)}
        rows = table.filter(pl.col("block").is_in(list(number))) if refused else table
        rows = _add_env_counts(rows.with_columns(block=pl.col("block").replace_strict(
            number, return_dtype=pl.Int64)), blocks)
        into.add(Frame(rows, blocks), [positions[i] for i, _ in read_fast])
    for i, frame in line_frames.items():
        into.add(frame, [positions[i]] * frame.blocks.height)
    return results


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
