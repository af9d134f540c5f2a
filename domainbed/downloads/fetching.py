"""Downloading and unpacking, done safely: the machinery every download uses.

* ``fetch(url, dst, sha256=None)``: pooch's ``retrieve`` (a temporary file in a staging
  folder beside dst, its hash checked, renamed into place only when it matches; the
  staging folder removed before and after) with ``ResumableDownload`` as its
  downloader: the bytes go to a partial file beside dst (``.<dst name>.<random>.partial``)
  that outlives a failure or a killed process; the next call resumes it with an HTTP Range
  request (a server that ignores Range is answered by starting over; an HTTP 416 is taken as
  "complete" only when the server's stated size is the partial's). The hash checked is the
  one the source publishes (a full SHA-256; the hash prefix in torch hub file names is
  checked after pooch), else the one the first complete download recorded in the lock file
  beside it (``LOCK_FILE``: trust on first use). A partial is resumed only where there is
  such a checksum to verify the result (otherwise it is discarded: it may not be ours). An
  existing dst is checked, not fetched. Google Drive goes through gdown (``google_drive``).
  A tqdm progress bar is shown on a terminal only. Network errors are one-line UserErrors.
* ``record`` / ``read_lock`` / ``tree_digest``: the lock file, and the digest of an
  extracted tree (``--verify`` re-checks a dataset whose archive is gone with it).
* ``extract(archive, into)``: unpacks a tar or zip archive into a fresh temp directory inside
  ``into``; a member that would land outside it (``..``, absolute paths, links out) is a
  UserError (pooch's Untar applies tarfile's "data" filter only from Python 3.12, so the
  unpacking stays here); only a complete extraction is renamed into place, entry by entry,
  so a later run never sees a half-extracted dataset.
"""
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from typing import Any

from tqdm import tqdm

from oodutils.errors import UserError, require
from oodutils.fileio import atomic_write_text
from oodutils.untrusted import parse_json, read_regular_bytes

CHUNK = 1 << 20
LOCK_FILE = "domainbed_checksums.lock.json"  # beside the data: sha256 of first downloads
MAX_LOCK_BYTES = 1 << 20
USER_AGENT = "domainbed-downloader"


def file_digest(path: str, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------- trust on first use (lock)

def lock_path(directory: str) -> str:
    return os.path.join(directory, LOCK_FILE)


def read_lock(directory: str) -> dict[str, dict[str, Any]]:
    """{file name: {"url", "sha256", ...}} of the lock file in `directory` ({} if none);
    a lock that is not a regular JSON file is a UserError, never silently ignored."""
    path = lock_path(directory)
    if not os.path.lexists(path):
        return {}
    try:
        lock = parse_json(read_regular_bytes(path, MAX_LOCK_BYTES))
    except OSError as e:
        raise UserError(f"cannot read the checksum lock {path} ({e})") from None
    if not isinstance(lock, dict) or not all(isinstance(v, dict) for v in lock.values()):
        raise UserError(f"the checksum lock {path} is damaged; restore it or delete it (the "
                        "next download then trusts what it gets)")
    return lock


def recorded_sha256(dst: str) -> str | None:
    """The sha256 the lock beside `dst` recorded at its first download, or None."""
    directory, name = os.path.split(os.path.abspath(dst))
    value = read_lock(directory).get(name, {}).get("sha256")
    return value if isinstance(value, str) and value else None


def record(dst: str, **fields: Any) -> None:
    """Add `fields` to the lock entry of `dst` (the lock beside it)."""
    directory, name = os.path.split(os.path.abspath(dst))
    lock = read_lock(directory)
    lock[name] = {**lock.get(name, {}), **fields}
    atomic_write_text(lock_path(directory), json.dumps(lock, indent=1, sort_keys=True) + "\n")


def expected_sha256(dst: str, sha256: str | None) -> str | None:
    """What a download of `dst` must match: the published checksum, else the lock's."""
    return sha256 or recorded_sha256(dst)


def check_file(path: str, sha256: str, source: str) -> str:
    """A UserError unless the file on disk matches `sha256` (full or prefix); kept as is."""
    actual = file_digest(path)
    if not actual.startswith(sha256.lower()):
        raise UserError(f"{path} does not match the checksum of {source} (expected sha256 "
                        f"{sha256}, got {actual[:len(sha256)]}); delete it and download "
                        "again")
    return actual


def accept(dst: str, url: str, sha256: str | None) -> str:
    """A complete download pooch placed at dst: a published prefix (torch hub's) checked
    (removed on a mismatch); with no checksum published or recorded, its sha256 recorded in
    the lock (trust on first use)."""
    expected = expected_sha256(dst, sha256)
    actual = file_digest(dst)
    if expected and not actual.startswith(expected.lower()):
        os.unlink(dst)
        what = "published" if sha256 else f"recorded in {lock_path(os.path.dirname(dst))}"
        raise UserError(f"checksum mismatch for {url}: expected sha256 {expected} ({what}), "
                        f"got {actual[:len(expected)]}; the download was removed")
    if not expected:
        record(dst, url=url, sha256=actual)
    return dst


def _partials(dst: str) -> list[str]:
    directory, name = os.path.split(os.path.abspath(dst))
    found = glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.*.partial"))
    regular = [p for p in found if os.path.isfile(p) and not os.path.islink(p)]
    return sorted(regular, key=os.path.getsize, reverse=True)   # a link is never resumed


def _partial_file(dst: str, resume: bool = True) -> str:
    """The largest partial download of dst to resume (only where the result will be checked
    against a checksum), or a new one with a random name."""
    existing = _partials(dst)
    for stale in existing[1 if resume else 0:]:
        os.unlink(stale)
    if existing and resume:
        return existing[0]
    directory, name = os.path.split(os.path.abspath(dst))
    fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    os.close(fd)
    return path


def _progress(total: int | None, initial: int, desc: str) -> Any:
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=desc,
                disable=not sys.stderr.isatty(), dynamic_ncols=True)


def _open(url: str, offset: int, timeout: float) -> Any:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    return urllib.request.urlopen(request, timeout=timeout)


def _stream(url: str, partial: str, timeout: float) -> None:
    """Append what the server has beyond the partial's size (or start over where it
    ignores Range); an OSError when the transfer stops short, the bytes received kept."""
    offset = os.path.getsize(partial)
    try:
        response = _open(url, offset, timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing left to fetch, or a stale, oversize partial
            if _complete_size(e.headers) == offset:
                return
            os.truncate(partial, 0)
            return _stream(url, partial, timeout)
        raise
    with response:
        status = getattr(response, "status", None)
        resumed = offset > 0 and status == 206
        length = response.headers.get("Content-Length")
        total = (int(length) + (offset if resumed else 0)) if length else None
        with open(partial, "ab" if resumed else "wb") as f, \
                _progress(total, offset if resumed else 0, os.path.basename(url)) as bar:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                f.flush()   # what arrived is on disk: a killed process resumes from it
                bar.update(len(block))
        if total is not None and os.path.getsize(partial) != total:
            raise OSError(f"connection closed after {os.path.getsize(partial)} of {total} "
                          "bytes")


def _complete_size(headers: Any) -> int | None:
    """The full size a 416 answer states (`Content-Range: bytes */SIZE`), or None."""
    match = re.fullmatch(r"bytes \*/(\d+)", (headers or {}).get("Content-Range", "") or "")
    return int(match.group(1)) if match else None


class ResumableDownload:
    """A pooch downloader (``downloader(url, output_file, pooch)``) that streams into a
    partial file beside the target, kept across failures and processes, resumed with HTTP
    Range (a transfer that stops short is resumed in the same call up to `attempts` times,
    while it makes progress), and handed to pooch, which checks its hash and renames it into
    place."""

    def __init__(self, dst: str, resume: bool, timeout: float = 60, attempts: int = 3
                 ) -> None:
        self.dst, self.resume, self.timeout, self.attempts = dst, resume, timeout, attempts
        self.partial: str | None = None

    def __call__(self, url: str, output_file: str, pooch_instance: Any = None) -> None:
        partial = self.partial = _partial_file(self.dst, resume=self.resume)
        for attempt in range(self.attempts):
            before = os.path.getsize(partial)
            try:
                _stream(url, partial, self.timeout)
                break
            except OSError:
                if os.path.getsize(partial) <= before or attempt == self.attempts - 1:
                    raise
        os.replace(partial, output_file)


class GoogleDrive(ResumableDownload):
    """Google Drive through gdown (its confirmation pages; no Range support there)."""

    def __call__(self, url: str, output_file: str, pooch_instance: Any = None) -> None:
        gdown = require("gdown", extra="download")
        try:
            if gdown.download(url, output_file, quiet=not sys.stderr.isatty()) is None:
                raise UserError(f"could not download {url}; is the network reachable?")
        except UserError:
            raise
        except Exception as e:   # gdown raises many kinds; the user needs one line
            raise UserError(f"could not download {url} ({e}); is the network "
                            "reachable?") from None


def _retrieve(url: str, dst: str, known_hash: str | None,
              downloader: ResumableDownload) -> str:
    """pooch.retrieve, quietly (pooch logs each download to stderr), into a staging folder
    beside dst (``.<dst name>.pooch``: where pooch keeps its temporary file, removed before
    and after, so a killed run leaves nothing there), then renamed to dst."""
    pooch = require("pooch", extra="download")
    directory, name = os.path.split(os.path.abspath(dst))
    staging = os.path.join(directory, f".{name}.pooch")
    _remove_staging(staging)
    pooch_logger = pooch.get_logger()
    level = pooch_logger.level
    pooch_logger.setLevel(logging.WARNING)
    try:
        placed = pooch.retrieve(url, known_hash=f"sha256:{known_hash}" if known_hash else None,
                                fname=name, path=staging, downloader=downloader)
        os.replace(placed, dst)
    finally:
        pooch_logger.setLevel(level)
        _remove_staging(staging)
    return dst


def _remove_staging(staging: str) -> None:
    """Remove the staging folder a download made; anything else by that name (a link, a
    file) is refused, never followed."""
    if os.path.islink(staging) or (os.path.lexists(staging) and not os.path.isdir(staging)):
        raise UserError(f"{staging} is not a folder a download made; remove it and run "
                        "again")
    if os.path.isdir(staging):
        shutil.rmtree(staging)


def fetch(url: str, dst: str, sha256: str | None = None, timeout: float = 60,
          google_drive: bool = False) -> str:
    """Download url to dst through pooch (see the module docstring). Returns dst. An existing
    dst is checked against the published or recorded checksum, not downloaded again."""
    expected = expected_sha256(dst, sha256)
    if os.path.lexists(dst):
        if expected:
            check_file(dst, expected, url)
        return dst
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    kind = GoogleDrive if google_drive else ResumableDownload
    downloader = kind(dst, resume=bool(expected), timeout=timeout)
    full = expected.lower() if expected and len(expected) == 64 else None
    try:
        _retrieve(url, dst, full, downloader)
    except ValueError as e:   # pooch: the hash does not match; its temporary file is gone
        what = "published" if sha256 else f"recorded in {lock_path(os.path.dirname(dst))}"
        got = re.search(r"but got ([0-9a-f]+)", str(e))
        raise UserError(f"checksum mismatch for {url}: expected sha256 {expected} ({what}), "
                        f"got {got.group(1) if got else 'another file'}; the download was "
                        "removed") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        partial = downloader.partial
        kept = partial is not None and os.path.exists(partial) and os.path.getsize(partial) > 0
        if partial is not None and not kept and os.path.exists(partial):
            os.unlink(partial)
        reason = getattr(e, "reason", None) or e
        raise UserError(f"could not download {url} ({reason}); is the network reachable?"
                        + (" Run again to resume." if kept else "")) from None
    return accept(dst, url, sha256)


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def _extract_zip(archive: str, into: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            if os.path.isabs(member.filename) or not _inside(into, os.path.join(
                    into, member.filename)):
                raise UserError(f"{archive}: member {member.filename!r} would be written "
                                "outside the target directory; refusing to extract")
        zf.extractall(into)


def _extract_tar(archive: str, into: str) -> None:
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(into, filter="data")
        except tarfile.FilterError as e:
            raise UserError(f"{archive}: unsafe member ({e}); refusing to extract") from None


def extract(archive: str, into: str, remove: bool = True) -> list[str]:
    """Unpack archive into `into` via a temp dir; returns the top-level names placed."""
    os.makedirs(into, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".extract-", dir=into)
    try:
        try:
            if zipfile.is_zipfile(archive):
                _extract_zip(archive, tmp)
            elif tarfile.is_tarfile(archive):
                _extract_tar(archive, tmp)
            else:
                raise UserError(f"{archive} is neither a tar nor a zip archive")
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
            raise UserError(f"{archive} is damaged or incomplete ({e}); delete it and "
                            "download again") from None
        placed = []
        for name in sorted(os.listdir(tmp)):
            target = os.path.join(into, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            elif os.path.lexists(target):
                os.unlink(target)
            os.replace(os.path.join(tmp, name), target)
            placed.append(name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if remove:
        os.remove(archive)
    return placed


def tree_digest(root: str, names: list[str]) -> str:
    """sha256 over every regular file under root/<name> (relative path and content), in
    sorted order; symlinks count by their target text, never followed."""
    digest = hashlib.sha256()
    for name in sorted(names):
        top = os.path.join(root, name)
        paths = [top] if not os.path.isdir(top) or os.path.islink(top) else sorted(
            os.path.join(d, f) for d, _, files in os.walk(top) for f in files)
        for path in paths:
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            body = os.readlink(path) if os.path.islink(path) else file_digest(path)
            digest.update(f"{rel}\0{body}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()

