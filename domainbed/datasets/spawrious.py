"""Spawrious-{O2O, M2M}-{easy, medium, hard} (thin loaders; the split definitions live
once, in ``spawrious.splits``).

Reads ``<data_dir>/spawrious224/{0,1}/<location>/<breed>/*`` (the released dataset, or
images made by ``python -m spawrious.generate``; ``<data_dir>`` may also be the
spawrious224 folder itself, as DomainBed's loader expects). Images per cell: the
``per_cell`` argument, else ``per_cell`` in spawrious224/info.json (generated data), else
3,168 (the released data).

Environments [Test, SC_group_1, SC_group_2], classes in the authors' order
(bulldog, corgi, dachshund, labrador). Group of an example = (class, background):
``group = label * 6 + location index``, named "<breed>_<location>" in GROUP_NAMES, so the
training loop records per-group and worst-group accuracy. Example ids encode the file:
``((pool * 6 + location) * 4 + label) * 1_000_000 + position in the sorted folder``, so
they are unique and the same image keeps its id across the six benchmarks.

Transforms: as DomainBed's SpawriousBenchmark (train: Resize, RandomHorizontalFlip,
ColorJitter(0.3 x 4), RandomGrayscale; eval: Resize; both ImageNet-normalised), with the
train/eval switch of ``domainbed.datasets.image_folders`` (``set_transform(train)`` on an
environment or on any split of one; see that module). ``hparams["image_size"]`` (224)
is the side images are resized to.
"""
import hashlib
import os
from typing import Any

import numpy as np

from domainbed.datasets.base import MultipleDomainDataset
from domainbed.datasets.image_folders import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageEnvironment,
    torchvision_transforms,
)
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.errors import UserError
from spawrious.constants import CLASS_LIST, DEFAULT_PER_CELL, LOCATIONS
from spawrious.layout import read_info, resolve_dataset_dir
from spawrious.splits import ENVIRONMENTS, build_split, select_files

ID_STRIDE = 1_000_000


def spawrious_transforms(size: Any, augment: Any) -> tuple[Any, ...]:
    transforms = torchvision_transforms()
    normalize = transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    ev = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor(), normalize])
    if not augment:
        return ev, ev
    tr = transforms.Compose([
        transforms.Resize((size, size)), transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3, 0.3), transforms.RandomGrayscale(),
        transforms.ToTensor(), normalize])
    return tr, ev


def example_id(pool: Any, location: Any, label: Any, position: Any) -> Any:
    if position >= ID_STRIDE:
        raise UserError(f"more than {ID_STRIDE} images in one Spawrious folder")
    return ((int(pool) * len(LOCATIONS) + LOCATIONS.index(location)) * len(CLASS_LIST)
            + int(label)) * ID_STRIDE + int(position)


class SpawriousBenchmark(MultipleDomainDataset):
    ENVIRONMENTS = list(ENVIRONMENTS)
    INPUT_SHAPE = (3, 224, 224)
    CLASSES = list(CLASS_LIST)
    GROUP_NAMES = [f"{c}_{loc}" for c in CLASS_LIST for loc in LOCATIONS]
    N_STEPS = 5001
    CHECKPOINT_FREQ = 100
    BENCHMARK: Any = None
    HPARAMS = {"image_size": Hparam(224, lambda r: 224, "side images are resized to", low=1)}

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any], per_cell: Any = None,
                 variant: str = "canonical") -> None:
        dataset_dir = resolve_dataset_dir(root)
        info = read_info(dataset_dir)
        if per_cell is None:
            per_cell = int((info or {}).get("per_cell", DEFAULT_PER_CELL))
        self.split = build_split(self.BENCHMARK, per_cell, variant)
        self.examples = select_files(dataset_dir, self.split)
        size = int((hparams or {}).get("image_size", 224))
        augment = bool((hparams or {}).get("data_augmentation", True))
        digest = hashlib.sha256(f"{self.BENCHMARK}:{variant}:{per_cell}\n".encode())
        self.datasets = []
        for i, env in enumerate(ENVIRONMENTS):
            exs = self.examples[env]
            labels = np.array([CLASS_LIST.index(ex.breed) for ex in exs], dtype=np.int64)
            locations = np.array([LOCATIONS.index(ex.location) for ex in exs], dtype=np.int64)
            ids = np.array([example_id(ex.pool, ex.location, lab, ex.position)
                            for ex, lab in zip(exs, labels)], dtype=np.int64)
            paths = [os.path.join(dataset_dir, *ex.path.split("/")) for ex in exs]
            train_t, eval_t = spawrious_transforms(size, augment and i not in test_envs)
            environment = ImageEnvironment(paths, labels, ids, labels * len(LOCATIONS) + locations,
                                           train_transform=train_t, eval_transform=eval_t,
                                           training=i not in test_envs)
            environment.locations = locations
            environment.pools = np.array([ex.pool for ex in exs], dtype=np.int64)
            self.datasets.append(environment)
            for ex, p in zip(exs, paths):
                digest.update(f"{env}\t{ex.path}\t{os.path.getsize(p)}\n".encode())
        self.input_shape = (3, size, size)
        self.num_classes = len(CLASS_LIST)
        origin = f"{info.get('backend')}-seed{info.get('seed')}" if info else "released"
        self.data_source = f"spawrious:{origin}:{os.path.abspath(dataset_dir)}"
        self.data_fingerprint = digest.hexdigest()[:16]


def _benchmark(name: str, benchmark: Any) -> Any:
    cls = type(name, (SpawriousBenchmark,), {"BENCHMARK": benchmark, "__module__": __name__})
    return register_dataset(name)(cls)


SpawriousO2O_easy = _benchmark("SpawriousO2O_easy", "o2o_easy")
SpawriousO2O_medium = _benchmark("SpawriousO2O_medium", "o2o_medium")
SpawriousO2O_hard = _benchmark("SpawriousO2O_hard", "o2o_hard")
SpawriousM2M_easy = _benchmark("SpawriousM2M_easy", "m2m_easy")
SpawriousM2M_medium = _benchmark("SpawriousM2M_medium", "m2m_medium")
SpawriousM2M_hard = _benchmark("SpawriousM2M_hard", "m2m_hard")
