"""DomainBed-compatible training core: datasets, algorithms, training, sweeps, result tables.

    import domainbed
    config = domainbed.RunConfig(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2])
    records = domainbed.train(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2],
                              output_dir="runs/erm", steps=50)

`RunConfig` is imported when first asked for (PEP 562): a command that only reads
results (collect_results, the leaderboard) does not import the training core.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from domainbed.config import RunConfig
    from domainbed.results.records import Records

__version__ = "0.1.0"
__all__ = ["RunConfig", "train", "__version__"]


def train(*args: Any, **kwargs: Any) -> Records:
    """Train one run and return its records: see `domainbed.api.train`."""
    from domainbed.api import train as train_run
    return train_run(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "RunConfig":
        from domainbed.config import RunConfig
        return RunConfig
    raise AttributeError(f"module 'domainbed' has no attribute {name!r}")
