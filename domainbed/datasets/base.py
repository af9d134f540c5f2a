"""Dataset contract: a MultipleDomainDataset is a list of environments, each a dataset of
(x, y) with a stable example id per example and, for subpopulation datasets, a group."""
import hashlib
from typing import Any

import numpy as np
import torch

from domainbed.hparams import Hparam


class MultipleDomainDataset:
    registry_name: str       # set by registry.register_dataset
    N_STEPS = 5001           # default number of steps
    CHECKPOINT_FREQ = 100    # default checkpoint frequency
    N_WORKERS = 8            # default loader workers (image datasets)
    ENVIRONMENTS: Any = None      # names of the environments, by index
    INPUT_SHAPE: Any = None
    SMALL_IMAGES = False     # small-image hyperparameter defaults (DomainBed's SMALL_IMAGES)
    NEEDS_DATA_DIR = True    # False: builds itself when --data_dir does not exist
    GROUP_NAMES: Any = None       # list of group names where examples carry a group label
    HPARAMS = {
        "data_augmentation": Hparam(True, lambda r: True),
        "class_balanced": Hparam(False, lambda r: False),
    }

    @classmethod
    def data_notice(cls, data_dir: str) -> str | None:
        """A line a sweep prints once before its jobs about where this dataset's data
        comes from under `data_dir` (e.g. a built-in substitute), or None."""
        return None

    # Set by the constructor of each concrete dataset:
    #   self.datasets: list of Environment, one per entry of ENVIRONMENTS
    #   self.input_shape, self.num_classes
    #   self.data_source: str (where the examples came from), self.data_fingerprint: str
    datasets: list[Any]
    input_shape: tuple[int, ...]
    num_classes: int
    data_source: str
    data_fingerprint: str
    def __getitem__(self, index: Any) -> Any:
        return self.datasets[index]

    def __len__(self) -> int:
        return len(self.datasets)

    @property
    def group_names(self) -> Any:
        return self.GROUP_NAMES

    def identity(self) -> dict[str, Any]:
        """What makes two runs' data the same: goes into every run's args."""
        return {"data_source": getattr(self, "data_source", type(self).__name__),
                "data_fingerprint": getattr(self, "data_fingerprint", "")}


class Environment(torch.utils.data.Dataset):
    """One environment. `y`, `ids`, `groups` are arrays readable without loading inputs.

    ids: int64, unique within the dataset and stable across runs with the same data seed.
    groups: int64 group index per example, or None.
    paths: list of file paths (image datasets), or None.
    """
    y: torch.Tensor
    ids: np.ndarray
    groups: Any = None
    paths: Any = None
    x: Any = None  # a tensor of all inputs when the environment fits in memory (fast path)

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: Any) -> Any:
        return EnvironmentSubset(self, np.asarray(indices, dtype=np.int64))


class TensorEnvironment(Environment):
    def __init__(self, x: torch.Tensor, y: Any, ids: Any, groups: Any = None) -> None:
        assert len(x) == len(y) == len(ids)
        self.x, self.y = x, torch.as_tensor(y, dtype=torch.long)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.groups = None if groups is None else np.asarray(groups, dtype=np.int64)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return self.x[i], self.y[i]


class EnvironmentSubset(Environment):
    """A split (in/out) of an environment; keeps ids and groups aligned."""

    def __init__(self, parent: Any, indices: Any) -> None:
        self.parent, self.indices = parent, indices
        self.y = parent.y[torch.from_numpy(indices)]
        self.ids = parent.ids[indices]
        self.groups = None if parent.groups is None else parent.groups[indices]
        self.paths = None if parent.paths is None else [parent.paths[i] for i in indices]
        self.x = None if parent.x is None else parent.x[torch.from_numpy(indices)]
        self.transform = getattr(parent, "transform", None)

    def __getitem__(self, i: int) -> Any:
        return self.parent[int(self.indices[i])]


def split_dataset(environment: Any, n: Any, seed: int = 0) -> tuple[Any, ...]:
    """DomainBed's misc.split_dataset: (first n of a seeded permutation, the rest)."""
    keys = list(range(len(environment)))
    np.random.RandomState(seed).shuffle(keys)
    return environment.subset(keys[:n]), environment.subset(keys[n:])


def fingerprint_arrays(*arrays: Any) -> Any:
    """A short stable hash of the data (so runs on different data are never pooled)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]
