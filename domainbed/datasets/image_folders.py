"""DomainBed's image-folder datasets: VLCS, PACS, OfficeHome, TerraIncognita, DomainNet.

Layout (as DomainBed's download script leaves it): ``<data_dir>/<DATASET_DIR>/<env>/<class>/
<images>``; environments are the sorted sub-folders, classes the sorted union of the class
folders, files in sorted order (DomainBed's ImageFolder order).

Example ids: the index of the file in its environment's sorted order plus an offset (the
total size of the environments before it), so ids are unique within the dataset and stable
for the same files.

Transforms (for the training loop): every ImageEnvironment (and every split of one made by
``env.subset``) carries ``train_transform``, ``eval_transform`` and ``transform`` (the one in
use), and ``set_transform(train: bool)`` to switch. ``train_transform`` is DomainBed's
augmentation (RandomResizedCrop(scale 0.7-1), flip, ColorJitter(0.3 x 4), RandomGrayscale)
for training environments when ``hparams["data_augmentation"]`` is true, and the eval
transform otherwise. As constructed, ``transform`` is DomainBed's choice: augmented for
training environments, plain for test environments. A split copies its parent's
transforms when it is made and switches independently of it and of its sibling, so a
training loop that augments only the training in-splits calls ``set_transform(True)`` on
those and ``set_transform(False)`` on every out-split (and test split).
``hparams["image_size"]`` (default 224) is the side the images are resized to.
"""
import hashlib
import os
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile

from domainbed.datasets.base import Environment, EnvironmentSubset, MultipleDomainDataset
from domainbed.datasets.image_checks import file_problem
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.errors import UserError

ImageFile.LOAD_TRUNCATED_IMAGES = True
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def torchvision_transforms() -> Any:
    """torchvision.transforms, imported when a dataset first builds its transforms (heavy:
    not when the registry loads the dataset modules)."""
    import torchvision.transforms
    return torchvision.transforms


def eval_transform(size: int = 224) -> Any:
    transforms = torchvision_transforms()
    return transforms.Compose([
        transforms.Resize((size, size)),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)])


def augment_transform(size: int = 224) -> Any:
    """DomainBed's MultipleEnvironmentImageFolder augmentation."""
    transforms = torchvision_transforms()
    return transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.7, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3, 0.3),
        transforms.RandomGrayscale(),
        transforms.ToTensor(),
        transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)])


def load_image(path: str) -> Any:
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


class _Transforms:
    """The train/eval transform pair and the switch (shared by environments and splits)."""
    transform: Any
    train_transform: Any
    eval_transform: Any

    def set_transform(self, train: Any) -> Any:
        """Use the training transform (augmented where allowed) or the evaluation one."""
        self.transform = self.train_transform if train else self.eval_transform
        return self

    def _copy_transforms(self, other: Any) -> None:
        self.train_transform = other.train_transform
        self.eval_transform = other.eval_transform
        self.transform = other.transform


class ImageEnvironment(_Transforms, Environment):
    """An environment of image files: env[i] -> (transformed image tensor, label).

    paths: full file paths; y: int64 labels; ids: int64 unique ids; groups: int64 or None.
    """
    locations: Any   # set where a dataset records them (spawrious)
    pools: Any

    def __init__(self, paths: Any, labels: Any, ids: Any, groups: Any = None,
                 train_transform: Any = None, eval_transform: Any = None,
                 training: bool = False) -> None:
        assert len(paths) == len(labels) == len(ids)
        self.paths = list(paths)
        self.y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        self.ids = np.asarray(ids, dtype=np.int64)
        self.groups = None if groups is None else np.asarray(groups, dtype=np.int64)
        self.eval_transform = eval_transform
        self.train_transform = train_transform or eval_transform
        self.set_transform(training)

    def load(self, i: int) -> Any:
        return load_image(self.paths[i])

    def image_problem(self, i: int) -> Any:
        """Why example i's file is not a usable image, or None (image_checks)."""
        return file_problem(self.paths[i])

    def describe(self, i: int) -> Any:
        return repr(self.paths[i])

    def keep(self, indices: Any) -> None:
        """Keep only the examples at `indices` (bad images skipped before any split)."""
        self.paths = [self.paths[i] for i in indices]
        self.y = self.y[torch.from_numpy(indices)]
        self.ids = self.ids[indices]
        if self.groups is not None:
            self.groups = self.groups[indices]

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        image = self.load(int(i))
        if self.transform is not None:
            image = self.transform(image)
        return image, self.y[int(i)]

    def subset(self, indices: Any) -> Any:
        return ImageSubset(self, np.asarray(indices, dtype=np.int64))


class ImageSubset(_Transforms, EnvironmentSubset):
    """A split of an ImageEnvironment with its own transform switch."""

    def __init__(self, parent: Any, indices: Any) -> None:
        super().__init__(parent, indices)
        self._copy_transforms(parent)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        j = int(self.indices[int(i)])
        image = self.parent.load(j)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.y[int(i)]

    def subset(self, indices: Any) -> Any:
        out = ImageSubset(self.parent, self.indices[np.asarray(indices, dtype=np.int64)])
        out._copy_transforms(self)
        return out


def make_transforms(training_env: Any, augment: Any, size: Any) -> tuple[Any, ...]:
    ev = eval_transform(size)
    return (augment_transform(size) if (training_env and augment) else ev), ev


def _inside(path: str, root_real: Any) -> Any:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _sorted_dirs(path: str, root: str) -> list[Any]:
    """Visible sub-folders of `path`; a symlinked one only when it stays inside `root`."""
    root_real = os.path.realpath(root)
    return sorted(e.name for e in os.scandir(path)
                  if e.is_dir() and not e.name.startswith(".")
                  and (not e.is_symlink() or _inside(e.path, root_real)))


def _sorted_images(directory: str, root: str) -> Any:
    """ImageFolder's order: sorted walk of the class folder. Symlinks are followed only
    while they stay inside the dataset `root`; a folder reached twice (two links to one
    folder) is walked once and a link back up (a loop) not at all, so no image is counted
    twice."""
    root_real = os.path.realpath(root)
    if not _inside(directory, root_real):
        return []
    seen = {os.path.realpath(directory)}
    walked = []
    for base, dirs, files in os.walk(directory, followlinks=True):
        kept, base_real = [], os.path.realpath(base)
        for d in sorted(dirs):
            real = os.path.realpath(os.path.join(base, d))
            if real not in seen and _inside(real, root_real) and not _inside(base_real, real):
                seen.add(real)
                kept.append(d)
        dirs[:] = kept
        walked.append((base, files))
    out = []
    for base, files in sorted(walked):
        for f in sorted(files):
            path = os.path.join(base, f)
            if f.lower().endswith(IMG_EXTENSIONS) and not f.startswith(".") and \
                    (not os.path.islink(path) or _inside(path, root_real)):
                out.append(path)
    return out


def missing_data_error(name: str, path: str, hint: Any = None) -> Any:
    return UserError(
        f"{name}: data directory {path!r} does not exist; download it with "
        f"`python -m domainbed.scripts.download --datasets {name} --data_dir DATA_DIR` "
        f"and pass --data_dir DATA_DIR" + (f" ({hint})" if hint else ""))


class MultipleEnvironmentImageFolder(MultipleDomainDataset):
    """DomainBed's MultipleEnvironmentImageFolder (see the module docstring)."""
    INPUT_SHAPE = (3, 224, 224)
    N_WORKERS = 8
    HPARAMS = {"image_size": Hparam(224, lambda r: 224, "side images are resized to", low=1)}

    def __init__(self, root: str, test_envs: Any, augment: Any, hparams: dict[str, Any]) -> None:
        name = getattr(self, "registry_name", type(self).__name__)
        if not os.path.isdir(root):
            raise missing_data_error(name, root)
        environments = _sorted_dirs(root, root)
        if self.ENVIRONMENTS is not None and len(environments) != len(self.ENVIRONMENTS):
            raise UserError(f"{name}: expected {len(self.ENVIRONMENTS)} environment folders "
                            f"({', '.join(self.ENVIRONMENTS)}) in {root!r}, found "
                            f"{len(environments)}: {', '.join(environments) or 'none'}")
        classes = sorted({c for env in environments
                          for c in _sorted_dirs(os.path.join(root, env), root)})
        if not classes:
            raise UserError(f"{name}: no class folders under the environments of {root!r}")
        size = int((hparams or {}).get("image_size", 224))
        self.classes, self.environment_dirs = classes, environments
        self.datasets, offset, digest = [], 0, hashlib.sha256()
        for i, env in enumerate(environments):
            paths, labels = [], []
            for label, cls in enumerate(classes):
                files = _sorted_images(os.path.join(root, env, cls), root)
                paths += files
                labels += [label] * len(files)
            if not paths:
                raise UserError(f"{name}: environment folder "
                                f"{os.path.join(root, env)!r} has no images")
            train_t, eval_t = make_transforms(i not in test_envs, augment, size)
            self.datasets.append(ImageEnvironment(
                paths, labels, np.arange(len(paths)) + offset, train_transform=train_t,
                eval_transform=eval_t, training=i not in test_envs))
            offset += len(paths)
            for p, y in zip(paths, labels):
                digest.update(f"{os.path.relpath(p, root)}\t{y}\n".encode())
        self.input_shape = (3, size, size)
        self.num_classes = len(classes)
        self.data_source = f"image_folder:{os.path.abspath(root)}"
        self.data_fingerprint = digest.hexdigest()[:16]


class _FolderDataset(MultipleEnvironmentImageFolder):
    DIRNAME: Any = None

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        self.dir = os.path.join(root, self.DIRNAME)
        super().__init__(self.dir, test_envs, hparams["data_augmentation"], hparams)


@register_dataset("VLCS")
class VLCS(_FolderDataset):
    CHECKPOINT_FREQ = 300
    ENVIRONMENTS = ["C", "L", "S", "V"]
    DIRNAME = "VLCS"


@register_dataset("PACS")
class PACS(_FolderDataset):
    CHECKPOINT_FREQ = 300
    ENVIRONMENTS = ["A", "C", "P", "S"]
    DIRNAME = "PACS"


@register_dataset("OfficeHome")
class OfficeHome(_FolderDataset):
    CHECKPOINT_FREQ = 300
    ENVIRONMENTS = ["A", "C", "P", "R"]
    DIRNAME = "office_home"


@register_dataset("TerraIncognita")
class TerraIncognita(_FolderDataset):
    CHECKPOINT_FREQ = 300
    ENVIRONMENTS = ["L100", "L38", "L43", "L46"]
    DIRNAME = "terra_incognita"


@register_dataset("DomainNet")
class DomainNet(_FolderDataset):
    CHECKPOINT_FREQ = 1000
    ENVIRONMENTS = ["clip", "info", "paint", "quick", "real", "sketch"]
    DIRNAME = "domain_net"
