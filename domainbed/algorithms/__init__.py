"""Algorithms, one module per family; importing this package registers the built-ins."""
from domainbed.algorithms import alignment, dro, erm, irm, vrex  # noqa: F401
from domainbed.algorithms.base import Algorithm  # noqa: F401
