"""A folder held by its descriptor, so that nobody can redirect what is written inside it.

A shared folder (a sweep directory others can write) may have any entry swapped for a
symlink at any moment, and a path is looked up again at every use, so a check and then
an open races. A descriptor does not: `PinnedDir.open(path)` opens the folder itself with
O_NOFOLLOW (a symlink there is refused), and every file or sub-folder is then reached
relative to that descriptor, again with O_NOFOLLOW. A write lands in the folder that was
checked, or is refused with `UnsafePath`; a read never follows a link, never blocks on a
FIFO and reads only regular files.

Files are written atomically (a temp file with an unpredictable name, then a rename over
the target, which replaces a symlink there and never writes through it), with the mode a
plain open() gets under the umask. A full disk is one `UserError` naming the file and the
free space, never a traceback.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from typing import IO, Union

from oodutils.errors import UserError
from oodutils.text import utf8_bytes

Buffer = Union[bytes, memoryview]     # a piece of a file written in pieces
TMP_PREFIX = ".tmp-"     # a file being written, renamed over its name once whole


class UnsafePath(UserError):
    """A path a run would write or read through is a symlink or not the kind of entry
    expected (a planted link would redirect the write into someone else's files)."""


class NoSpaceLeft(UserError):
    """The disk is full (or the quota spent): which file, how much was needed and left."""


def current_umask() -> int:
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


def unsafe_entry_reason(path: str, st: os.stat_result, want_dir: bool = False,
                        writing: bool = False) -> str | None:
    """Why an entry with lstat result `st` cannot be used, or None. `writing` a file in
    place: one with other hard links is refused too (the write would reach them)."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link; refusing to use it"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory; refusing to use it"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file; refusing to use it"
    if writing and not want_dir and st.st_nlink > 1:
        return f"{path} has other hard links; refusing to write it"
    return None


def _size_text(n: float) -> str:  # type: ignore[return]  # the GiB branch returns
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


class PinnedDir:
    """A directory opened once; its entries are reached through its descriptor only.
    Use as a context manager (or call `close`)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, os.fspath(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str], create: bool = False,
             follow: bool = False) -> PinnedDir:
        """Open `path` as a directory. `follow=False`: its last component must not be a
        symlink (UnsafePath); `create`: make it (and its parents) first."""
        path = os.fspath(path)
        if create:
            try:
                os.makedirs(path, exist_ok=True)
            except FileExistsError:
                pass  # a file or a dangling symlink there: refused just below
        flags = os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW)
        try:
            return cls(os.open(path, flags), path)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    reason = unsafe_entry_reason(path, os.lstat(path), want_dir=True)
                except OSError:
                    reason = None
                if reason:
                    raise UnsafePath(reason) from None
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None  # type: ignore[assignment]  # closed

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit `os` may be gone
            pass

    def __enter__(self) -> PinnedDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def join(self, name: str) -> str:
        """The path of `name` inside this folder, for messages."""
        return os.path.join(self.path, name)

    def lstat(self, name: str) -> os.stat_result | None:
        """lstat of `name` (a symlink is not followed), or None when it does not exist."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.lstat(name) is not None

    def subdir(self, name: str, create: bool = True) -> PinnedDir:
        """The sub-folder `name`, made when missing; a symlink there is refused."""
        if create:
            try:
                os.mkdir(name, 0o777, dir_fd=self.fd)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as e:
            st = self.lstat(name) if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
            if st is not None and unsafe_entry_reason(self.join(name), st, want_dir=True):
                raise UnsafePath(unsafe_entry_reason(self.join(name), st, True)) from None
            raise
        return PinnedDir(fd, self.join(name))

    def open_file(self, name: str, flags: int, mode: int = 0o666) -> int:
        """A descriptor of the regular file `name` (O_NOFOLLOW, never blocking on a FIFO).
        Anything else there, or a file with other hard links when writing (the write
        would reach the other names too), is refused with UnsafePath."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=self.fd)
        except OSError as e:
            st = self.lstat(name) if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR,
                                                  errno.ENOTDIR) else None
            if st is not None and unsafe_entry_reason(self.join(name), st):
                raise UnsafePath(unsafe_entry_reason(self.join(name), st)) from None
            raise
        try:
            writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
            reason = unsafe_entry_reason(self.join(name), os.fstat(fd), writing=writing)
            if reason:
                raise UnsafePath(reason)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_bytes(self, name: str) -> bytes:
        with os.fdopen(self.open_file(name, os.O_RDONLY), "rb") as f:
            return f.read()

    def open_reader(self, name: str) -> IO[bytes]:
        """A binary file object reading the regular file `name`."""
        return os.fdopen(self.open_file(name, os.O_RDONLY), "rb")

    def write_bytes(self, name: str, data: bytes | Sequence[Buffer],
                    durable: bool = False) -> None:
        """Write `name` atomically: temp file, fsync, rename over `name`. `data`: bytes, or
        pieces written one after another (no joined copy). `durable`: fsync the folder
        too, so the new name survives a power cut."""
        tmp = f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o666 & ~current_umask(), dir_fd=self.fd)
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except BaseException:
                self.unlink(tmp)
                raise
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                size = len(data) if isinstance(data, bytes) else \
                    sum(memoryview(piece).nbytes for piece in data)
                raise NoSpaceLeft(self._no_space_message(name, size)) from None
            raise
        if durable:
            self.fsync()

    def _no_space_message(self, name: str, size: int) -> str:
        try:
            st = os.fstatvfs(self.fd)
            left = f"{_size_text(st.f_bavail * st.f_frsize)} left"
        except OSError:
            left = "free space unknown"
        return (f"no space left to write {self.join(name)} ({_size_text(size)} needed, "
                f"{left} on its file system); free some space and rerun")

    def write_text(self, name: str, text: str, durable: bool = False) -> None:
        """`text` as UTF-8 (a lone surrogate, say from a file name in an error, as
        U+FFFD), atomically."""
        self.write_bytes(name, utf8_bytes(text), durable=durable)

    def unlink(self, name: str) -> None:
        """Remove the file or symlink `name` (a link is removed, its target left alone);
        nothing when it does not exist."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def remove_temporaries(self) -> int:
        """Remove the temp files (`.tmp-*`, files or links, never a folder) that writes
        interrupted by a kill left in this folder; how many. Only for a folder no other
        process is writing now (a run under its lock)."""
        removed = 0
        for name in os.listdir(self.fd):
            st = self.lstat(name) if name.startswith(TMP_PREFIX) else None
            if st is not None and not stat.S_ISDIR(st.st_mode):
                self.unlink(name)
                removed += 1
        return removed

    def move_aside(self, name: str, suffix: str = ".prev") -> str | None:
        """Rename `name` to the first free name of `name.prev`, `name.prev.1`, ... (an
        older copy is never replaced); returns the new path, or None when `name` does
        not exist."""
        if self.lstat(name) is None:
            return None
        for n in range(100000):
            aside = name + suffix + (f".{n}" if n else "")
            if self.lstat(aside) is None:
                os.rename(name, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                self.fsync()
                return self.join(aside)
        raise UserError(f"{self.join(name)}: too many older copies beside it; "
                        f"move them away and rerun")

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError:
            pass  # some file systems cannot fsync a directory


def _write_all(fd: int, data: bytes | Sequence[Buffer]) -> None:
    for piece in [data] if isinstance(data, bytes) else data:
        view = memoryview(piece).cast("B")
        while view:
            view = view[os.write(fd, view):]
