"""Datasets, one module per family; importing this package registers the built-ins."""
from domainbed.datasets import debug, image_folders, mnist, oodbench_mnist, spawrious  # noqa: F401
from domainbed.datasets.base import (  # noqa: F401
    Environment, MultipleDomainDataset, TensorEnvironment, split_dataset)
