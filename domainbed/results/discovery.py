"""Finding a sweep's run directories (`walk`), never through a symlink or into predictions."""
from __future__ import annotations

import contextlib
import os
import stat

from domainbed.results.reader import DONE_FILE, PREDICTIONS_DIR, RESULTS_FILE

# File systems whose directories have 2 + one link per subdirectory (GNU find's leaf
# optimisation trusts them); elsewhere (btrfs, overlayfs, NFS ...) every one is listed
SUBDIRECTORY_LINKS = frozenset(("ext2", "ext3", "ext4", "xfs", "tmpfs"))
_FILE_SYSTEMS: dict[int, str | None] = {}   # (by device)


def _file_system(device: int) -> str | None:
    """The type of the file system mounted from `device` (/proc/self/mountinfo)."""
    try:
        wanted = f"{os.major(device)}:{os.minor(device)}"
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for fields in map(str.split, f):
                if len(fields) > 7 and fields[2] == wanted and "-" in fields[6:]:
                    at = fields.index("-", 6) + 1
                    return fields[at] if at < len(fields) else None
    except (OSError, AttributeError):
        return None
    return None


def _is_leaf(st: os.stat_result) -> bool:
    """Whether the directory of this stat holds no subdirectory, by its link count."""
    if st.st_nlink == 2 and st.st_dev not in _FILE_SYSTEMS:
        _FILE_SYSTEMS[st.st_dev] = _file_system(st.st_dev)
    return st.st_nlink == 2 and _FILE_SYSTEMS[st.st_dev] in SUBDIRECTORY_LINKS


def _leaf_entries(base: str) -> tuple[bool, bool, tuple[int, int, int] | None] | None:
    """(holds a results.jsonl that is no directory, holds a ``done`` that exists, its key
    (`walk`)) of the directory `base` (ending in a separator), by stats (a link's target
    as is_dir sees it); None where one fails oddly."""
    key = None
    try:
        st = os.lstat(base + RESULTS_FILE)
        if stat.S_ISREG(st.st_mode):
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
        elif stat.S_ISLNK(st.st_mode):
            st = os.stat(base + RESULTS_FILE)
        if stat.S_ISDIR(st.st_mode):
            return False, False, None
    except FileNotFoundError:   # (or a link to nothing: an entry still)
        if not os.path.lexists(base + RESULTS_FILE):
            return False, False, None
    except OSError:
        return None
    try:
        return True, os.stat(base + DONE_FILE) is not None, key
    except FileNotFoundError:
        return True, False, key
    except OSError:
        return None


def _listing(path: str) -> tuple[list[str], tuple[bool, bool, tuple[int, int, int] | None]]:
    """(subdirectories to enter, (holds a results.jsonl entry, holds a ``done``, its key))."""
    children, has_results, has_done, key = [], False, False, None
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
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        key = (st.st_size, st.st_mtime_ns, st.st_ino) if stat.S_ISREG(
                            st.st_mode) else None
    except OSError:
        pass
    return children, (has_results, has_done, key)


def walk(top: str) -> list[tuple[str, bool, tuple[int, int, int] | None]]:
    """(run directory, has ``done``, its results.jsonl's (size, mtime_ns, inode) or None)
    of every directory under `top` (itself included) holding a ``results.jsonl`` entry, in
    os.walk's order; a directory whose link count shows no subdirectory is not listed."""
    found: list[tuple[str, bool, tuple[int, int, int] | None]] = []
    stack = [iter([top])]    # (the sorted paths left to enter, at each depth)
    while stack:
        path = next(stack[-1], None)
        if path is None:
            stack.pop()
            continue
        try:
            st = os.lstat(path) if path is not top else os.stat(path)
        except OSError:
            continue
        base = path if path.endswith(os.sep) else path + os.sep
        entries, children = _leaf_entries(base) if _is_leaf(st) else None, list[str]()
        if entries is None:
            children, entries = _listing(path)
        if entries[0]:
            found.append((path, *entries[1:]))
        if children:
            stack.append(iter([base + name for name in sorted(children)]))
    return found
