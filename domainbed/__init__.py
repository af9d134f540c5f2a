"""DomainBed-compatible training core: datasets, algorithms, training, sweeps, result tables.

    import domainbed
    config = domainbed.RunConfig(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2])
    records = domainbed.train(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2],
                              output_dir="runs/erm", steps=50)

`RunConfig` and `train` (``domainbed.api.train``) are imported when first asked for (PEP
562): a command that only reads results (collect_results, the leaderboard) starts
without the training core.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from domainbed.api import train
    from domainbed.training.config import RunConfig

__version__ = "0.1.0"
__all__ = ["RunConfig", "train", "__version__"]
# name -> the module that defines it, imported when the name is first asked for
LAZY_EXPORTS = {"RunConfig": "domainbed.training.config", "train": "domainbed.api"}


def __getattr__(name: str) -> Any:
    """The lazy exports (PEP 562)."""
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module 'domainbed' has no attribute {name!r}")
    return getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
