"""``--dataset hf:REPO_OR_DIR``: any image or text dataset with a domain column, read with
the Hugging Face ``datasets`` library (its cache and its offline mode, ``HF_HUB_OFFLINE=1``).

Source: an existing local folder in the Hub's layout (``data/*.parquet``, or any layout
``datasets.load_dataset(DIR)`` reads) is read in place with no network; otherwise
REPO is a Hub dataset repository, fetched with ``huggingface_hub.snapshot_download`` at
``--hf_revision`` (default ``main``) and read from that snapshot. The commit the snapshot
holds is the revision used: it goes into the records' args (``hf_revision``, and
``data_source`` = ``hf:REPO@COMMIT``) with the data fingerprint (the sha256 of the data
files, the environments, labels and names).

Options (``domainbed.hub_options``: flags folded into the name): the split (default
``train``); the domain column (default ``domain``): environments are its ClassLabel names
in their order when it is a ClassLabel, else its distinct values sorted as text, or exactly
``--hf_domains a,b,c`` in that order (rows of other domains left out); the label column
(default ``label``): classes are its ClassLabel names (index k = name k), else the sorted
distinct values (whole numbers: indices as given); the input: ``--hf_text_column`` for a text
dataset (encoded by the text featurizer, as the built-in text datasets are), else the image
column (the first column of the ``Image`` type, or one named ``image``). Images are decoded
lazily, one example at a time, after every one passed the same check as own data
(``image_checks``; ``--skip_bad_images``). Example ids are the rows' indices in the split.
"""
import glob
import hashlib
import io
import os
import re
from typing import Any

import numpy as np
from PIL import Image

from domainbed.datasets.base import MultipleDomainDataset
from domainbed.datasets.image_checks import bytes_problem, file_problem
from domainbed.datasets.image_folders import (
    ImageEnvironment,
    MultipleEnvironmentImageFolder,
    load_image,
    make_transforms,
)
from domainbed.datasets.layout import fingerprint_columns
from domainbed.datasets.own_data import CheckedImages
from domainbed.datasets.text import TextDataset
from domainbed.hub_options import HF_OPTIONS, join_name, split_name
from domainbed.registry import register_dataset_prefix
from oodutils.errors import UserError, require

DATA_PATTERNS = ("*.parquet", "**/*.parquet", "*.arrow", "**/*.arrow", "*.csv", "**/*.csv",
                 "*.json", "**/*.json", "*.jsonl", "**/*.jsonl", "README.md")


def _datasets() -> Any:
    return require("datasets", extra="hub")


def snapshot(name: str, repo: Any, revision: Any) -> tuple[Any, ...]:
    """(local folder, commit) of the Hub dataset `repo` at `revision` (downloaded into
    huggingface_hub's cache, or found there offline)."""
    hub = require("huggingface_hub", extra="hub")
    errors = require("huggingface_hub.errors", extra="hub")
    try:
        folder = hub.snapshot_download(repo_id=repo, repo_type="dataset", revision=revision,
                                   allow_patterns=list(DATA_PATTERNS))
    except errors.LocalEntryNotFoundError:
        raise UserError(f"{name}: {repo!r} (revision {revision or 'main'}) is neither a local "
                        f"folder nor in the Hugging Face cache, and the Hub cannot be reached "
                        f"(offline?); download it once with a network, or give a folder "
                        f"holding data/*.parquet") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{name}: cannot read the Hub dataset {repo!r} (revision "
                        f"{revision or 'main'}): {first}") from None
    return folder, os.path.basename(os.path.normpath(folder))


def local_revision(folder: str) -> Any:
    """A local folder's revision: the commit of a huggingface_hub snapshot folder
    (``.../snapshots/<commit>``), else ``local`` (the fingerprint tells contents apart)."""
    parent, leaf = os.path.split(os.path.normpath(folder))
    if os.path.basename(parent) == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", leaf):
        return leaf
    return "local"


def data_files_digest(folder: str) -> Any:
    """sha256 over the data files under `folder` (names and contents, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for pattern in DATA_PATTERNS[:-1]
                       for p in glob.glob(os.path.join(folder, pattern), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def load_split(name: str, folder: str, split: Any) -> Any:
    """The `split` of the dataset in `folder` (datasets.load_dataset, cached)."""
    datasets = _datasets()
    quiet = not datasets.utils.are_progress_bars_disabled()
    try:
        if quiet:   # the library's own progress bars: not in a run's terminal
            datasets.utils.disable_progress_bars()
        splits = datasets.load_dataset(folder)
    except Exception as e:   # the datasets library raises many kinds for a bad folder
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{name}: cannot read {folder!r} as a Hugging Face dataset ({first}); "
                        f"expected the Hub's layout, e.g. data/train-*.parquet") from None
    finally:
        if quiet:
            datasets.utils.enable_progress_bars()
    if split not in splits:
        raise UserError(f"{name}: no split {split!r} (--hf_split); the splits are: "
                        f"{', '.join(splits)}")
    return splits[split]


def _column(name: str, table: Any, option: Any, column: Any) -> Any:
    if column not in table.column_names:
        raise UserError(f"{name}: no column {column!r} ({HF_OPTIONS[option][0]}); the columns "
                        f"are: {', '.join(table.column_names)}")
    return column


def _names_and_codes(name: str, table: Any, column: Any, what: Any) -> tuple[Any, ...]:
    """(names, code per row) of a column: ClassLabel names, else sorted distinct values
    (whole numbers stay the indices they are)."""
    datasets = _datasets()
    feature = table.features[column]
    values = table.data.column(column).to_pylist()   # arrow: one pass, no row objects
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), np.asarray(values, dtype=np.int64)
    if any(v is None for v in values):
        row = next(i for i, v in enumerate(values) if v is None)
        raise UserError(f"{name}: row {row} has no {what} (column {column!r} is empty there)")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        codes = np.asarray(values, dtype=np.int64)
        if codes.min() < 0:
            raise UserError(f"{name}: column {column!r} holds a negative {what} index")
        return [str(k) for k in range(int(codes.max()) + 1)], codes
    text = [str(v) for v in values]
    names = sorted(set(text))
    index = {n: i for i, n in enumerate(names)}
    return names, np.asarray([index[v] for v in text], dtype=np.int64)


def _image_column(name: str, table: Any) -> Any:
    datasets = _datasets()
    found = [c for c, f in table.features.items() if isinstance(f, datasets.Image)]
    if found:
        return found[0]
    if "image" in table.column_names:
        return "image"
    raise UserError(f"{name}: no image column (none of the Image type, none named 'image'); "
                    f"the columns are: {', '.join(table.column_names)}; for a text dataset "
                    f"pass --hf_text_column")


class HubTable:
    """The checked columns of one split: environment, label and input per row."""

    def __init__(self, name: str, argument: Any) -> None:
        self.name = name
        self.source, self.options = split_name(argument)
        if not self.source:
            raise UserError("hf:REPO_OR_DIR needs a Hub dataset or a folder: --dataset "
                            "hf:flwrlabs/pacs or --dataset hf:DIR (DIR/data/*.parquet)")
        o = self.options
        if os.path.isdir(self.source):
            if o["revision"]:
                raise UserError(f"{name}: --hf_revision applies to Hub repositories, not to "
                                f"the local folder {self.source!r}")
            self.folder = os.path.abspath(self.source)
            self.revision = local_revision(self.folder)
            self.data_source = f"hf:{self.folder}"
        else:
            self.folder, self.revision = snapshot(name, self.source, o["revision"])
            self.data_source = f"hf:{self.source}@{self.revision}"
        table = load_split(name, self.folder, o["split"])
        domain_col = _column(name, table, "domain_column", o["domain_column"])
        label_col = _column(name, table, "label_column", o["label_column"])
        self.text_column = o["text_column"] and _column(name, table, "text_column",
                                                        o["text_column"])
        self.image_column = None if self.text_column else _image_column(name, table)
        domains, domain_codes = _names_and_codes(name, table, domain_col, "domain")
        self.classes, self.labels = _names_and_codes(name, table, label_col, "label")
        self.domains, self.env = self._environments(domains, domain_codes)
        self.rows = np.flatnonzero(self.env >= 0)
        self.table = table
        self.files_digest = data_files_digest(self.folder)
        self._check_classes()

    def _environments(self, domains: Any, codes: Any) -> tuple[Any, ...]:
        """(environment names, environment index per row, -1 for rows left out)."""
        wanted = self.options["domains"]
        if wanted:
            chosen = [d.strip() for d in wanted.split(",") if d.strip()]
            unknown = [d for d in chosen if d not in domains]
            if unknown:
                raise UserError(f"{self.name}: --hf_domains names {unknown[0]!r}, not a value "
                                f"of the domain column; its values: {', '.join(domains)}")
        else:
            chosen = [d for d in domains if d in set(np.asarray(domains)[np.unique(codes)])]
        if len(chosen) < 2:
            raise UserError(f"{self.name}: needs at least two domains (one to train on, one "
                            f"to test on), found {len(chosen)}: {', '.join(chosen) or 'none'}")
        position = {domains.index(d): i for i, d in enumerate(chosen)}
        env = np.asarray([position.get(int(c), -1) for c in codes], dtype=np.int64)
        return chosen, env

    def _check_classes(self) -> None:
        for i, domain in enumerate(self.domains):
            if not np.any(self.env == i):
                raise UserError(f"{self.name}: domain {domain!r} has no rows")

    def fingerprint(self) -> Any:
        return fingerprint_columns(self.env, self.labels, self.domains, self.classes,
                                   [self.files_digest, self.text_column or self.image_column])


class HubImageEnvironment(ImageEnvironment):
    """Images stored in the table (encoded bytes), decoded one example at a time."""

    def __init__(self, column: Any, rows: Any, labels: Any, ids: Any, **transforms: Any) -> None:
        super().__init__([None] * len(rows), labels, ids, **transforms)
        self.column, self.rows = column, np.asarray(rows, dtype=np.int64)

    def _cell(self, i: int) -> Any:
        """Row i's image as {"bytes", "path"} (the Image feature's storage; a plain binary
        or text column is taken as bytes or a path)."""
        cell = self.column[int(self.rows[i])].as_py()
        if isinstance(cell, bytes):
            return {"bytes": cell, "path": None}
        if isinstance(cell, str):
            return {"bytes": None, "path": cell}
        return cell

    def load(self, i: int) -> Any:
        cell = self._cell(i)
        if cell.get("bytes") is not None:
            return Image.open(io.BytesIO(cell["bytes"])).convert("RGB")
        return load_image(cell["path"])

    def image_problem(self, i: int) -> Any:
        cell = self._cell(i)
        if cell is None:
            return "has no image"
        if cell.get("bytes") is not None:
            return bytes_problem(cell["bytes"])
        if cell.get("path"):
            return file_problem(cell["path"])
        return "has no image bytes and no path"

    def describe(self, i: int) -> str:
        return f"row {int(self.rows[i])} (image column)"

    def keep(self, indices: Any) -> None:
        super().keep(indices)
        self.rows = self.rows[indices]


class HubImageDataset(CheckedImages, MultipleDomainDataset):
    """``hf:`` with an image column: one environment per domain."""
    NEEDS_DATA_DIR = False
    N_WORKERS = 8
    INPUT_SHAPE = (3, 224, 224)
    TABLE: Any = None
    HPARAMS = {**MultipleDomainDataset.HPARAMS, **MultipleEnvironmentImageFolder.HPARAMS}

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        table = self.TABLE
        column = table.table.data.column(table.image_column)   # arrow, read row by row
        size = int(hparams.get("image_size", 224))
        augment = bool(hparams.get("data_augmentation", True))
        self.datasets = []
        for i in range(len(self.ENVIRONMENTS)):
            rows = np.flatnonzero(table.env == i)
            train_t, eval_t = make_transforms(i not in test_envs, augment, size)
            self.datasets.append(HubImageEnvironment(
                column, rows, table.labels[rows], rows, train_transform=train_t,
                eval_transform=eval_t, training=i not in test_envs))
        self.input_shape = (3, size, size)
        self.num_classes = len(table.classes)
        self.classes = table.classes
        self.data_source = table.data_source
        self.data_fingerprint = table.fingerprint()

    def class_name(self, label: Any) -> str:
        return self.classes[label]

    def identity(self) -> dict[Any, Any]:
        return {**super().identity(), "hf_revision": self.TABLE.revision}


def _text_dataset_class() -> Any:
    class HubTextDataset(TextDataset):
        """``hf:`` with ``--hf_text_column``: the texts encoded by the text featurizer."""
        NEEDS_DATA_DIR = False
        TABLE: Any = None

        def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
            table = self.TABLE
            texts = [str(t) for t in table.table.data.column(table.text_column).to_pylist()]
            rows = table.rows
            self.build_text_environments(texts, rows, table.env[rows], table.labels[rows],
                                         np.zeros(len(rows), dtype=np.int64), rows, hparams,
                                         table.folder, table.folder)
            self.data_source = table.data_source
            self.data_fingerprint = fingerprint_columns([self.data_fingerprint],
                                                        [table.fingerprint()])

        def identity(self) -> dict[Any, Any]:
            return {**super().identity(), "hf_revision": self.TABLE.revision}

    return HubTextDataset


@register_dataset_prefix("hf")
def hub_dataset(argument: Any) -> Any:
    """The dataset class for ``hf:REPO_OR_DIR[?options]`` (the split read and checked once)."""
    name = f"hf:{argument}"
    table = HubTable(name, argument)
    canonical = join_name(table.source, table.options)
    base = _text_dataset_class() if table.text_column else HubImageDataset
    return type(base.__name__, (base,), {
        "ENVIRONMENTS": table.domains, "TABLE": table, "CLASSES": table.classes,
        "canonical_name": canonical})

