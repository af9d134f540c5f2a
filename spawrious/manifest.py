"""Per-cell manifests: one JSON line per generation attempt (kept or rejected).

Record keys: file (relative to the dataset dir, null when nothing was saved), pool,
location, breed, attempt, prompt, negative_prompt, fur, pose, time_of_day, seed, backend,
caption, status ("kept" | "rejected"), reason (null, "caption", "nsfw", "surplus"), size.

Crash safety: an image is written atomically (temp file + rename) *before* its record is
appended; appends are whole lines in one write + fsync. `reconcile` repairs whatever an
interruption left: a truncated last line is dropped, records whose image is gone are
dropped, images without a record and stale temp files are deleted, and the cleaned
manifest is rewritten atomically. Attempts are numbered, and image names carry the
number, so a resumed run continues at the next attempt with no duplicates.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oodutils.errors import UserError
from oodutils.fileio import atomic_write_text
from spawrious.layout import cell_dir, list_images, manifest_path

NAME_RE = re.compile(r"^(?P<backend>[a-z0-9]+)_(?P<attempt>\d{6,})\.png$")


def image_name(backend: str, attempt: int) -> str:
    return f"{backend}_{int(attempt):06d}.png"


def read_records(path: str) -> tuple[list[dict[str, Any]], int]:
    """(records, n_bad_lines) from a JSONL manifest (missing file -> ([], 0))."""
    records, bad = [], 0
    try:
        with open(path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict) and "attempt" in rec:
            records.append(rec)
        else:
            bad += 1
    return records, bad


def append_records(path: str, records: Iterable[Mapping[str, Any]]) -> None:
    if not records:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode("utf-8")
    try:  # O_NOFOLLOW: a planted symlink is refused, never appended through
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        if os.path.islink(path):
            raise UserError(f"{path} is a symbolic link; refusing to append through it "
                            f"(remove it and rerun)") from None
        raise
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite_records(path: str, records: Iterable[Mapping[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


@dataclass
class CellState:
    """Where a cell stands after reconciliation."""
    pool: int
    location: str
    breed: str
    directory: str
    manifest: str
    records: list = field(default_factory=list)

    @property
    def kept(self) -> int:
        return sum(1 for r in self.records if r["status"] == "kept")

    @property
    def attempts(self) -> int:
        return len(self.records)

    @property
    def next_attempt(self) -> int:
        return max((int(r["attempt"]) for r in self.records), default=-1) + 1


def reconcile(dataset_dir: str, pool: int, location: str, breed: str, backend: str) -> CellState:
    """Repair one cell after an interruption (see the module docstring); returns its state."""
    directory = cell_dir(dataset_dir, pool, location, breed)
    mpath = manifest_path(dataset_dir, pool, location, breed)
    records, bad = read_records(mpath)
    present = set(list_images(directory))
    clean, dropped = [], 0
    for rec in records:
        if rec["status"] == "kept" and (rec.get("file") or "").split("/")[-1] not in present:
            dropped += 1
            continue
        clean.append(rec)
    recorded = {(r.get("file") or "").split("/")[-1] for r in clean if r["status"] == "kept"}
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if name.startswith(".tmp-"):
                os.unlink(path)              # a write killed half-way
            elif NAME_RE.match(name) and name not in recorded:
                os.unlink(path)              # written, but its record never landed
    if bad or dropped:
        rewrite_records(mpath, clean)
    return CellState(pool, location, breed, directory, mpath, clean)


def read_manifest(dataset_dir: str) -> list[dict[str, Any]]:
    """All records of every cell, as one list (for inspection and tests)."""
    out: list[dict[str, Any]] = []
    mdir = os.path.join(dataset_dir, "manifests")
    if not os.path.isdir(mdir):
        return out
    for name in sorted(os.listdir(mdir)):
        if name.endswith(".jsonl"):
            out.extend(read_records(os.path.join(mdir, name))[0])
    return out
