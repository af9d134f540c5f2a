"""Group-annotated image benchmarks in SubpopBench's framing (Yang et al. 2023), plus
the Waterbirds construction of Salaudeen et al. 2025, "Are Domain Generalization Benchmarks
with Accuracy on the Line Misspecified?".

SubpopBench framing (``Waterbirds``, ``CelebA``, ``MetaShift``; the text ones live in
``domainbed.datasets.text``): the environments are the official splits
``["train", "val", "test"]``; a run trains on ``train`` and holds out the other two
(``DEFAULT_TEST_ENVS = [1, 2]``: the train CLI's default for these datasets, and sweeps use it
instead of enumerating test environments). The group of an example is (label, attribute):
``group = y * len(ATTRIBUTES) + a``, named ``"<class>_<attribute>"`` in GROUP_NAMES, so every
checkpoint records per-group and worst-group accuracy and collect_results' ``val_worst_group``
selection (best worst-group accuracy on ``val``) applies. As in SubpopBench, no augmentation
by default (``data_augmentation`` false); images are resized to ``image_size``.

Layouts (``DATA_DIR`` is --data_dir):
  Waterbirds  DATA_DIR/waterbirds/waterbird_complete95_forest2water2/metadata.csv + images
              (the standard release; columns img_id, img_filename, y, split, place; split
              0/1/2 = train/val/test; place 0/1 = land/water). WILDS' ``waterbirds_v1.0/``
              folder (same metadata) is accepted too.
  CelebA      DATA_DIR/celeba/{list_attr_celeba.txt, list_eval_partition.txt,
              img_align_celeba/}; y = Blond_Hair, attribute = Male (1 where the file says 1).
  MetaShift   DATA_DIR/metashift/MetaShift-Cat-Dog-indoor-outdoor/{train/cat/cat(indoor),
              train/dog/dog(outdoor), test/cat/cat(outdoor), test/dog/dog(indoor)}/*.jpg;
              cat = 1, dog = 0, indoor = 1, outdoor = 0; SubpopBench's split rule (seed 42:
              25% test, then 10% val, drawn over all images) applied to the files in sorted
              order (SubpopBench globs in file-system order).

Example ids: Waterbirds img_id; CelebA the row of the image in list_attr_celeba.txt;
MetaShift the position of the file in the sorted listing.
"""
import os
from typing import Any

import numpy as np

from domainbed.datasets.base import MultipleDomainDataset
from domainbed.datasets.image_folders import ImageEnvironment, make_transforms
from domainbed.datasets.layout import (
    check_sampled_files,
    find_root,
    fingerprint_columns,
    pandas_module,
    read_csv,
    require_files,
)
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.errors import UserError

WATERBIRDS_DIRS = ("waterbirds/waterbird_complete95_forest2water2",
                   "waterbird_complete95_forest2water2", "waterbirds_v1.0")
WATERBIRDS_COLUMNS = ["img_id", "img_filename", "y", "split", "place"]


def _log_uniform(default: Any, low_exp: Any, high_exp: Any) -> Any:
    return Hparam(default, lambda r: 10 ** r.uniform(low_exp, high_exp),
                  f"SubpopBench's; searched as 10 ** uniform({low_exp}, {high_exp})", low=0.0)


def _fixed(default: Any, **valid: Any) -> Any:
    return Hparam(default, lambda r: default, "SubpopBench's", **valid)


# SubpopBench's optimization protocol (YyzHarry/SubpopBench: subpopbench/hparams_registry.py,
# learning/optimizers.py, learning/algorithms.py ERM._init_model), the defaults of its
# datasets here: SGD with momentum 0.9 at a constant rate for images; AdamW with a linear
# decay to 0 (no warm-up) and gradient norms clipped to 1 for text. Weight decay 1e-4 for
# both. Random draws use SubpopBench's search ranges.
SUBPOPBENCH_IMAGE_OPTIMIZER = {
    "optimizer": _fixed("sgd", choices=("adam", "sgd", "adamw")),
    "momentum": _fixed(0.9, low=0.0, high=0.999),
    "lr": _log_uniform(1e-3, -4, -2),
    "weight_decay": _log_uniform(1e-4, -6, -3),
}
SUBPOPBENCH_TEXT_OPTIMIZER = {
    "optimizer": _fixed("adamw", choices=("adam", "sgd", "adamw")),
    "lr": _log_uniform(1e-5, -5.5, -4),
    "weight_decay": _log_uniform(1e-4, -6, -3),
    "lr_schedule": _fixed("linear", choices=("constant", "linear", "cosine", "step")),
    "max_grad_norm": _fixed(1.0, low=0.0),
}


def group_names(classes: Any, attributes: Any) -> list[Any]:
    return [f"{c}_{a}" for c in classes for a in attributes]


class SubpopulationDataset(MultipleDomainDataset):
    """Official splits as environments; groups = (label, attribute)."""
    ENVIRONMENTS = ["train", "val", "test"]
    DEFAULT_TEST_ENVS = [1, 2]
    INPUT_SHAPE = (3, 224, 224)
    CLASSES: Any = None
    ATTRIBUTES: Any = None
    N_STEPS = 5001
    CHECKPOINT_FREQ = 100
    HPARAMS = {
        "data_augmentation": Hparam(False, lambda r: False, "SubpopBench trains unaugmented",
                                    choices=(False, True)),
        "image_size": Hparam(224, lambda r: 224, "side images are resized to", low=8,
                             high=1024),
    }

    def build_image_environments(self, env: Any, y: Any, a: Any, ids: Any, paths: Any,
                                 test_envs: Any, hparams: dict[str, Any], source: Any) -> None:
        """One ImageEnvironment per entry of ENVIRONMENTS from per-example arrays
        (env index, label, attribute, id, path)."""
        env, y, a, ids = (np.asarray(v, dtype=np.int64) for v in (env, y, a, ids))
        if len(np.unique(ids)) != len(ids):
            raise UserError(f"{self.registry_name}: example ids are not unique in {source}")
        hparams = hparams or {}
        size = int(hparams.get("image_size", 224))
        augment = bool(hparams.get("data_augmentation", False))
        groups = y * len(self.ATTRIBUTES) + a
        paths = np.asarray(paths, dtype=object)
        self.datasets = []
        for i in range(len(self.ENVIRONMENTS)):
            keep = np.flatnonzero(env == i)
            train_t, eval_t = make_transforms(i not in test_envs, augment, size)
            self.datasets.append(ImageEnvironment(
                paths[keep].tolist(), y[keep], ids[keep], groups[keep],
                train_transform=train_t, eval_transform=eval_t, training=i not in test_envs))
        self.input_shape = (3, size, size)
        self.num_classes = len(self.CLASSES)
        self.data_source = f"{self.registry_name}:{os.path.abspath(source)}"
        self.data_fingerprint = fingerprint_columns(env, y, a, ids, [
            os.path.relpath(p, source) for p in paths])


def read_waterbirds(name: str, data_dir: str) -> tuple[Any, ...]:
    """(root, metadata DataFrame) of the standard Waterbirds release, layout checked."""
    root = find_root(name, data_dir, WATERBIRDS_DIRS, "metadata.csv")
    df = read_csv(name, os.path.join(root, "metadata.csv"), WATERBIRDS_COLUMNS)
    bad = sorted(set(df["split"].unique()) - {0, 1, 2})
    if bad:
        raise UserError(f"{name}: {root}/metadata.csv has split values {bad}; expected 0/1/2")
    paths = [os.path.join(root, f) for f in df["img_filename"].astype(str)]
    check_sampled_files(name, paths, root)
    return root, df, paths


@register_dataset("Waterbirds")
class Waterbirds(SubpopulationDataset):
    """Landbird vs waterbird; attribute = land/water background (SubpopBench framing)."""
    CLASSES = ["landbird", "waterbird"]
    ATTRIBUTES = ["land", "water"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    OPTIMIZER_HPARAMS = SUBPOPBENCH_IMAGE_OPTIMIZER   # SubpopBench's protocol

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        data_root, df, paths = read_waterbirds(self.registry_name, root)
        self.build_image_environments(df["split"], df["y"], df["place"], df["img_id"], paths,
                                      test_envs, hparams, data_root)


@register_dataset("WILDSWaterbirds")
class WILDSWaterbirds(Waterbirds):
    """The construction of Salaudeen et al. 2025 (accuracy on the line): env 0 = the full
    training split, env 1 = val + test; groups (y, place). Trained on env 0
    (DEFAULT_TEST_ENVS = [1])."""
    ENVIRONMENTS = ["train", "val_test"]
    DEFAULT_TEST_ENVS = [1]
    OPTIMIZER_HPARAMS: Any = None   # DomainBed's training, as the paper's sweeps

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        data_root, df, paths = read_waterbirds(self.registry_name, root)
        env = (df["split"].to_numpy() > 0).astype(np.int64)
        self.build_image_environments(env, df["y"], df["place"], df["img_id"], paths,
                                      test_envs, hparams, data_root)


def read_celeba_attributes(name: str, root: str) -> Any:
    """list_attr_celeba.txt -> (filenames, {attribute: int8 array of +1/-1})."""
    pd = pandas_module()
    path = os.path.join(root, "list_attr_celeba.txt")
    with open(path) as f:
        f.readline()
        header = f.readline().split()
        try:
            df = pd.read_csv(f, sep=r"\s+", header=None, names=["filename"] + header)
        except ValueError as e:
            raise UserError(f"{name}: cannot parse {path} ({e})") from None
    for needed in ("Blond_Hair", "Male"):
        if needed not in header:
            raise UserError(f"{name}: {path} has no {needed} column (wrong file?)")
    return df


def read_celeba(name: str, data_dir: str) -> tuple[Any, ...]:
    """(root, DataFrame filename/split/y/a/id, paths) of the CelebA release, checked."""
    pd = pandas_module()
    how = ("download img_align_celeba.zip, list_attr_celeba.txt and list_eval_partition.txt "
           "from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (or run "
           f"`python -m domainbed.scripts.download --datasets {name} --data_dir DATA_DIR`)")
    root = find_root(name, data_dir, ("celeba",), "list_attr_celeba.txt", how)
    require_files(name, root, ["list_eval_partition.txt", "img_align_celeba"], how)
    attrs = read_celeba_attributes(name, root)
    parts = pd.read_csv(os.path.join(root, "list_eval_partition.txt"), sep=r"\s+",
                        header=None, names=["filename", "split"])
    split = attrs["filename"].map(dict(zip(parts["filename"], parts["split"])))
    if split.isna().any():
        missing = attrs["filename"][split.isna()].iloc[0]
        raise UserError(f"{name}: {missing} is in list_attr_celeba.txt but not in "
                        f"list_eval_partition.txt (mismatched files under {root})")
    df = pd.DataFrame({"filename": attrs["filename"], "split": split.astype(np.int64),
                       "y": (attrs["Blond_Hair"] == 1).astype(np.int64),
                       "a": (attrs["Male"] == 1).astype(np.int64),
                       "id": np.arange(len(attrs), dtype=np.int64)})
    paths = [os.path.join(root, "img_align_celeba", f) for f in df["filename"]]
    check_sampled_files(name, paths, root, how)
    return root, df, paths


@register_dataset("CelebA")
class CelebA(SubpopulationDataset):
    """Blond vs not blond; attribute = Male (SubpopBench framing)."""
    CLASSES = ["not_blond", "blond"]
    ATTRIBUTES = ["female", "male"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    OPTIMIZER_HPARAMS = SUBPOPBENCH_IMAGE_OPTIMIZER   # SubpopBench's protocol

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        data_root, df, paths = read_celeba(self.registry_name, root)
        self.build_image_environments(df["split"], df["y"], df["a"], df["id"], paths,
                                      test_envs, hparams, data_root)


METASHIFT_FOLDERS = {  # folder -> (y, a): cat = 1, dog = 0; indoor = 1, outdoor = 0
    "train/cat/cat(indoor)": (1, 1), "train/dog/dog(outdoor)": (0, 0),
    "test/cat/cat(outdoor)": (1, 0), "test/dog/dog(indoor)": (0, 1)}


def metashift_splits(n: Any, seed: int = 42, test_fraction: float = 0.25,
                     val_fraction: float = 0.1) -> Any:
    """SubpopBench's rule: test = 25% of all drawn first, then val = 10% of all from the
    rest, with one RandomState(seed)."""
    rng = np.random.RandomState(seed)
    test = rng.choice(np.arange(n), size=int(n * test_fraction), replace=False)
    val = rng.choice(np.setdiff1d(np.arange(n), test), size=int(n * val_fraction),
                     replace=False)
    split = np.zeros(n, dtype=np.int64)
    split[val], split[test] = 1, 2
    return split


@register_dataset("MetaShift")
class MetaShift(SubpopulationDataset):
    """Cat vs dog; attribute = indoor/outdoor (SubpopBench's MetaShift Cat-Dog)."""
    CLASSES = ["dog", "cat"]
    ATTRIBUTES = ["outdoor", "indoor"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    OPTIMIZER_HPARAMS = SUBPOPBENCH_IMAGE_OPTIMIZER   # SubpopBench's protocol

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        name = self.registry_name
        base = find_root(name, root, ("metashift",), "MetaShift-Cat-Dog-indoor-outdoor")
        base = os.path.join(base, "MetaShift-Cat-Dog-indoor-outdoor")
        require_files(name, base, list(METASHIFT_FOLDERS))
        paths, y, a = [], [], []
        for folder, (label, attribute) in METASHIFT_FOLDERS.items():
            files = sorted(f for f in os.listdir(os.path.join(base, folder))
                           if f.lower().endswith(".jpg"))
            paths += [os.path.join(base, folder, f) for f in files]
            y += [label] * len(files)
            a += [attribute] * len(files)
        if not paths:
            raise UserError(f"{name}: no .jpg images under {base}")
        split = metashift_splits(len(paths))
        self.build_image_environments(split, y, a, np.arange(len(paths)), paths, test_envs,
                                      hparams, base)
