"""Your own data without writing a class: ``--dataset folder:PATH`` and ``--dataset csv:PATH``.

``folder:PATH``  DomainBed's layout ``PATH/<domain>/<class>/*.jpg|png|...``: environments are
                 the sorted domain folders, classes the sorted class folders (every domain
                 must hold every class), files in ImageFolder's sorted order; ids, transforms,
                 fingerprint and layout messages are those of DomainBed's image datasets
                 (``MultipleEnvironmentImageFolder``).
``csv:PATH``     a table with the columns ``path,label,domain`` and optionally ``group``:
                 ``path`` relative to the CSV's folder (it may not leave that folder, by
                 ``..``, an absolute path or a symlink), ``label`` a class index 0..K-1
                 or a class name (``dog``; when any label is not a whole number, every
                 label is a name and the classes are the sorted names: index k is the
                 k-th name in sorted order),
                 ``domain`` any text (environments are the sorted domains), ``group`` a
                 group index used as given (GROUP_NAMES ``group0``..). Example ids are the
                 data rows' indices.

The name as given (``folder:data/mine``) is the dataset's name everywhere: in a run's args,
so in sweep job hashes, and in results tables. The path is read when the name is first
resolved (so a sweep checks the layout before it builds any job); `--data_dir` is not used.
Images of any size are resized to ``image_size`` as DomainBed's image datasets are, and
``{"pretrained": false}`` (or a small ``arch``) trains without weight files.
"""
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from domainbed.datasets.image_checks import check_environments
from domainbed.datasets.image_folders import (
    IMG_EXTENSIONS,
    ImageEnvironment,
    MultipleEnvironmentImageFolder,
    _inside,
    _sorted_dirs,
    make_transforms,
)
from domainbed.datasets.layout import check_sampled_files, fingerprint_columns, read_csv
from domainbed.registry import register_dataset_prefix
from oodutils.errors import UserError

CSV_COLUMNS = ["path", "label", "domain"]
CSV_HOW = ("the CSV needs the columns path,label,domain (and optionally group), one row per "
           "image, paths relative to the CSV's folder")


def _require_two_domains(name: str, domains: Any, where: Any) -> None:
    if len(domains) < 2:
        raise UserError(f"{name}: needs at least two domains (one to train on, one to test "
                        f"on), found {len(domains)} in {where}: {', '.join(domains) or 'none'}")


def _missing_class_error(name: str, cls: Any, domain: Any) -> Any:
    return UserError(f"{name}: class {cls!r} has no images in domain {domain!r}; every "
                     f"domain needs every class")


class CheckedImages:
    """Every image checked before training (image_checks): one error line for a bad one,
    or with --skip_bad_images the bad ones left out and counted (every domain must still
    hold every class)."""
    datasets: list[Any]
    ENVIRONMENTS: Any
    num_classes: int
    registry_name: str

    def check_images(self, skip_bad: bool = False, log: Callable[[str], Any] | None = None) -> Any:
        skipped = check_environments(self, skip_bad, log)
        if skipped:
            for env, domain in zip(self.datasets, self.ENVIRONMENTS):
                present = set(env.y.tolist())
                for label in range(self.num_classes):
                    if label not in present:
                        raise _missing_class_error(self.registry_name,
                                                   self.class_name(label), domain)
        return skipped

    def class_name(self, label: Any) -> str:
        return label


class OwnImageFolder(CheckedImages, MultipleEnvironmentImageFolder):
    """``folder:PATH``: DomainBed's image-folder loader on a folder chosen at run time."""
    NEEDS_DATA_DIR = False
    ROOT: Any = None      # set by folder_dataset
    CLASSES: Any = None   # the class folders found when the name was resolved

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        super().__init__(self.ROOT, test_envs, hparams.get("data_augmentation", True),
                         hparams)
        if self.environment_dirs != list(self.ENVIRONMENTS) or self.classes != self.CLASSES:
            raise UserError(f"{self.registry_name}: the domain or class folders changed "
                            f"while the run started; run it again")
        for env, domain in zip(self.datasets, self.ENVIRONMENTS):
            present = set(env.y.tolist())
            for label, cls in enumerate(self.classes):
                if label not in present:
                    raise _missing_class_error(self.registry_name, cls, domain)

    def class_name(self, label: Any) -> str:
        return self.classes[label]


@register_dataset_prefix("folder")
def folder_dataset(path: str) -> Any:
    """The dataset class for ``folder:PATH`` (domain and class folders checked)."""
    name = f"folder:{path}"
    if not path:
        raise UserError("folder:PATH needs a path: --dataset folder:DIR with "
                        "DIR/<domain>/<class>/<images>")
    if not os.path.isdir(path):
        raise UserError(f"{name}: {path!r} is not a directory (expected "
                        f"{os.path.join(path, '<domain>', '<class>', '<images>')})")
    domains = _sorted_dirs(path, path)
    _require_two_domains(name, domains, repr(path))
    per_domain = {d: _sorted_dirs(os.path.join(path, d), path) for d in domains}
    classes = sorted({c for found in per_domain.values() for c in found})
    for domain, found in per_domain.items():
        if not found:
            raise UserError(f"{name}: domain folder {os.path.join(path, domain)!r} has no "
                            f"class folders (expected <domain>/<class>/<images>)")
        for cls in classes:
            if cls not in found:
                raise _missing_class_error(name, cls, domain)
    return type("OwnImageFolder", (OwnImageFolder,), {
        "ENVIRONMENTS": domains, "ROOT": path, "CLASSES": classes})


class OwnTable:
    """A checked ``csv:PATH`` table: per row its domain index, label, group, full path."""

    def __init__(self, name: str, csv_path: Any) -> None:
        self.name, self.csv_path = name, csv_path
        self.base = os.path.dirname(os.path.abspath(csv_path))
        df = read_csv(name, csv_path, CSV_COLUMNS, how=CSV_HOW, dtype=str,
                      keep_default_na=False)
        self.classes = self._class_names(df)
        self.labels = self._labels(df)
        self.groups = self._indices(df, "group") if "group" in df.columns else None
        self.domains = self._domains(df["domain"].tolist())
        self.env = np.asarray([self.domains.index(d) for d in df["domain"]], dtype=np.int64)
        self.relative_paths = df["path"].tolist()
        self.paths = [self._safe_path(i, p) for i, p in enumerate(self.relative_paths)]
        self.num_classes = int(self.labels.max()) + 1
        self._check_classes_per_domain()
        check_sampled_files(name, self.paths, self.base, CSV_HOW)

    def _where(self, row: Any) -> str:
        return f"{self.csv_path} row {row + 2}"  # +1 for the header, +1 counting from 1

    def _indices(self, df: Any, column: Any) -> Any:
        """A column of non-negative integers (class or group indices)."""
        values = df[column].str.strip()
        bad = ~values.str.fullmatch(r"\d+")
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"{self.name}: {self._where(row)}: {column} "
                            f"{df[column].iloc[row]!r} is not a non-negative integer "
                            f"(the {column} column holds indices 0, 1, ...)")
        if not len(values):
            raise UserError(f"{self.name}: {self.csv_path} has no rows")
        return values.astype(np.int64).to_numpy()

    def _class_names(self, df: Any) -> list[Any] | None:
        """None when every label is a class index; else the sorted distinct class names
        (labels given as names: `dog`, `cat` -> classes [cat, dog], indices 0, 1)."""
        labels = df["label"].str.strip()
        numbers = labels.str.fullmatch(r"\d+").to_numpy()
        if numbers.all():
            return None
        if numbers.any():
            row = int(np.flatnonzero(~numbers)[0])
            raise UserError(f"{self.name}: {self._where(row)}: label "
                            f"{df['label'].iloc[row]!r} is a class name but other rows "
                            f"give class indices; use names (dog, cat, ...) or indices "
                            f"(0, 1, ...) throughout")
        empty = labels == ""
        if empty.any():
            row = int(np.flatnonzero(empty.to_numpy())[0])
            raise UserError(f"{self.name}: {self._where(row)} has an empty label")
        return sorted(set(labels))

    def _labels(self, df: Any) -> Any:
        if self.classes is None:
            return self._indices(df, "label")
        index = {name: i for i, name in enumerate(self.classes)}
        return np.asarray([index[v] for v in df["label"].str.strip()], dtype=np.int64)

    def class_name(self, label: Any) -> str:
        return label if self.classes is None else self.classes[label]

    def _domains(self, column: Any) -> Any:
        for row, domain in enumerate(column):
            if not domain.strip():
                raise UserError(f"{self.name}: {self._where(row)} has an empty domain")
        domains = sorted(set(column))
        _require_two_domains(self.name, domains, self.csv_path)
        return domains

    def _safe_path(self, row: Any, relative: Any) -> Any:
        """The file of a row, refused when it leaves the CSV's folder."""
        if not relative.strip():
            raise UserError(f"{self.name}: {self._where(row)} has an empty path")
        full = os.path.normpath(os.path.join(self.base, relative))
        if os.path.isabs(relative) or not _inside(full, os.path.realpath(self.base)):
            raise UserError(f"{self.name}: {self._where(row)}: path {relative!r} leads outside "
                            f"the CSV's folder {self.base!r} (absolute, '..' or a symlink "
                            f"out); paths must stay inside it")
        if not relative.lower().endswith(IMG_EXTENSIONS):
            raise UserError(f"{self.name}: {self._where(row)}: {relative!r} is not an image "
                            f"file ({', '.join(IMG_EXTENSIONS)})")
        return full

    def _check_classes_per_domain(self) -> None:
        for i, domain in enumerate(self.domains):
            present = set(self.labels[self.env == i].tolist())
            for label in range(self.num_classes):
                if label not in present:
                    raise _missing_class_error(self.name, self.class_name(label), domain)

    def group_names(self) -> list[Any] | None:
        if self.groups is None:
            return None
        return [f"group{g}" for g in range(int(self.groups.max()) + 1)]


class OwnCSVDataset(CheckedImages, MultipleEnvironmentImageFolder):
    """``csv:PATH``: one ImageEnvironment per domain from a checked table."""
    NEEDS_DATA_DIR = False
    TABLE: Any = None   # the OwnTable read when the name was resolved

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        table = self.TABLE
        size = int(hparams.get("image_size", 224))
        augment = bool(hparams.get("data_augmentation", True))
        ids = np.arange(len(table.labels), dtype=np.int64)
        self.datasets = []
        for i in range(len(self.ENVIRONMENTS)):
            keep = np.flatnonzero(table.env == i)
            train_t, eval_t = make_transforms(i not in test_envs, augment, size)
            self.datasets.append(ImageEnvironment(
                [table.paths[k] for k in keep], table.labels[keep], ids[keep],
                None if table.groups is None else table.groups[keep],
                train_transform=train_t, eval_transform=eval_t, training=i not in test_envs))
        self.input_shape = (3, size, size)
        self.num_classes = table.num_classes
        self.classes = table.classes or [str(k) for k in range(table.num_classes)]
        self.data_source = f"csv:{os.path.abspath(table.csv_path)}"
        groups = [] if table.groups is None else table.groups
        self.data_fingerprint = fingerprint_columns(
            table.env, table.labels, groups, [os.path.normpath(p) for p in table.relative_paths],
            *([table.classes] if table.classes else []))

    def class_name(self, label: Any) -> str:
        return self.TABLE.class_name(label)


@register_dataset_prefix("csv")
def csv_dataset(path: str) -> Any:
    """The dataset class for ``csv:PATH`` (the table read and checked once)."""
    if not path:
        raise UserError("csv:PATH needs a path: --dataset csv:FILE.csv with the columns "
                        "path,label,domain")
    name = f"csv:{path}"
    if not os.path.isfile(path):
        raise UserError(f"{name}: no such file {path!r}; {CSV_HOW}")
    table = OwnTable(name, path)
    return type("OwnCSVDataset", (OwnCSVDataset,), {
        "ENVIRONMENTS": table.domains, "TABLE": table, "GROUP_NAMES": table.group_names()})
