"""How hyperparameters are declared, defaulted and sampled (DomainBed semantics).

Each algorithm, dataset and network family declares its own hyperparameters beside
itself in a class attribute ``HPARAMS``: a dict ``name -> Hparam`` or
``name -> callable(dataset_cls) -> Hparam`` for dataset-dependent ones.
``hparams_seed=0`` gives the defaults; another seed gives a deterministic draw per
(algorithm, dataset, hparams_seed, trial_seed), each name from its own RandomState
seeded by ``seed_hash(seed_hash(hparams_seed, trial_seed), name)`` exactly as DomainBed,
so our draws equal DomainBed's for the names both declare.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from oodutils.errors import UserError


def seed_hash(*args: object) -> int:
    """DomainBed's misc.seed_hash: a stable 31-bit integer from any printable arguments."""
    args_str = str(args)
    return int(hashlib.md5(args_str.encode("utf-8")).hexdigest(), 16) % (2 ** 31)


@dataclass(frozen=True)
class Hparam:
    """One hyperparameter: its default, its random-search draw, and what values are valid.

    The type is the default's type (an int hyperparameter also accepts a float with an
    integral value; a float one accepts ints). ``low``/``high`` are inclusive numeric bounds,
    ``choices`` the allowed values; a user's override outside them is a clear error before
    training starts.
    """
    default: Any
    sample: Callable[[np.random.RandomState], Any]
    doc: str = ""
    low: Any = None
    high: Any = None
    choices: Any = None


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number",
            str: "a string"}.get(type(value), type(value).__name__)


def check_value(name: str, decl: Hparam, value: Any) -> Any:
    """`value` as a valid `name` (an int-typed value given as 2.0 becomes 2), or a
    UserError saying what is wrong. The type is the default's; then choices and range."""
    kind = type(_to_builtin(decl.default))
    wrong = UserError(f"hyperparameter {name!r} must be {_type_name(decl.default)}, "
                      f"got {value!r}")
    if kind is bool:
        if not isinstance(value, bool):
            raise wrong
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise wrong
            value = int(value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        if not math.isfinite(value):
            raise UserError(f"hyperparameter {name!r} must be a finite number, got {value!r}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise wrong
    if decl.choices is not None and value not in decl.choices:
        raise UserError(f"hyperparameter {name!r} must be one of "
                        f"{', '.join(map(repr, decl.choices))}; got {value!r}")
    if decl.low is not None and value < decl.low or \
            decl.high is not None and value > decl.high:
        low = "-inf" if decl.low is None else decl.low
        high = "inf" if decl.high is None else decl.high
        raise UserError(f"hyperparameter {name!r} must be in [{low}, {high}], got {value!r}")
    return value


def _stub_dataset(small_images: bool) -> type:
    """A stand-in dataset class (small or large images, no registered name) to resolve an
    algorithm's dataset-dependent declarations without building a dataset."""
    return type("AnyDataset", (), {"SMALL_IMAGES": small_images, "HPARAMS": {},
                                   "registry_name": ""})


def range_problems(cls: type, dataset_cls: type | None = None) -> list[str]:
    """What is wrong with the valid ranges of the hyperparameters `cls` declares itself
    (not its bases'): each needs ``low=``/``high=`` or ``choices=`` (so that a user's
    override is checked before training starts), with the default inside them.
    Dataset-dependent declarations are resolved for `dataset_cls`, or for a small- and a
    large-image stand-in; one that cannot be resolved so is left to the run's checks."""
    own = cls.__dict__.get("HPARAMS") or {}
    datasets = [dataset_cls] if dataset_cls is not None else \
        [_stub_dataset(True), _stub_dataset(False)]
    problems: list[str] = []
    for name, decl in own.items():
        for dataset in datasets:
            resolved = decl
            try:
                while resolved is not None and not isinstance(resolved, Hparam):
                    resolved = resolved(dataset)
            except Exception:   # keyed on real datasets: checked when a run resolves it
                break
            problem = _range_problem(name, resolved) if resolved is not None else None
            if problem and problem not in problems:
                problems.append(problem)
    return problems


def draw_problems(cls: type, dataset_cls: type | None = None, seeds: int = 4) -> list[str]:
    """What is wrong with the random-search draws of the hyperparameters `cls` declares
    itself: each seed's draw must repeat, be a plain JSON value and lie in the declared
    range (the checks the project's registry tests make of its own classes)."""
    datasets = [dataset_cls] if dataset_cls is not None else \
        [_stub_dataset(True), _stub_dataset(False)]
    problems: list[str] = []
    for dataset in datasets:
        space = {name: decl for name, decl in declared_space(cls, dataset).items()
                 if name in (cls.__dict__.get("HPARAMS") or {})}
        for seed in range(1, seeds + 1):
            drawn = draw(space, seed)
            if drawn != draw(space, seed):
                problems.append(f"hparams_seed {seed} draws differently each time")
            for name, value in drawn.items():
                try:
                    json.dumps(value, allow_nan=False)
                    check_value(name, space[name], value)
                except (TypeError, ValueError, UserError) as e:
                    problems.append(f"hparams_seed {seed} draws {name}={value!r}: {e}")
    return list(dict.fromkeys(problems))


def _range_problem(name: str, decl: Hparam) -> str | None:
    if decl.choices is None and decl.low is None and decl.high is None:
        return (f"hyperparameter {name!r} declares no valid range (give its Hparam "
                f"low=/high= or choices=)")
    try:
        check_value(name, decl, _to_builtin(decl.default))
    except UserError as e:
        return f"the default of {name!r} is not valid: {e}"
    return None


def small_or_large(small: Hparam | Callable[[type], Hparam],
                   large: Hparam | Callable[[type], Hparam]) -> Callable[[type], Any]:
    """A dataset-dependent declaration: `small` for small-image datasets (MNIST family)."""
    def pick(dataset_cls: type) -> Any:
        return small if getattr(dataset_cls, "SMALL_IMAGES", False) else large
    return pick


def by_dataset(values: Mapping[tuple[str, ...] | None, Hparam]) -> Callable[[type], Hparam]:
    """A dataset-dependent declaration keyed on registry names, as DomainBed keys some on
    DomainNet, PACS, ...: `values` maps a tuple of names (or None for the rest) to an Hparam."""
    def pick(dataset_cls: type) -> Hparam:
        name = getattr(dataset_cls, "registry_name", dataset_cls.__name__)
        for names, decl in values.items():
            if names is not None and name in names:
                return decl
        return values[None]
    return pick


def declared_space(cls: type, dataset_cls: type) -> dict[str, Hparam]:
    """Merge the HPARAMS of `cls` and its bases (subclasses override), resolved for a dataset."""
    space: dict[str, Hparam] = {}
    for klass in reversed(cls.__mro__):
        own = klass.__dict__.get("HPARAMS")
        if not own:
            continue
        for name, decl in own.items():
            if decl is None:  # a subclass may remove an inherited hyperparameter
                space.pop(name, None)
                continue
            while not isinstance(decl, Hparam):  # dataset-dependent, maybe nested
                decl = decl(dataset_cls)
            space[name] = decl
    return space


def _to_builtin(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def draw(space: Mapping[str, Hparam], seed: int) -> dict[str, Any]:
    """hparams_seed 0 -> defaults; else DomainBed's per-name seeded random draw."""
    if seed == 0:
        return {name: _to_builtin(h.default) for name, h in sorted(space.items())}
    out: dict[str, Any] = {}
    for name, h in sorted(space.items()):
        rs = np.random.RandomState(seed_hash(seed, name))
        out[name] = _to_builtin(h.sample(rs))
    return out
