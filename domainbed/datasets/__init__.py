"""Datasets, one module per family; importing this package registers the built-ins."""
import importlib

from domainbed.datasets.base import (  # noqa: F401
    Environment, MultipleDomainDataset, TensorEnvironment, split_dataset)

BUILTIN_MODULES = ["debug", "mnist", "image_folders", "spawrious", "oodbench_mnist"]

for _module in BUILTIN_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except ModuleNotFoundError as e:  # only while the package is being assembled
        if e.name != f"{__name__}.{_module}":
            raise
