"""DomainBed-compatible training core: datasets, algorithms, training, sweeps, result tables."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from domainbed.results.records import Records

__version__ = "0.1.0"


def train(*args: Any, **kwargs: Any) -> Records:
    """Train one run and return its records: see `domainbed.api.train`."""
    from domainbed.api import train as _train
    return _train(*args, **kwargs)
