"""Finding the run directories under an input directory, as ``os.walk`` finds them (every
directory holding a ``results.jsonl`` file entry, at any depth, ``predictions`` folders and
symlinked directories not entered, children in sorted order), with one ``stat`` per
directory where a previous walk is known: a directory whose stat key (mtime ns, ctime ns,
inode, device) is the stored one has the same entries, so its stored listing stands (a
file rewritten inside it does not change the directory's key, but the records index stats
every results.jsonl anyway). A directory changed in the last ``SETTLE_NS`` is not
remembered (a change in the same clock tick could leave its key unchanged).
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple

RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
SETTLE_NS = 2_000_000_000
HAS_RESULTS, HAS_DONE = 1, 2

DirKey = tuple[int, int, int, int]
UNSETTLED: DirKey = (-1, -1, -1, -1)      # no directory's stat gives it


class Listing(NamedTuple):
    """What a walk needs of one directory: its stat key, flags (HAS_RESULTS: a
    results.jsonl entry that is not a directory; HAS_DONE: ``done`` exists) and the
    directories to walk into (sorted)."""
    key: DirKey
    flags: int
    children: tuple[str, ...]


class Walk(NamedTuple):
    """A walk's answer: the run directories (paths, and relative to the top: "" for it)
    and whether each has ``done``; the listing of every directory visited, by relative
    path (an unsettled one with a key no stat gives, so it is listed again); `changed`:
    whether any directory's entries differ from the known ones (or it is new, or gone)."""
    run_dirs: list[str]
    rels: list[str]
    done: list[bool]
    listings: dict[str, Listing]
    changed: list[bool]


def dir_key(st: os.stat_result) -> DirKey:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _list(path: str, key: DirKey) -> Listing:
    """A directory's listing, read from the directory (an unreadable one lists nothing,
    as os.walk skips it)."""
    children, flags = [], 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if entry.name == DONE_FILE and os.path.exists(entry.path):
                    flags |= HAS_DONE
                if is_dir:
                    if entry.name != PREDICTIONS_DIR and not entry.is_symlink():
                        children.append(entry.name)
                elif entry.name == RESULTS_FILE:
                    flags |= HAS_RESULTS
    except OSError:
        return Listing(key, 0, ())
    return Listing(key, flags, tuple(sorted(children)))


def walk(top: str, known: dict[str, Listing] | None = None) -> Walk:
    """The run directories under `top` (itself included) in os.walk's order, listing
    again only the directories whose stat key differs from the one in `known`."""
    known = known or {}
    found = Walk([], [], [], {}, [False])
    settled = time.time_ns() - SETTLE_NS
    stack = [(top, "")]
    seen_known = 0
    while stack:
        path, rel = stack.pop()
        try:
            key = dir_key(os.stat(path))
        except OSError:
            continue
        listing = before = known.get(rel)
        seen_known += before is not None
        if listing is None or listing.key != key:
            listing = _list(path, key)
            if before is None or before[1:] != listing[1:]:
                found.changed[0] = True
        if not (key[0] <= settled and key[1] <= settled):
            listing = listing._replace(key=UNSETTLED)
        found.listings[rel] = listing
        if listing.flags & HAS_RESULTS:
            found.run_dirs.append(path)
            found.rels.append(rel)
            found.done.append(bool(listing.flags & HAS_DONE))
        prefix = rel + "/" if rel else ""
        stack.extend((os.path.join(path, name), prefix + name)
                     for name in reversed(listing.children))
    if seen_known != len(known):
        found.changed[0] = True
    return found
