"""DomainBed-compatible training core: datasets, algorithms, training, sweeps, result tables.

    import domainbed
    config = domainbed.RunConfig(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2])
    records = domainbed.train(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2],
                              output_dir="runs/erm", steps=50)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from domainbed.api import train as _train
from domainbed.config import RunConfig

if TYPE_CHECKING:
    from domainbed.results.records import Records

__version__ = "0.1.0"
__all__ = ["RunConfig", "train", "__version__"]


def train(*args: Any, **kwargs: Any) -> Records:
    """Train one run and return its records: see `domainbed.api.train`."""
    return _train(*args, **kwargs)
