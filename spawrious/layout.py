"""On-disk layout, shared by both backends and the released dataset:

    ROOT/spawrious224/{0,1}/<location>/<breed>/*.png     the images (pool / background / class)
    ROOT/spawrious224/info.json                           generator settings (ours only)
    ROOT/spawrious224/manifests/<pool>_<location>_<breed>.jsonl   one record per attempt

Files are always selected in sorted name order (the original used unsorted listdir).
"""
from __future__ import annotations

import json
import os
from typing import Any

from oodutils.errors import UserError
from spawrious.constants import DATASET_DIRNAME

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
INFO_FILE = "info.json"
MANIFEST_DIR = "manifests"


def resolve_dataset_dir(root: str | os.PathLike[str], must_exist: bool = True) -> str:
    """ROOT/spawrious224 for a ROOT (also accepts the spawrious224 folder itself)."""
    root = os.fspath(root)
    if must_exist and not os.path.isdir(root):
        raise UserError(f"data directory {root!r} does not exist; generate the images with "
                        f"`python -m spawrious.generate --output_dir {root}` or download the "
                        f"released dataset with `python -m domainbed.scripts.download --datasets "
                        f"Spawrious --data_dir {root}`")
    candidate = os.path.join(root, DATASET_DIRNAME)
    if os.path.isdir(candidate):
        return candidate
    if os.path.basename(os.path.normpath(root)) == DATASET_DIRNAME or \
            os.path.isdir(os.path.join(root, "0")):
        return root
    if must_exist:
        raise UserError(f"no Spawrious images under {root!r}: expected "
                        f"{os.path.join(root, DATASET_DIRNAME, '{0,1}', '<location>', '<breed>')}; "
                        f"generate them with `python -m spawrious.generate --output_dir {root}` "
                        f"or download them with `python -m domainbed.scripts.download --datasets "
                        f"Spawrious --data_dir {root}`")
    return candidate


def cell_dir(dataset_dir: str, pool: int, location: str, breed: str) -> str:
    return os.path.join(dataset_dir, str(pool), location, breed)


def cell_relpath(pool: int, location: str, breed: str, name: str) -> str:
    return "/".join([str(pool), location, breed, name])


def list_images(directory: str) -> list[str]:
    """Image file names in `directory`, sorted; [] if it does not exist."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names
                  if n.lower().endswith(IMAGE_EXTENSIONS) and not n.startswith("."))


def manifest_path(dataset_dir: str, pool: int, location: str, breed: str) -> str:
    return os.path.join(dataset_dir, MANIFEST_DIR, f"{pool}_{location}_{breed}.jsonl")


def read_info(dataset_dir: str) -> dict[str, Any] | None:
    path = os.path.join(dataset_dir, INFO_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(info, dict):
        raise UserError(f"{path} must hold a JSON object, got {type(info).__name__}")
    per_cell = info.get("per_cell")
    if isinstance(per_cell, bool) or not isinstance(per_cell, int) or per_cell < 1:
        what = "has no per_cell" if "per_cell" not in info else \
            f"has per_cell {per_cell!r}"
        raise UserError(f"{path} {what}; it must be a positive integer (images per cell)")
    return info
