"""Datasets, one module per family; importing this package registers the built-ins."""
from domainbed.datasets import (  # noqa: F401
    debug,
    hub,
    image_folders,
    mnist,
    oodbench_images,
    oodbench_mnist,
    own_data,
    spawrious,
    subpopulation,
    sviro,
    text,
    wilds,
)
from domainbed.datasets.base import (  # noqa: F401
    Environment,
    MultipleDomainDataset,
    TensorEnvironment,
    split_dataset,
)
