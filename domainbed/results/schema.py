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
* ``args.trial_seed``, ``args.hparams_seed``: ints (when present);
* ``args.env_names``: a list of strings (when present);
* the data identity (``args.data_source`` ...) and ``args.holdout_fraction``: plain values;
* ``step``: an int >= 0; ``epoch`` and every accuracy / worst-group key
  (``env<i>_...acc...`` / ``..._wga``): a number or null, with i below the environment count.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_ENVS = 1000
MAX_DEPTH = 32
SCALAR_ARGS = ("data_source", "data_fingerprint", "data_seed", "precision", "weights_sha256",
               "holdout_fraction", "uda_holdout_fraction")
_ENV_KEY = re.compile(r"^env(\d+)_\w*(?:acc|wga)\w*$")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_SCALAR_CLASSES = (str, int, float, bool)    # (with None: what _is_scalar accepts)


def _args_problem(args: Mapping[str, Any]) -> str | None:
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
        if value is not None and not isinstance(value, _SCALAR_CLASSES):
            return f"args.{key} is not a plain value"
    return None


_ENV_INDEX: dict[str, int | None] = {}   # key -> its env index, for the keys seen so far


def _env_index(key: str) -> int | None:
    """The i of an ``env<i>_...acc...`` / ``..._wga`` key, or None for any other key
    (remembered for short keys: a sweep repeats the same few keys a million times)."""
    found = _ENV_INDEX.get(key, -1)
    if found != -1:
        return found
    match = _ENV_KEY.match(key)
    index = None if match is None else int(match.group(1))
    if len(key) <= 64 and len(_ENV_INDEX) < 4096:
        _ENV_INDEX[key] = index
    return index


def _metrics_problem(record: Mapping[str, Any], n_envs: int) -> str | None:
    if not _is_int(record.get("step")) or record["step"] < 0:
        return "step is not an int >= 0"
    if record.get("epoch") is not None and not _is_number(record["epoch"]):
        return "epoch is not a number"
    for key, value in record.items():
        env = _env_index(key)
        if env is None:
            continue
        if env >= n_envs:
            return f"{key} names an environment beyond {n_envs - 1}"
        if value is not None and not _is_number(value):
            return f"{key} is not a number"
    return None


_NUMBER_OR_NULL = frozenset((int, float, type(None)))
_ENV_KEYS_OF: dict[tuple[tuple[str, ...], int], tuple[str, ...] | None] = {}


def _metrics_fit(record: Mapping[str, Any], n_envs: int) -> bool:
    """A quick yes for `_metrics_problem(record, n_envs) is None`, from the accuracy keys of
    the record's key tuple (worked out once per tuple); False means: ask it."""
    shape = (tuple(record), n_envs)
    env_keys = _ENV_KEYS_OF.get(shape, ())
    if env_keys == ():
        indices = [(key, _env_index(key)) for key in shape[0]]
        env_keys = None if any(i is not None and i >= n_envs for _, i in indices) else \
            tuple(key for key, i in indices if i is not None)
        if len(_ENV_KEYS_OF) < 1024 and sum(map(len, shape[0])) < 4096:
            _ENV_KEYS_OF[shape] = env_keys
    if env_keys is None:
        return False
    step, epoch = record.get("step"), record.get("epoch")
    return type(step) is int and step >= 0 and type(epoch) in _NUMBER_OR_NULL and \
        set(map(type, map(record.__getitem__, env_keys))) <= _NUMBER_OR_NULL


_CONTAINERS = frozenset((dict, list))


def _nests_within(value: object, levels: int) -> bool:
    """Whether `value` holds lists / objects at most `levels` levels deep (a quick yes for
    the shallow records every reader writes; recursion at most `levels` deep)."""
    children = value.values() if type(value) is dict else value if type(value) is list \
        else None
    if children is None:
        return True
    if levels <= 1:
        return False if levels <= 0 else not _CONTAINERS & set(map(type, children))
    if not _CONTAINERS & set(map(type, children)):
        return True
    return all(_nests_within(c, levels - 1) for c in children if type(c) in _CONTAINERS)


def _nesting_depth_exceeds(value: object, limit: int) -> bool:
    """Whether `value` nests lists / objects deeper than `limit` (walked without recursion,
    so later recursive code such as grouping keys stays far from the recursion limit)."""
    if limit >= 4 and _nests_within(value, 4):
        return False
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def record_problem(record: object, checked: Mapping[str, Any] | None = None) -> str | None:
    """What keeps `record` from fitting the schema (module docstring), or None.

    checked: a record of the same run already found to fit; when `record` holds the very
    same ``args`` and ``hparams`` objects (a reader shares them between the lines of a run),
    only the record's own keys are checked again."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if checked is not None and record.get("args") is checked.get("args") and \
            record.get("hparams") is checked.get("hparams") and "args" in record:
        for key, value in record.items():
            if isinstance(value, (list, dict)) and key not in ("args", "hparams") and \
                    _nesting_depth_exceeds(value, MAX_DEPTH - 1):
                return f"nested deeper than {MAX_DEPTH} levels"
        names = record["args"].get("env_names")
        n_envs = len(names) if names else MAX_ENVS
        if _metrics_fit(record, n_envs):
            return None
        return _metrics_problem(record, n_envs)
    if _nesting_depth_exceeds(record, MAX_DEPTH):
        return f"nested deeper than {MAX_DEPTH} levels"
    return shallow_record_problem(record)


def shallow_record_problem(record: dict[str, Any]) -> str | None:
    """`record_problem(record)` for a dict its caller knows to nest at most MAX_DEPTH
    levels (a reader that bounds the nesting from the bytes it parsed)."""
    args = record.get("args")
    if not isinstance(args, dict):
        return "no args object"
    if record.get("hparams") is not None and not isinstance(record["hparams"], dict):
        return "hparams is not an object"
    problem = _args_problem(args)
    if problem:
        return problem
    names = args.get("env_names")
    n_envs = len(names) if names else MAX_ENVS
    return None if _metrics_fit(record, n_envs) else _metrics_problem(record, n_envs)
