"""The one schema every reader of records holds them to (collect_results, the leaderboard,
analysis): the types of the keys they use. A record from a shared sweep directory is not
trusted; one that does not fit is skipped with a note naming it, so a single bad line
never stops a reader.

``record_problem(record)`` gives what is wrong with a parsed results.jsonl line, in words,
or None when it fits:

* the line is an object nested at most ``MAX_DEPTH`` levels; ``args`` an object;
  ``hparams`` an object when present;
* ``args.dataset`` and ``args.algorithm``: strings;
* ``args.test_envs``: a list of environment indices (ints, each below the number of
  environments: ``len(args.env_names)`` when present, else below ``MAX_ENVS``);
* ``args.trial_seed``, ``args.hparams_seed``: ints of 64 bits (when present);
* ``args.env_names``: a list of strings (when present);
* the data identity (``args.data_source`` ...) and ``args.holdout_fraction``: plain values;
* ``step``: an int >= 0 of 64 bits; ``epoch`` and every accuracy / worst-group key
  (``env<i>_...acc...`` / ``..._wga``): a number (within a float's range) or null, with i
  below the environment count.
"""
from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from typing import Any

from domainbed.results.grouping import DATA_KEYS

MAX_ENVS = 1000
MAX_DEPTH = 32
SCALAR_ARGS = (*DATA_KEYS, "holdout_fraction", "uda_holdout_fraction")
_ENV_KEY = re.compile(r"^env(\d+)_\w*(?:acc|wga)\w*$")
_INT64, _FLOAT_MAX = range(-2 ** 63, 2 ** 63), int(sys.float_info.max)


def _is_int(value: object) -> bool:   # (one the tables can hold: 64 bits)
    return isinstance(value, int) and not isinstance(value, bool) and value in _INT64


def _is_number(value: object) -> bool:   # (an int must convert to a float)
    return isinstance(value, float) or \
        isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _FLOAT_MAX


def args_problem(args: Mapping[str, Any]) -> str | None:
    get = args.get
    for key in ("dataset", "algorithm"):
        if not isinstance(get(key), str):
            return f"args.{key} is not a string"
    names = get("env_names")
    if names is not None and not (isinstance(names, list) and
                                  all(isinstance(n, str) for n in names)):
        return "args.env_names is not a list of strings"
    n_envs = len(names) if names else MAX_ENVS
    test_envs = get("test_envs")
    if not (isinstance(test_envs, list) and all(_is_int(e) and 0 <= e < n_envs
                                                for e in test_envs)):
        return f"args.test_envs is not a list of environment indices below {n_envs}"
    for key in ("trial_seed", "hparams_seed"):
        if key in args and not _is_int(args[key]):
            return f"args.{key} is not an int"
    for key in SCALAR_ARGS:
        value = get(key)
        if value is not None and not isinstance(value, (str, int, float, bool)):
            return f"args.{key} is not a plain value"
    return None


@functools.lru_cache(maxsize=4096)   # a sweep repeats a few keys
def env_index(key: str) -> int | None:
    """The i of an ``env<i>_...acc...`` / ``..._wga`` key, None for any other key."""
    match = _ENV_KEY.match(key)
    return None if match is None else int(match.group(1))


def _metrics_problem(record: Mapping[str, Any], n_envs: int) -> str | None:
    if not _is_int(record.get("step")) or record["step"] < 0:
        return "step is not an int >= 0"
    if record.get("epoch") is not None and not _is_number(record["epoch"]):
        return "epoch is not a number"
    for key, value in record.items():
        env = env_index(key)
        if env is None:
            continue
        if env >= n_envs:
            return f"{key} names an environment beyond {n_envs - 1}"
        if value is not None and not _is_number(value):
            return f"{key} is not a number"
    return None


def _nesting_depth_exceeds(value: object, limit: int) -> bool:
    """Whether `value` nests lists / objects deeper than `limit` (walked without recursion,
    so later recursive code stays far from the recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item if type(item) is list \
            else None
        if children is not None:
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in children
                         if type(child) is dict or type(child) is list)
    return False


def record_problem(record: object) -> str | None:
    """What keeps `record` from fitting the schema (module docstring), or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if _nesting_depth_exceeds(record, MAX_DEPTH):
        return f"nested deeper than {MAX_DEPTH} levels"
    args = record.get("args")
    if not isinstance(args, dict):
        return "no args object"
    if record.get("hparams") is not None and not isinstance(record["hparams"], dict):
        return "hparams is not an object"
    problem = args_problem(args)
    if problem:
        return problem
    names = args.get("env_names")
    return _metrics_problem(record, len(names) if names else MAX_ENVS)
