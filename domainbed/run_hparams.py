"""The hyperparameters of one run: everything a run of an algorithm on a dataset reads
(network, dataset and algorithm declarations), drawn (defaults for hparams_seed 0, else
DomainBed's seeded draw) and overridden by the user's ``--hparams``, each value checked.

Declarations and draws live in :mod:`domainbed.hparams`; this module looks classes up in the
registries, so it sits above the networks, algorithms and datasets.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from domainbed import networks
from domainbed.hparams import Hparam, _to_builtin, check_value, declared_space, draw, seed_hash
from domainbed.registry import ALGORITHMS, get_algorithm_class, get_dataset_class
from oodutils.errors import UserError


def hparam_space(algorithm_cls: type, dataset_cls: type) -> dict[str, Hparam]:
    """Everything a run of `algorithm_cls` on `dataset_cls` reads: network, dataset, algorithm."""
    space: dict[str, Hparam] = {}
    space.update(declared_space(networks.Networks, dataset_cls))
    space.update(declared_space(dataset_cls, dataset_cls))
    space.update(declared_space(algorithm_cls, dataset_cls))
    return space


def default_hparams(algorithm: str, dataset: str) -> dict[str, Any]:
    return draw(hparam_space(get_algorithm_class(algorithm), get_dataset_class(dataset)), 0)


def random_hparams(algorithm: str, dataset: str, seed: int) -> dict[str, Any]:
    """DomainBed's random_hparams(algorithm, dataset, seed); seed 0 still means random here."""
    space = hparam_space(get_algorithm_class(algorithm), get_dataset_class(dataset))
    return {name: _to_builtin(h.sample(np.random.RandomState(seed_hash(seed, name))))
            for name, h in sorted(space.items())}


def names_declared_elsewhere(dataset_cls: type) -> set[str]:
    """Names any registered algorithm declares (a sweep passes one JSON to all algorithms)."""
    names: set[str] = set()
    for algo in ALGORITHMS.names():
        names.update(declared_space(ALGORITHMS.get(algo), dataset_cls))
    return names


def resolve(algorithm: str, dataset: str, hparams_seed: int = 0, trial_seed: int = 0,
            overrides: Mapping[str, Any] | None = None,
            notify: Callable[[str], None] = print) -> dict[str, Any]:
    """The hyperparameters of one run: default or seeded draw, then the user's overrides."""
    algorithm_cls, dataset_cls = get_algorithm_class(algorithm), get_dataset_class(dataset)
    space = hparam_space(algorithm_cls, dataset_cls)
    if hparams_seed == 0:
        hparams = draw(space, 0)
    else:
        hparams = draw(space, seed_hash(hparams_seed, trial_seed))
    hparams.update(check_overrides(algorithm, dataset, overrides, notify))
    return hparams


def check_overrides(algorithm: str, dataset: str, overrides: Mapping[str, Any] | None,
                    notify: Callable[[str], None] = print) -> dict[str, Any]:
    """The overrides a run of `algorithm` on `dataset` uses, each checked (`check_value`);
    names only other algorithms declare are ignored with a notice, unknown ones refused."""
    algorithm_cls, dataset_cls = get_algorithm_class(algorithm), get_dataset_class(dataset)
    space = hparam_space(algorithm_cls, dataset_cls)
    used: dict[str, Any] = {}
    for name, value in (overrides or {}).items():
        if name in space:
            used[name] = check_value(name, space[name], value)
        elif name in names_declared_elsewhere(dataset_cls):
            notify(f"notice: hyperparameter {name!r} is not used by {algorithm}; ignored")
        else:
            raise UserError(f"unknown hyperparameter {name!r} for {algorithm} on {dataset}; "
                            f"valid names: {', '.join(sorted(space))}")
    return used
