"""The fast reader: polars parses a batch of results.jsonl files; counts over each file's
bytes prove it read what json reads line by line (`fast_rows`), or the file goes back.

A file is for it (`fast_file`) where it is ASCII without backslash or CR (no escape:
polars' strings are json's) and its first line opens with a flat args object and holds a
flat hparams object (sorted keys, as DomainBed and this project write), both parsed by
json once. The counts prove every line opens with those args and holds those hparams, no
other ``"hparams"`` or ``"args"``; every bracket is theirs (no other value nests); each
``"step"``, ``"epoch"`` and ``"env...`` string is a key polars read a value of (none
doubled, null or unknown); no number has an exponent of 4 digits (polars wraps those).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import polars as pl

from domainbed.results.grouping import hparams_key_text
from domainbed.results.schema import MAX_DEPTH, MAX_ENVS, args_problem, env_index
from oodutils.untrusted import parse_json

# what polars raises on bytes it cannot read: its errors, a panic (a BaseException)
POLARS_ERRORS = (Exception, pl.exceptions.PanicException)
# hparams, for polars: null where a line has none, an error where it is no object
BASE_SCHEMA = {"hparams": pl.Struct({"": pl.Null}), "step": pl.Int64, "epoch": pl.Float64}
MAX_SCHEMA_KEYS = 1024
# once a line beyond the args' and hparams' own (a key however spaced, or a string)
_ONCE, _TOKENS = ('"hparams"', '"args"', r"[\[{]"), ('"step"', '"epoch"', '"env')
_EXPONENT = r"[eE][-+]?[0-9][0-9][0-9][0-9]"   # (fixed patterns as regexes: faster)
_LONG_EXPONENT = r"[:,\[][ \t]*-?[0-9]+(?:\.[0-9]+)?" + _EXPONENT   # in a number
# {hparams text: its hparams_key_text, None where no object}: runs share a few settings
HparamsMemo = dict[str, "str | None"]


class FastFile(NamedTuple):
    """A file for the fast reader: its first line's args (as json reads them) and args and
    hparams (as it spells them); its lines after the first opening with those args
    (`prefixed`), those hparams as its ``"hparams": `` keys' values (`spans`)."""
    args: dict[str, Any]
    args_text: str
    hparams_text: str
    hparams_key: str
    data: bytes
    prefixed: int
    spans: int


def _flat_object_end(data: bytes, start: int) -> int:
    """The end of the object opening at `start` where it holds no other one, else -1."""
    end = data.find(b"}", start) + 1
    return end if end and data.find(b"{", start + 1, end) < 0 else -1


def fast_file(data: bytes, memo: HparamsMemo, max_line: int) -> FastFile | None:
    """The file for the fast reader (module docstring), or None; no line over
    `max_line` bytes, args that fit the schema."""
    if not data.startswith(b'{"args": {') or b"\\" in data or b"\r" in data or \
            not data.isascii():
        return None
    args_end = _flat_object_end(data, 9)
    line_end = data.find(b"\n") % (len(data) + 1)
    at = data.find(b'"hparams": {', args_end, line_end) if args_end > 0 else -1
    end = _flat_object_end(data, at + 11) if at > 0 else -1
    if end < 0 or end > line_end or data[args_end:args_end + 2] != b", " or \
            len(data) >= max_line and max(map(len, data.split(b"\n"))) >= max_line:
        return None
    args_text, hparams_text = data[9:args_end].decode(), data[at + 11:end].decode()
    if hparams_text not in memo:
        hparams = parse_json(hparams_text)
        memo[hparams_text] = hparams_key_text(hparams) if type(hparams) is dict else None
    key, args = memo[hparams_text], parse_json(args_text)
    if key is None or type(args) is not dict or args_problem(args):
        return None
    return FastFile(args, args_text, hparams_text, key, data,
                    data.count(b"\n" + data[:args_end + 2]), data.count(data[at:end]))


def _learn_keys(schema: dict[str, Any], files: Iterable[FastFile]) -> bool:
    """Whether `schema` gained an ``env*`` key holding a number in the files' first line."""
    size = len(schema)
    for f in files:
        record = parse_json(f.data[:f.data.find(b"\n") % (len(f.data) + 1)])
        schema.update((k, pl.Float64) for k, v in (record or {}).items()
                      if k.startswith("env") and type(v) in (int, float) and k not in schema
                      and len(schema) < MAX_SCHEMA_KEYS)
    return len(schema) > size


def _file_checks(files: Sequence[FastFile], texts: pl.Series) -> pl.DataFrame:
    """Per file: ``lines``, ``ok`` (the proofs on its bytes alone) and ``tokens`` (its
    `_TOKENS` beyond its args' and hparams'). Each count is a column of its own: polars
    computes them in parallel."""
    text, args, hparams = pl.col("text"), pl.col("args_text"), pl.col("hparams_text")
    table = pl.DataFrame({"text": texts, **{k: [getattr(f, k) for f in files] for k in (
        "args_text", "hparams_text", "prefixed", "spans")}})
    patterns = (*_ONCE, *_TOKENS)
    counts = table.select(
        "prefixed", "spans", lines=text.str.count_matches("\n"),
        **{f"text{i}": text.str.count_matches(p) for i, p in enumerate(patterns)},
        **{f"spans{i}": args.str.count_matches(p) + hparams.str.count_matches(p)
           for i, p in enumerate(patterns)},
        exponent=text.str.contains(_EXPONENT))
    flagged = counts["exponent"]
    if flagged.any():   # (often a hex digest in a string): is it a number's?
        long = table.filter(flagged).select(text.str.contains(_LONG_EXPONENT))["text"]
        counts = counts.with_columns(exponent=flagged.scatter(flagged.arg_true(), long))
    lines = pl.col("lines").cast(pl.Int64)
    beyond = [pl.col(f"text{i}") - lines * pl.col(f"spans{i}") for i in range(len(patterns))]
    return counts.select(
        lines, ok=(pl.col("prefixed") == lines - 1) & (pl.col("spans") == lines)
        & pl.all_horizontal(n == lines for n in beyond[:len(_ONCE)]) & ~pl.col("exponent")
        & (pl.col(f"spans{len(_ONCE) - 1}") < MAX_DEPTH - 1),   # (brackets: the depth)
        tokens=pl.sum_horizontal(beyond[len(_ONCE):]))


def _fits(table: pl.DataFrame, files: Sequence[FastFile], texts: pl.Series
          ) -> tuple[list[bool], pl.Series] | None:
    """(whether polars' rows of each file are what json reads, its lines), None where rows
    and lines differ. A row also holds hparams, a step >= 0, no env value beyond its file's."""
    checks = _file_checks(files, texts)
    if table.height != checks["lines"].sum():
        return None
    limits = pl.Series([len(f.args.get("env_names") or ()) or MAX_ENVS for f in files])
    values = [c for c in table.columns if c != "hparams"]
    file = pl.int_range(len(files), dtype=pl.Int64, eager=True).repeat_by(
        checks["lines"]).explode()
    beyond = [pl.col(c).is_not_null() & (pl.col("limit") <= env_index(c))
              for c in values if env_index(c) is not None]
    rows = table.with_columns(file=file, limit=limits.gather(file)).group_by(
        "file", maintain_order=True).agg(   # (every file has a line)
        tokens=pl.sum_horizontal(pl.col(c).is_not_null() for c in values).sum(),
        ok=(pl.col("hparams").is_not_null() & (pl.col("step") >= 0).fill_null(False)
            & ~pl.any_horizontal(False, *beyond)).all())
    fits = checks["ok"] & rows["ok"] & (checks["tokens"] == rows["tokens"])
    return fits.to_list(), checks["lines"]


def fast_rows(files: Sequence[tuple[int, FastFile]], schema: dict[str, Any]
              ) -> tuple[pl.DataFrame, list[int]]:
    """(the rows (``step``, ``epoch``, ``env*``, its index in the batch as ``block``) of the
    files it reads, the indices in `files` of the others); `schema` learns missing env keys."""
    table, left = _rows(files, schema)
    if left and _learn_keys(schema, (files[i][1] for i in left)):
        again, still = _rows([files[i] for i in left], schema)
        table, left = pl.concat([table, again], how="diagonal_relaxed"), [left[i] for i in still]
    return table, left


def _rows(files: Sequence[tuple[int, FastFile]], schema: dict[str, Any]
          ) -> tuple[pl.DataFrame, list[int]]:
    datas = [f.data if f.data.endswith(b"\n") else f.data + b"\n" for _, f in files]
    try:
        table = pl.read_ndjson(b"".join(datas), schema=schema) if files else None
    except POLARS_ERRORS:  # any is a "not here"
        table = None
    checked = None if table is None else _fits(table, [f for _, f in files], pl.Series(
        datas, dtype=pl.Binary).cast(pl.String))   # (ASCII)
    if table is not None and checked is not None:
        fits, lines = checked
        blocks = pl.Series("block", [b for b, _ in files]).repeat_by(lines).explode()
        kept = [b for (b, _), fit in zip(files, fits) if fit]
        return table.drop("hparams").with_columns(block=blocks).filter(
            pl.col("block").is_in(kept)), [i for i, fit in enumerate(fits) if not fit]
    if len(files) <= 1:
        return pl.DataFrame(), list(range(len(files)))
    step = -(-len(files) // 8)   # polars refused the batch: eighths of it, until found
    parts = [(start, *_rows(files[start:start + step], schema))
             for start in range(0, len(files), step)]
    tables = [table for _, table, _ in parts if table.width]
    return pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame(), \
        [start + i for start, _, missed in parts for i in missed]
