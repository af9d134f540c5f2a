"""Atomic writes: a reader (or a resumed run) never sees a half-written file.

A write goes to a temp file with an unpredictable name in the target's directory, then
`os.replace` renames it over the target (so a symlink at the target is replaced, never
written through). The result has the mode a plain `open()` would give under the process
umask (0644 under umask 022), not mkstemp's 0600, so teammates sharing a sweep directory
can read it. With ``durable=True`` the directory is fsynced after the rename, so the new
name survives a power cut (records, `done`).
"""
import io
import json
import math
import os
import tempfile

import numpy as np


def current_umask():
    """The process umask: from /proc on Linux (no race with other threads), else by
    setting and restoring it (there is no portable getter)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_directory(directory):
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


def atomic_write_bytes(path, data, durable=False):
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        fsync_directory(directory)


def atomic_write_text(path, text, durable=False):
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_savez(path, compressed=True, **arrays):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def atomic_torch_save(path, obj, durable=False):
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue(), durable=durable)


def atomic_move_aside(path, suffix=".prev"):
    """Rename `path` to `path + suffix` (replacing an older one) and fsync the directory;
    returns the new name, or None when `path` does not exist."""
    if not os.path.lexists(path):
        return None
    aside = path + suffix
    os.replace(path, aside)
    fsync_directory(os.path.dirname(path) or ".")
    return aside


def file_name_part(name):
    """`name` made safe inside one file name: a dataset named by a path (``folder:/a/b``)
    must not add directories to a plot's file name."""
    return "".join(ch if ch.isalnum() or ch in "._-@" else "_" for ch in str(name))


def check_output_path(path, what, directory=False):
    """A UserError before any work when `path` cannot be written: a file where a folder
    is wanted (or the reverse), a file among its parents, or a parent not writable."""
    from oodutils.errors import UserError
    path = os.fspath(path)
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


def finite_json(obj):
    """NaN and infinities become None (null), recursively, so the JSON written is strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
