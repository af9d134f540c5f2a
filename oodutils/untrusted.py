"""Reading files that others can write (a shared sweep directory, a folder handed over):
only regular files, opened without following a symlink at the last step and without
blocking on a FIFO, read in bounded pieces, so a planted file can make a reader skip it but
never hang it, exhaust its memory or make it read or publish something else.

* ``open_regular(path)``: a binary file object, or ``NotRegularFile`` (an OSError) for a
  symlink, FIFO, device, socket or directory.
* ``read_head_stat(path, max_bytes)``: up to ``max_bytes`` + 1 bytes of a regular file, in
  one small read where the file is small, and its stat taken before the read.
* ``read_lines(path, max_line_bytes)``: the lines of a regular file; a line longer than the
  cap is yielded as ``None`` (its bytes are skipped, never held).
* ``parse_json(text)``: ``json.loads`` that answers ``None`` for anything it cannot parse,
  deep nesting (RecursionError) included.
* ``copy_regular_file(src, dst, max_bytes)``: copies a regular file's bytes into a new file
  with the mode a plain write gives (``oodutils.fileio``), never the source's mode.
* ``array_digest(array)``: the checksum caches store with an entry and verify on read.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from oodutils.errors import UserError
from oodutils.fileio import atomic_write_bytes

CHUNK = 1 << 16


class NotRegularFile(OSError):
    """The path is a symlink, FIFO, device, socket or directory, or is too large."""


def _open_unfollowed(path: str | os.PathLike[str], follow: bool = False) -> int:
    """A read-only descriptor of `path` opened without following a final symlink (one is
    NotRegularFile; `follow`: a link is followed) and without blocking on a FIFO."""
    flags = os.O_RDONLY | (0 if follow else getattr(os, "O_NOFOLLOW", 0)) \
        | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags)
    except OSError as e:
        if not follow and os.path.islink(path):
            raise NotRegularFile(f"{path} is a symlink") from None
        raise e


def open_regular(path: str | os.PathLike[str], follow: bool = False) -> IO[bytes]:
    """`path` opened for reading in binary, after checking (on the open descriptor, so
    nothing can swap it in between) that it is a regular file. `follow`: a symlink is
    followed (a file the user's own tools keep as a link, such as a Hugging Face cache's
    snapshot), its target still a regular file."""
    fd = _open_unfollowed(path, follow)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_lines(path: str | os.PathLike[str], max_line_bytes: int) -> Iterator[bytes | None]:
    """Each line of the regular file `path` as bytes, or None for a line longer than
    `max_line_bytes` (skipped to its end without being kept in memory)."""
    with open_regular(path) as f:
        while True:
            line = f.readline(max_line_bytes + 1)
            if not line:
                return
            if len(line) <= max_line_bytes or line.endswith(b"\n"):
                yield line
                continue
            while line and not line.endswith(b"\n"):
                line = f.readline(CHUNK)
            yield None


def parse_json(text: str | bytes) -> Any:
    """The JSON value of `text`, or None when it is not JSON (or too deeply nested)."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def read_regular_bytes(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file `path`; NotRegularFile when it holds more."""
    with open_regular(path) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotRegularFile(f"{path} is larger than {max_bytes} bytes")
    return data


def read_head_stat(path: str | os.PathLike[str], max_bytes: int
                   ) -> tuple[bytes, os.stat_result]:
    """(at most `max_bytes` + 1 bytes of the regular file `path` (NotRegularFile
    otherwise), its stat taken on the open descriptor before the read): read with as few
    calls and as small a buffer as its size allows, what reading thousands of small files
    at once needs (a file object asked for 16 MiB allocates them). The read stops once it
    has the size the stat gave (a file that grew after it shows in a later stat, which is
    what a cache keys the bytes by)."""
    fd = _open_unfollowed(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        want = min(st.st_size, max_bytes) + 1     # one more: a file too large shows it
        pieces, got = [], 0
        while want > 0:
            piece = os.read(fd, want)
            if not piece:
                break
            pieces.append(piece)
            want -= len(piece)
            got += len(piece)
            if got == st.st_size:
                break       # (no read to see the end: what the stat holds is all there)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces), st
    finally:
        os.close(fd)


def copy_regular_file(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                      max_bytes: int = 64 << 20) -> None:
    """Copy the regular file `src` to `dst` (a fresh file, umask mode); see module doc."""
    atomic_write_bytes(dst, read_regular_bytes(src, max_bytes))


def array_digest(array: Any) -> str:
    """sha256 of an array's dtype, shape and bytes: what a cache stores beside an entry and
    checks on read, so a zeroed, truncated or altered entry is noticed."""
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}|{list(array.shape)}|".encode())
    digest.update(memoryview(array).cast("B") if array.size else b"")
    return digest.hexdigest()


def open_input(path: str | os.PathLike[str], option: str, follow: bool = False
               ) -> IO[bytes]:
    """A file a command was told to read (`option`: its flag, for the message), opened as
    `open_regular` opens run files; anything else is one UserError naming the option and
    why (missing, a symlink: with its target to pass instead, a FIFO or folder)."""
    try:
        return open_regular(path, follow)
    except NotRegularFile:
        if os.path.islink(path):
            raise UserError(f"{option} {os.fspath(path)} is a symbolic link; refusing to "
                            f"follow it (pass the file it points to, "
                            f"{os.path.realpath(path)}, if you trust it)") from None
        raise UserError(f"{option} {os.fspath(path)} is not a regular file (a FIFO, "
                        f"device or folder); refusing to read it") from None
    except FileNotFoundError:
        raise UserError(f"{option} {os.fspath(path)!r} is not a file") from None
    except OSError as e:
        raise UserError(f"{option} {os.fspath(path)} cannot be read "
                        f"({e.strerror or type(e).__name__})") from None


def read_input(path: str | os.PathLike[str], option: str, max_bytes: int,
               follow: bool = False) -> bytes:
    """The bytes of a file a command reads (see `open_input`), at most `max_bytes`."""
    with open_input(path, option, follow) as f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise UserError(f"{option} {os.fspath(path)} is larger than {max_bytes} bytes; "
                            f"refusing to read it")
        data = f.read()     # a regular file: read to its end, sized by its stat
    if len(data) > max_bytes:
        raise UserError(f"{option} {os.fspath(path)} grew past {max_bytes} bytes while "
                        f"being read; refusing it")
    return data
