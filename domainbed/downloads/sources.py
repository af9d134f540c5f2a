"""The kinds of download source a dataset family declares (``SOURCES`` in its module of
``domainbed.downloads``): an archive to unpack, a single file, a dataset fetched by hand.
Each has ``run(data_dir)`` (download, verify, place) and ``verify(data_dir)`` (re-check
what is on disk against the published or recorded checksums; a line saying what matched).
"""
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from domainbed.downloads.fetching import (
    check_file,
    expected_sha256,
    extract,
    fetch,
    lock_path,
    read_lock,
    record,
    tree_digest,
)
from oodutils.errors import UserError

GDRIVE = "https://drive.google.com/uc?id="


class Source(Protocol):
    """One step of a dataset's download: `run` places its files under DATA_DIR ("manual"
    where the user must fetch them), `verify` re-checks them (a line saying what matched)."""

    def run(self, data_dir: str) -> str | None: ...

    def verify(self, data_dir: str) -> str: ...


def is_google_drive(url: str) -> bool:
    return url.startswith(GDRIVE)


@dataclass
class Archive:
    """An archive unpacked into DATA_DIR/<subdir>, then top-level entries renamed, then
    `prune(into, names)` (e.g. DomainNet's duplicates) before the tree is recorded."""
    url: str
    name: str
    subdir: str = ""
    renames: dict = field(default_factory=dict)
    sha256: str | None = None
    prune: Callable | None = None

    def run(self, data_dir: str) -> None:
        into = os.path.join(data_dir, self.subdir)
        archive = fetch(self.url, os.path.join(into, self.name), sha256=self.sha256,
                        google_drive=is_google_drive(self.url))
        placed = extract(archive, into)
        for src, dst in self.renames.items():
            target = os.path.join(into, dst)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(into, src), target)
        names = sorted({self.renames.get(n, n) for n in placed})
        if self.prune:
            self.prune(into, names)
        record(os.path.join(into, self.name), tree=names, tree_sha256=tree_digest(into, names))

    def verify(self, data_dir: str) -> str:
        return verify_extracted(os.path.join(data_dir, self.subdir), self.name, self.url,
                                self.sha256)


@dataclass
class File:
    """A single file saved as DATA_DIR/<subdir>/<name>."""
    url: str
    name: str
    subdir: str = ""
    sha256: str | None = None

    def run(self, data_dir: str) -> None:
        fetch(self.url, os.path.join(data_dir, self.subdir, self.name), sha256=self.sha256,
              google_drive=is_google_drive(self.url))

    def verify(self, data_dir: str) -> str:
        return verify_file(os.path.join(data_dir, self.subdir, self.name), self.url,
                           self.sha256)


@dataclass
class Manual:
    """A dataset behind a licence or login: where to get it and the layout expected."""
    where: str
    layout: str

    def run(self, data_dir: str) -> str:
        print(f"  get it from {self.where}\n  and place it as {os.path.join(data_dir, '')}"
              f"{self.layout}")
        return "manual"

    def verify(self, data_dir: str) -> str:
        raise UserError("fetched by hand: no checksum to verify it against")


def verify_extracted(into: str, archive_name: str, url: str, sha256: str | None = None
                     ) -> str:
    """The tree extracted from `archive_name` (or the archive, while it is on disk) against
    the lock in `into`."""
    archive = os.path.join(into, archive_name)
    entry = read_lock(into).get(archive_name, {})
    expected = expected_sha256(archive, sha256)
    if os.path.isfile(archive) and expected:
        check_file(archive, expected, url)
        return f"{archive_name} matches its sha256"
    names, recorded = entry.get("tree"), entry.get("tree_sha256")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and isinstance(recorded, str)):
        raise UserError(f"nothing recorded for {archive_name} in {lock_path(into)}: "
                        "download it with this version to verify it later")
    if tree_digest(into, names) != recorded:
        raise UserError(f"the files extracted from {archive_name} ({', '.join(names)} in "
                        f"{into}) changed since they were downloaded")
    return f"{', '.join(names)} as extracted from {archive_name}"


def verify_file(path: str, url: str, sha256: str | None) -> str:
    """A file on disk against its published or recorded checksum (a line saying which)."""
    expected = expected_sha256(path, sha256)
    if not os.path.isfile(path):
        raise UserError(f"{path} is not on disk: nothing to verify")
    if not expected:
        raise UserError(f"no checksum published or recorded for {path}: download it with "
                        "this version to verify it later")
    check_file(path, expected, url)
    return f"{os.path.basename(path)} matches its {'published' if sha256 else 'recorded'} " \
           "sha256"
