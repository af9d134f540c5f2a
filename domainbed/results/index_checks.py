"""The checks a records index passes before anything in it is used (``record_index``):
each runs over whole arrays, per layout or per distinct key value, never per run, and
raises CorruptIndex naming what does not fit."""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from domainbed.results.columns import kind_of, numeric_block
from domainbed.results.run_keys import (
    ALGORITHM,
    DATA_KEY,
    DATASET,
    ENV_NAMES,
    HPARAMS_KEY,
    HPARAMS_SEED,
    KEY_FIELDS,
    TEST_ENVS,
    TRIAL_SEED,
    distinct_rows,
)
from domainbed.results.schema import record_problem

Layout = tuple[tuple[str, ...], str]
_EXACT_INT = 2 ** 53


class CorruptIndex(ValueError):
    """The index file does not hold what ``record_index`` writes."""


def check_header(header: Any, version: int) -> dict[str, Any]:
    if not isinstance(header, dict) or header.get("version") != version:
        raise CorruptIndex(f"not version {version}")
    kinds = {"arrays": dict, "layouts": list, "values": list, "notes": dict, "kept": dict,
             "n_runs": int, "n_dirs": int}
    for key, kind in kinds.items():
        if type(header.get(key)) is not kind:
            raise CorruptIndex(f"its header has no {key}")
    if header["n_runs"] < 0 or header["n_dirs"] < 0:
        raise CorruptIndex("its header counts are negative")
    if not all(isinstance(v, list) and all(isinstance(n, str) for n in v)
               for v in header["notes"].values()):
        raise CorruptIndex("a run's notes are not a list of strings")
    return header


def check_layouts(found: list[Any]) -> list[Layout]:
    """The layouts: unique string keys, one kind each (a: ``args``, h: ``hparams``, f, i,
    o), no ``run_dir`` key."""
    layouts = []
    for entry in found:
        if not (isinstance(entry, list) and len(entry) == 2 and
                isinstance(entry[0], list) and isinstance(entry[1], str)):
            raise CorruptIndex("a layout is not [keys, types]")
        keys, types = tuple(entry[0]), entry[1]
        if not (keys and all(type(k) is str for k in keys) and len(set(keys)) == len(keys)
                and len(types) == len(keys) and set(types) <= set("ahfio") and
                types.count("a") == 1 and keys[types.index("a")] == "args" and
                all(keys[i] == "hparams" for i, t in enumerate(types) if t == "h") and
                "run_dir" not in keys):
            raise CorruptIndex("a layout does not fit the column form")
        layouts.append((keys, types))
    return layouts


def kept_parts(found: dict[str, Any], layouts: list[Layout], layout: np.ndarray,
               rows: np.ndarray) -> dict[int, list[dict[str, Any]]]:
    """{block: its record dicts} for the blocks stored as records: each record fits the
    schema and its block's layout, as many as the block's rows."""
    kept = {}
    for name, records in found.items():
        block = int(name) if name.isdigit() else -1
        if not 0 <= block < len(layout) or not isinstance(records, list) or \
                len(records) != rows[block]:
            raise CorruptIndex("a stored block of records names no block")
        keys, types = layouts[layout[block]]
        first = records[0] if records else {}
        for record in records:
            if not isinstance(record, dict) or record.get("args") != first.get("args") or \
                    record.get("hparams") != first.get("hparams"):
                raise CorruptIndex("a stored block's records differ in args or hparams")
            problem = record_problem(record)
            if problem is not None:
                raise CorruptIndex(f"a record {problem}")
            if tuple(record) != keys or \
                    "".join(kind_of(k, v) for k, v in record.items()) != types:
                raise CorruptIndex("a stored record does not fit its layout")
        for record in records:     # a block's records share one args (and hparams) object
            record["args"] = first["args"]
            if "hparams" in record:
                record["hparams"] = first["hparams"]
        kept[block] = records
    for block in map(int, np.flatnonzero(np.array(["o" in t for _, t in layouts],
                                                  dtype=bool)[layout]
                                         if len(layouts) and len(layout) else [])):
        if int(block) not in kept:
            raise CorruptIndex("a block whose layout needs its records has none")
    return kept


def check_tiling(layout: np.ndarray, offset: np.ndarray, rows: np.ndarray,
                 sizes: list[int]) -> None:
    """The blocks of each layout cover its matrix, each row once."""
    if len(rows) and rows.min() < 1:
        raise CorruptIndex("a block has no rows")
    for i, size in enumerate(sizes):
        chosen = np.flatnonzero(layout == i)
        order = np.argsort(offset[chosen], kind="stable")
        starts, counts = offset[chosen][order], rows[chosen][order]
        ends = np.concatenate(([0], np.cumsum(counts)))
        if not np.array_equal(starts, ends[:-1]) or ends[-1] != size:
            raise CorruptIndex("its blocks' rows overlap or leave gaps")


def check_matrix(layout: Layout, matrix: np.ndarray,
                 kept: list[tuple[int, int, list[dict[str, Any]]]]) -> None:
    """The numbers of one layout: ints that are ints within 2^53, steps >= 0; each stored
    block of records (kept: (offset, rows, records) of the layout's blocks that keep them)
    has its records' numbers."""
    keys, types = layout
    ints = [j for j, t in enumerate(types) if t == "i"]
    values = matrix[:, ints]          # one pass over the matrix, then over these columns
    if not ((np.abs(values) <= _EXACT_INT).all() and (values == np.rint(values)).all()):
        raise CorruptIndex("a layout holds an integer that is not one")   # NaN, inf: > 2^53
    step = keys.index("step") if "step" in keys else -1
    if step in ints and len(values) and values[:, ints.index(step)].min() < 0:
        raise CorruptIndex("a layout holds a negative step")
    for offset, count, records in kept:
        expected = numeric_block(layout, records)
        if not np.array_equal(expected, matrix[offset:offset + count], equal_nan=True):
            raise CorruptIndex("a stored block's numbers are not its records'")


def _values(texts: Any) -> list[list[Any]]:
    if not (isinstance(texts, list) and len(texts) == len(KEY_FIELDS) and
            all(isinstance(t, list) and all(type(x) is str for x in t) for t in texts)):
        raise CorruptIndex("its key tables are not lists of JSON texts")
    try:
        return [json.loads("[" + ",".join(t) + "]") for t in texts]
    except (ValueError, RecursionError):
        raise CorruptIndex("a key value is not JSON") from None


def _is_int(value: Any) -> bool:
    return type(value) is int


def _scalar(value: Any) -> bool:
    return value is None or type(value) in (str, int, float, bool)


_FIELD_CHECKS = {
    DATASET: lambda v: type(v) is str,
    ALGORITHM: lambda v: type(v) is str,
    TRIAL_SEED: lambda v: v is None or _is_int(v),
    HPARAMS_SEED: lambda v: v is None or _is_int(v),
    TEST_ENVS: lambda v: type(v) is list and all(_is_int(e) and e >= 0 for e in v),
    ENV_NAMES: lambda v: v is None or (type(v) is list and all(type(n) is str for n in v)),
    DATA_KEY: lambda v: type(v) is list and len(v) == 5 and all(map(_scalar, v)),
    HPARAMS_KEY: lambda v: type(v) is list and len(v) == 2 and all(type(s) is str
                                                                    for s in v),
}


def check_keys(texts: Any, codes: np.ndarray, layouts: list[Layout], layout: np.ndarray
               ) -> list[list[Any]]:
    """The key tables' values (``run_keys``), each of the kind the schema allows, every
    code in range, and each distinct (layout, test envs, env_names) a record of that shape
    fits the schema (env keys below the environment count, a step that is an int)."""
    values = _values(texts)
    for field, check in _FIELD_CHECKS.items():
        if not all(map(check, values[field])):
            raise CorruptIndex(f"a {KEY_FIELDS[field]} value does not fit the schema")
        column = codes[:, field] if len(codes) else codes[:0, 0]
        if len(column) and (column.min() < 0 or column.max() >= len(values[field])):
            raise CorruptIndex(f"a {KEY_FIELDS[field]} code is out of range")
    for field in (DATA_KEY, HPARAMS_KEY):
        values[field] = [tuple(v) for v in values[field]]
    if len(codes):
        shapes, _, _ = distinct_rows(np.stack([layout, codes[:, TEST_ENVS],
                                               codes[:, ENV_NAMES]], axis=1))
        for layout_id, test_envs, env_names in shapes.tolist():
            _check_shape(layouts[layout_id], values[TEST_ENVS][test_envs],
                         values[ENV_NAMES][env_names])
    return values


_STAND_INS = {"i": 0, "f": 0.0, "o": None}


def _check_shape(layout: Layout, test_envs: Any, env_names: Any) -> None:
    keys, types = layout
    if "o" in types:
        return      # stored as records, each checked (kept_parts)
    args = {"dataset": "", "algorithm": "", "test_envs": test_envs, "env_names": env_names}
    record = {k: args if t == "a" else {} if t == "h" else _STAND_INS[t]
              for k, t in zip(keys, types)}
    problem = record_problem(record)
    if problem is not None:
        raise CorruptIndex(f"its records would not fit the schema: a record {problem}")
