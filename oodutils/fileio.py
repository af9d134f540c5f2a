"""Atomic writes: a reader (or a resumed run) never sees a half-written file.

A write goes to a temp file with an unpredictable name in the target's directory, then
`os.replace` renames it over the target (so a symlink at the target is replaced, never
written through). The result has the mode a plain `open()` would give under the process
umask (0644 under umask 022), not mkstemp's 0600, so teammates sharing a sweep directory
can read it. With ``durable=True`` the directory is fsynced after the rename, so the new
name survives a power cut (records, `done`). A full disk is one UserError naming the
file and the space left. A folder others can write (a run directory in a shared sweep)
is written through `oodutils.pinned_dir.PinnedDir`, which follows no symlink in it.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Sequence
from typing import Any

from oodutils.errors import UserError
from oodutils.pinned_dir import Buffer, PinnedDir
from oodutils.text import encodable, utf8_bytes


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | Sequence[Buffer],
                       durable: bool = False) -> None:
    """Write `path` atomically (see `PinnedDir.write_bytes`; `data` may come in pieces);
    its folder is made when missing and may itself be reached through symlinks (the
    caller chose it)."""
    path = os.fspath(path)
    with PinnedDir.open(os.path.dirname(path) or ".", create=True, follow=True) as folder:
        folder.write_bytes(os.path.basename(path), data, durable=durable)


def atomic_write_text(path: str | os.PathLike[str], text: str, durable: bool = False) -> None:
    atomic_write_bytes(path, utf8_bytes(text), durable=durable)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def npz_bytes(compressed: bool = True, *, level: int | None = None, **arrays: Any) -> bytes:
    """The bytes np.savez(_compressed) would write for `arrays`; `level` (1-9): deflate at
    that zlib level instead of numpy's (level 1 writes a checkpoint's predictions faster,
    for somewhat larger files; np.load reads either)."""
    import numpy as np  # heavy: the commands import this module before parsing their flags
    buf = io.BytesIO()
    if level is None:
        (np.savez_compressed if compressed else np.savez)(buf, **arrays)
        return buf.getvalue()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return buf.getvalue()


def torch_bytes(obj: Any) -> bytes:
    """The bytes torch.save would write for `obj`."""
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def atomic_savez(path: str | os.PathLike[str], compressed: bool = True, **arrays: Any) -> None:
    atomic_write_bytes(path, npz_bytes(compressed, **arrays))


def atomic_torch_save(path: str | os.PathLike[str], obj: Any, durable: bool = False) -> None:
    atomic_write_bytes(path, torch_bytes(obj), durable=durable)


def atomic_move_aside(path: str, suffix: str = ".prev") -> str | None:
    """Rename `path` to the first free name of `path.prev`, `path.prev.1`, ... (an older
    copy is never replaced) and fsync the folder; returns the new name, or None when
    `path` does not exist."""
    path = os.fspath(path)
    with PinnedDir.open(os.path.dirname(path) or ".", follow=True) as folder:
        return folder.move_aside(os.path.basename(path), suffix)


def file_name_part(name: object) -> str:
    """`name` made safe inside one file name: a dataset named by a path (``folder:/a/b``)
    must not add directories to a plot's file name. A name over 100 characters becomes
    its first 60 and ``-`` with the first 10 hex digits of its sha256, so a file name
    stays within the file system's limit (255 bytes) and distinct names stay distinct."""
    text = encodable(str(name))
    safe = "".join(ch if ch.isalnum() or ch in "._-@" else "_" for ch in text)
    if len(safe.encode("utf-8")) <= 100:
        return safe
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return safe.encode("utf-8")[:60].decode("utf-8", "ignore") + "-" + digest


def check_output_path(path: str | os.PathLike[str] | None, what: str,
                      directory: bool = False) -> None:
    """A UserError before any work when `path` cannot be written: a file where a folder
    is wanted (or the reverse), a file among its parents, or a parent where no file can be
    made (tried, not guessed from the mode bits: root passes those, ``/proc`` or a
    read-only mount still refuse). None (an output not asked for) passes."""
    if path is None:
        return
    path = os.fspath(path)
    if not path.strip():
        raise UserError(f"{what} is empty: give a path")
    if not directory and path.endswith((os.sep, "/")):
        raise UserError(f"{what} {path!r} ends with {path[-1]!r}, so it names a folder; "
                        "give a file name")
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass                # (a file among the parents: named below)
    except OSError as e:    # a name too long, a loop of symlinks
        raise UserError(f"{what} {path!r} cannot be written ({e.strerror})") from None
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{what} {path!r} is a file, not a directory")
    if not directory and os.path.isdir(path):
        raise UserError(f"{what} {path!r} is a directory, not a file")
    existing = os.path.dirname(os.path.abspath(path)) if not directory else \
        os.path.abspath(path)
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise UserError(f"{what} {path!r} sits under {existing!r}, which is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path!r}: {existing!r} is not writable")
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-write-check-", dir=existing)
    except OSError as e:
        raise UserError(f"{what} {path!r} cannot be written: no file can be made in "
                        f"{existing!r} ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def finite_json(obj: Any) -> Any:
    """NaN and infinities become None (null), recursively, so the JSON written is strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
