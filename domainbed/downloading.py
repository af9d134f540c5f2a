"""Downloading and unpacking, done safely: the generic machinery every download uses.

* ``fetch(url, dst, sha256=None)``: streams into a temp file in dst's directory (a random
  name, ``.<dst name>.<random>.partial``); an interrupted download leaves that file, and the
  next call resumes it with an HTTP Range request (a server that ignores Range is answered by
  starting over). The checksum the source publishes (a full SHA-256, or the hash prefix in
  torch hub file names) is verified before the file gets its final name; a mismatch removes
  it. A tqdm progress bar is shown on a terminal only. Network errors are one-line UserErrors.
* ``extract(archive, into)``: unpacks a tar or zip archive into a fresh temp directory inside
  ``into``; a member that would land outside it (``..``, absolute paths, links out) is a
  UserError; only a complete extraction is renamed into place, entry by entry, so a later
  run never sees a half-extracted dataset.
"""
import glob
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile

from oodutils.errors import UserError

CHUNK = 1 << 20
USER_AGENT = "domainbed-downloader"


def file_digest(path, algorithm="sha256"):
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path, sha256, source):
    """sha256: the full hex digest, or a prefix of it (torch hub's `name-<prefix>.pth`)."""
    if not sha256:
        return
    actual = file_digest(path)
    if not actual.startswith(sha256.lower()):
        os.unlink(path)
        raise UserError(f"checksum mismatch for {source}: expected sha256 {sha256}, got "
                        f"{actual[:len(sha256)]}; the file was removed, run again")


def _partials(dst):
    directory, name = os.path.split(os.path.abspath(dst))
    return sorted(glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.*"
                                         ".partial")), key=os.path.getsize, reverse=True)


def _partial_file(dst):
    """The largest partial download of dst to resume, or a new one with a random name."""
    existing = _partials(dst)
    for stale in existing[1:]:
        os.unlink(stale)
    if existing:
        return existing[0]
    directory, name = os.path.split(os.path.abspath(dst))
    fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=directory)
    os.close(fd)
    return path


def _progress(total, initial, desc):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, desc=desc,
                disable=not sys.stderr.isatty(), dynamic_ncols=True)


def _open(url, offset, timeout):
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    return urllib.request.urlopen(request, timeout=timeout)


def _stream(url, partial, timeout):
    offset = os.path.getsize(partial)
    try:
        response = _open(url, offset, timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing left to fetch: the partial file is complete
            return
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
                bar.update(len(block))
        if total is not None and os.path.getsize(partial) != total:
            raise OSError(f"connection closed after {os.path.getsize(partial)} of {total} "
                          "bytes")


def fetch(url, dst, sha256=None, timeout=60):
    """Download url to dst (see the module docstring). Returns dst."""
    if os.path.exists(dst):
        return dst
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    partial = _partial_file(dst)
    try:
        _stream(url, partial, timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        kept = os.path.exists(partial) and os.path.getsize(partial) > 0
        if not kept and os.path.exists(partial):
            os.unlink(partial)
        reason = getattr(e, "reason", None) or e
        raise UserError(f"could not download {url} ({reason}); is the network reachable?"
                        + (" Run again to resume." if kept else "")) from None
    verify(partial, sha256, url)
    os.replace(partial, dst)
    return dst


def _inside(root, path):
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def _extract_zip(archive, into):
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            if os.path.isabs(member.filename) or not _inside(into, os.path.join(
                    into, member.filename)):
                raise UserError(f"{archive}: member {member.filename!r} would be written "
                                "outside the target directory; refusing to extract")
        zf.extractall(into)


def _extract_tar(archive, into):
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(into, filter="data")
        except tarfile.FilterError as e:
            raise UserError(f"{archive}: unsafe member ({e}); refusing to extract") from None


def extract(archive, into, remove=True):
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


def fetch_and_extract(url, into, archive_name, sha256=None):
    """Download an archive into `into` (resumable, verified) and unpack it there."""
    archive = fetch(url, os.path.join(into, archive_name), sha256=sha256)
    return extract(archive, into)
