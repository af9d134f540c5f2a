"""Algorithms, one module per family; importing this package registers the built-ins."""
import importlib

from domainbed.algorithms.base import Algorithm  # noqa: F401

BUILTIN_MODULES = ["erm", "irm", "dro", "alignment", "vrex"]

for _module in BUILTIN_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except ModuleNotFoundError as e:  # only while the package is being assembled
        if e.name != f"{__name__}.{_module}":
            raise
