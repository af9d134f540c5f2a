"""Finding a sweep's run directories (`walk`), never through a symlink or into predictions."""
from __future__ import annotations

import os
import stat

from domainbed.results.reader import DONE_FILE, PREDICTIONS_DIR, RESULTS_FILE

# File systems whose directories have 2 + one link per subdirectory (GNU find's leaf
# optimisation trusts them); elsewhere (btrfs, overlayfs, NFS ...) every one is listed
_SUBDIRECTORY_LINKS = frozenset(("ext2", "ext3", "ext4", "xfs", "tmpfs"))
_LINK_COUNTING: dict[int, bool] = {}


def _file_system(device: int) -> str | None:
    """The type of the file system mounted from `device` (/proc/self/mountinfo)."""
    try:
        wanted = f"{os.major(device)}:{os.minor(device)}"
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 7 and fields[2] == wanted and "-" in fields[6:]:
                    at = fields.index("-", 6) + 1
                    return fields[at] if at < len(fields) else None
    except (OSError, AttributeError):
        return None
    return None


def _is_leaf(st: os.stat_result) -> bool:
    """Whether the directory of this stat holds no subdirectory, by its link count."""
    if st.st_nlink == 2 and st.st_dev not in _LINK_COUNTING:
        _LINK_COUNTING[st.st_dev] = _file_system(st.st_dev) in _SUBDIRECTORY_LINKS
    return st.st_nlink == 2 and _LINK_COUNTING[st.st_dev]


def _leaf_entries(path: str) -> tuple[bool, bool, tuple[int, int, int] | None] | None:
    """(holds a results.jsonl that is no directory, holds a ``done`` that exists, its key
    (`walk`)), by lstats (a link's target as is_dir sees it); None where one fails oddly."""
    found, key = [], None
    base = path if path.endswith(os.sep) else path + os.sep
    for name in (RESULTS_FILE, DONE_FILE):
        try:
            st = os.lstat(base + name)
            if name == RESULTS_FILE and stat.S_ISREG(st.st_mode):
                key = (st.st_size, st.st_mtime_ns, st.st_ino)
            st = os.stat(base + name) if stat.S_ISLNK(st.st_mode) else st
            found.append(name == DONE_FILE or not stat.S_ISDIR(st.st_mode))
        except FileNotFoundError:
            found.append(name == RESULTS_FILE and os.path.lexists(base + name))
        except OSError:
            return None
    return found[0], found[1], key


def _listing(path: str) -> tuple[list[str], bool, bool]:
    """(subdirectories to enter, holds a results.jsonl entry, holds a ``done``)."""
    children, has_results, has_done = [], False, False
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if name == DONE_FILE:
                    has_done = not entry.is_symlink() or os.path.exists(entry.path)
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if is_dir:
                    if name != PREDICTIONS_DIR and not entry.is_symlink():
                        children.append(name)
                elif name == RESULTS_FILE:
                    has_results = True
    except OSError:
        pass
    return children, has_results, has_done


def walk(top: str) -> list[tuple[str, bool, tuple[int, int, int] | None]]:
    """(run directory, has ``done``, its results.jsonl's (size, mtime_ns, inode) or None)
    of every directory under `top` (itself included) holding a ``results.jsonl`` entry, in
    os.walk's order; a directory whose link count shows no subdirectory is not listed."""
    found: list[tuple[str, bool, tuple[int, int, int] | None]] = []
    stack = [top]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(path) if path is not top else os.stat(path)
        except OSError:
            continue
        leaf = _leaf_entries(path) if _is_leaf(st) else None
        children, has_results, has_done, key = ([], *leaf) if leaf is not None else \
            (*_listing(path), None)
        if has_results:
            found.append((path, has_done, key))
        base = path if path.endswith(os.sep) else path + os.sep
        stack.extend(base + name for name in sorted(children, reverse=True))
    return found
