"""Finding the run directories under an input directory, as ``os.walk`` finds them (every
directory holding a ``results.jsonl`` file entry, at any depth, ``predictions`` folders and
symlinked directories not entered, children in sorted order), with one ``stat`` per
directory where a previous walk is known: a directory whose stat key (mtime ns, ctime ns,
inode, device) is the stored one has the same entries, so its stored listing stands (a
file rewritten inside it does not change the directory's key, but the records index stats
every results.jsonl anyway). A directory changed in the last ``SETTLE_NS`` is not
remembered (a change in the same clock tick could leave its key unchanged). A directory
whose link count shows it holds no subdirectory (on ext2/3/4, xfs and tmpfs, which count
them) is not listed: a stat of its ``results.jsonl`` and of its ``done`` tell what the
listing would (a run directory: two system calls where a listing takes four).
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from stat import S_ISDIR, S_ISLNK
from typing import NamedTuple

from domainbed.results.parallel_read import lstat_rows, stat_columns

RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
SETTLE_NS = 2_000_000_000
HAS_RESULTS, HAS_DONE = 1, 2
_FILE_TYPE, _DIRECTORY = 0o170000, 0o040000     # stat.S_IFMT's mask, S_IFDIR
_DIRECTORY_KEY = stat_columns("st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")

UNSETTLED = [-1, -1, -1, -1]      # no directory's stat gives this key


class Listings(NamedTuple):
    """What a walk needs of each directory, as parallel lists: its path relative to the
    top ("" for it), stat key, flags (HAS_RESULTS: a results.jsonl entry that is not a
    directory; HAS_DONE: ``done`` exists) and the directories to walk into (sorted, joined
    by "/", which no name holds)."""
    rels: list[str]
    keys: list[list[int]]
    flags: list[int]
    children: list[str]

    @classmethod
    def empty(cls) -> Listings:
        return cls([], [], [], [])


class Walk(NamedTuple):
    """A walk's answer: the run directories (paths, and relative to the top: "" for it)
    and whether each has ``done``; the listing of every directory visited (an unsettled
    one with a key no stat gives, so it is listed again); `changed`: whether any
    directory's entries differ from the known ones (or it is new, or gone)."""
    run_dirs: list[str]
    rels: list[str]
    done: list[bool]
    listings: Listings
    changed: bool


def _list(path: str, st: os.stat_result | None = None) -> tuple[int, str]:
    """A directory's listing, read from the directory (an unreadable one lists nothing,
    as os.walk skips it). `st`: its lstat, where known: one that holds no subdirectory
    (`_is_leaf`) has its flags read from a stat of each of the two names instead."""
    if st is not None and _is_leaf(st):
        flags = _leaf_flags(path)
        if flags is not None:
            return flags, ""
    children, flags = [], 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if entry.name == DONE_FILE and (not entry.is_symlink() or
                                                os.path.exists(entry.path)):
                    flags |= HAS_DONE     # (only a link is followed to see it exists)
                if is_dir:
                    if entry.name != PREDICTIONS_DIR and not entry.is_symlink():
                        children.append(entry.name)
                elif entry.name == RESULTS_FILE:
                    flags |= HAS_RESULTS
    except OSError:
        return 0, ""
    return flags, "/".join(sorted(children))


def _relist(path: str, known_children: str) -> tuple[int, str]:
    """`_list(path)` of a directory whose subdirectories were `known_children`, each
    just found to be one still (`_walk_if_unchanged` lstats them all): its names read
    in one call, only those not known lstatted (the top of a 100,000-run sweep, listed
    again after every index write: 0.28 -> 0.06 s)."""
    try:
        names = os.listdir(path)
    except OSError:
        return 0, ""
    known = set(known_children.split("/")) if known_children else set()
    base = path if path.endswith("/") else path + "/"
    others = set(names).difference(known)
    found = [name for name in others if name != PREDICTIONS_DIR and
             _real_directory(base + name)]
    if found or len(names) - len(others) != len(known):
        children = "/".join(sorted(known.intersection(names).union(found)))
    else:
        children = known_children
    flags = _name_flags(base, RESULTS_FILE in others, DONE_FILE in names)
    return flags, children


def _real_directory(path: str) -> bool:
    try:
        return S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _name_flags(base: str, has_results: bool, has_done: bool) -> int:
    """`_list`'s flags for a results.jsonl entry that is not a known subdirectory (one
    that is not a directory, through a link) and a done entry (one that exists, through
    a link)."""
    flags = 0
    if has_results:
        try:
            flags = 0 if S_ISDIR(os.stat(base + RESULTS_FILE).st_mode) else HAS_RESULTS
        except OSError:
            flags = HAS_RESULTS
    if has_done:
        try:
            linked = S_ISLNK(os.lstat(base + DONE_FILE).st_mode)
        except OSError:
            linked = False     # (gone since: as a listing that saw it)
        if not linked or os.path.exists(base + DONE_FILE):
            flags |= HAS_DONE
    return flags


def _leaf_flags(path: str) -> int | None:
    """`_list`'s flags of a directory holding no subdirectory, from a stat of
    ``results.jsonl`` and of ``done`` (each following a link, as the listing does: a link
    to a directory is no results file, a link to nothing is one); None where a stat fails
    otherwise than for a missing name (then the listing decides)."""
    base = path if path.endswith("/") else path + "/"
    flags = 0
    try:
        if not S_ISDIR(os.stat(base + RESULTS_FILE).st_mode):
            flags = HAS_RESULTS
    except FileNotFoundError:
        try:
            os.lstat(base + RESULTS_FILE)
            flags = HAS_RESULTS
        except FileNotFoundError:
            pass
        except OSError:
            return None
    except OSError:
        return None
    try:
        os.stat(base + DONE_FILE)
        flags |= HAS_DONE
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return flags


# File systems whose directories have one link per subdirectory (2 + subdirectories),
# which GNU find's leaf optimisation trusts too; others (btrfs, overlayfs, NFS, CIFS ...)
# give other counts, and their directories are listed
_SUBDIRECTORY_LINKS = frozenset(("ext2", "ext3", "ext4", "xfs", "tmpfs"))
_LINK_COUNTING: dict[int, bool] = {}     # device -> on such a file system


def _is_leaf(st: os.stat_result) -> bool:
    """Whether the directory of this lstat holds no subdirectory, by its link count."""
    if st.st_nlink != 2:
        return False
    counting = _LINK_COUNTING.get(st.st_dev)
    if counting is None:
        counting = _LINK_COUNTING[st.st_dev] = \
            _file_system(st.st_dev) in _SUBDIRECTORY_LINKS
    return counting


def _file_system(device: int) -> str | None:
    """The type of the file system mounted from `device` (/proc/self/mountinfo), or None
    where it is not found (not Linux)."""
    try:
        wanted = f"{os.major(device)}:{os.minor(device)}"
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 7 and fields[2] == wanted and "-" in fields[6:]:
                    at = fields.index("-", 6) + 1
                    return fields[at] if at < len(fields) else None
    except (OSError, AttributeError):    # (AttributeError: no os.major, as on Windows)
        return None
    return None


def walk(top: str, known: Listings | None = None) -> Walk:
    """The run directories under `top` (itself included) in os.walk's order, listing
    again only the directories whose stat key differs from the one in `known`."""
    known = known or Listings.empty()
    same, fresh = _walk_if_unchanged(top, known)
    if same is not None:
        return same
    return _walk_from([(top, "", -1)], known, fresh)


def walk_children(top: str, names: Sequence[str]) -> Walk:
    """The walk of the subtrees of these children of `top` (none followed where it is a
    symlink), rels relative to `top`: with ``split_walk``'s, `walk(top)` in pieces."""
    base = top if top.endswith("/") else top + "/"
    return _walk_from([(base + name, name, -1) for name in reversed(names)],
                      Listings.empty(), {})


def _walk_from(stack: list[tuple[str, str, int]], known: Listings,
               fresh: dict[str, tuple[list[int], int, str]]) -> Walk:
    """Walk depth first from the (path, rel, -1) on `stack` (the last first); rel "" is
    the top (followed where it is a symlink). A listed child that is gone, or no longer
    a directory, when it is entered is dropped from its parent's listing, whose key is
    then unsettled (listed again next time)."""
    position = dict(zip(known.rels, range(len(known.rels))))
    found = Listings.empty()
    run_dirs: list[str] = []
    rels: list[str] = []
    done: list[bool] = []
    changed = False
    settled = time.time_ns() - SETTLE_NS
    seen_known = 0
    lstat, get, pop, push = os.lstat, position.get, stack.pop, stack.append
    while stack:
        path, rel, parent = pop()
        try:     # below the top, never through a symlink (os.walk does not follow them)
            st = lstat(path) if rel else os.stat(path)
        except OSError:
            st = None
        if st is None or not S_ISDIR(st.st_mode):
            if parent >= 0:
                _drop_child(found, parent, rel.rpartition("/")[2])
                changed = True
            continue
        key = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        at = get(rel)
        if at is not None and known.keys[at] == key:
            flags, children = known.flags[at], known.children[at]
            seen_known += 1
        else:
            listed = fresh.get(rel)
            flags, children = listed[1:] if listed is not None and listed[0] == key else \
                _list(path, st)
            if at is None or known.flags[at] != flags or known.children[at] != children:
                changed = True
            seen_known += at is not None
        found.rels.append(rel)
        found.keys.append(_key(st, settled))
        found.flags.append(flags)
        found.children.append(children)
        if flags & HAS_RESULTS:
            run_dirs.append(path)
            rels.append(rel)
            done.append(bool(flags & HAS_DONE))
        if children:
            base = path if path.endswith("/") else path + "/"
            prefix = rel + "/" if rel else ""
            here = len(found.rels) - 1
            for name in reversed(children.split("/")):
                push((base + name, prefix + name, here))
    return Walk(run_dirs, rels, done, found, changed or seen_known != len(known.rels))


def _drop_child(found: Listings, at: int, name: str) -> None:
    """Take `name` out of listing `at` (it could not be entered), and unsettle its key."""
    found.children[at] = "/".join(child for child in found.children[at].split("/")
                                  if child != name)
    found.keys[at] = UNSETTLED


def _key(st: os.stat_result, settled: int) -> list[int]:
    """A directory's stat key as a listing remembers it (UNSETTLED if changed lately)."""
    if st.st_mtime_ns > settled or st.st_ctime_ns > settled:
        return UNSETTLED
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _empty_walk() -> Walk:
    return Walk([], [], [], Listings.empty(), True)


def split_walk(top: str) -> tuple[Walk, list[str]]:
    """(the walk of `top` not entering its children, their names in order): `walk(top)`
    is that walk extended (``extend``) by ``walk_children`` of consecutive runs of
    the names, so the subtrees can be walked apart (in worker processes)."""
    settled = time.time_ns() - SETTLE_NS
    try:
        st = os.stat(top)
    except OSError:
        return _empty_walk(), []
    if not S_ISDIR(st.st_mode):
        return _empty_walk(), []
    flags, children = _list(top)
    runs = [top] if flags & HAS_RESULTS else []
    walked = Walk(runs, [""] * len(runs), [bool(flags & HAS_DONE)] * len(runs),
                  Listings([""], [_key(st, settled)], [flags], [children]), True)
    return walked, children.split("/") if children else []


def extend(walked: Walk, more: Walk) -> None:
    """Append the walk `more` (of the next children of the same top) to `walked`."""
    walked.run_dirs.extend(more.run_dirs)
    walked.rels.extend(more.rels)
    walked.done.extend(more.done)
    mine, theirs = walked.listings, more.listings
    mine.rels.extend(theirs.rels)
    mine.keys.extend(theirs.keys)
    mine.flags.extend(theirs.flags)
    mine.children.extend(theirs.children)


MAX_RELISTED = 64     # more changed directories: the walk lists them


def _complete(known: Listings) -> bool:
    """Whether the stored listings are a whole walk: every child a listing names is the
    next directory of the walk's order (depth first, children in their listed order), and
    no other. A stored walk that skipped a child (gone while it was walked, or an index
    written by someone else) would hide that child's runs from every re-collect."""
    rels, children = known.rels, known.children
    if rels and children[0] and not any(children[1:]):    # (a flat sweep: at once)
        return rels[0] == "" and rels[1:] == children[0].split("/")
    pending: list[str] = []
    for at in range(1, len(rels)):
        kids = children[at - 1]
        if kids:
            prefix = rels[at - 1] + "/" if rels[at - 1] else ""
            pending.extend(reversed([prefix + name for name in kids.split("/")]) if prefix
                           else reversed(kids.split("/")))
        if not pending or pending.pop() != rels[at]:
            return False
    return not pending and not children[-1]


def _walk_if_unchanged(top: str, known: Listings
                       ) -> tuple[Walk | None, dict[str, tuple[list[int], int, str]]]:
    """(the walk of an unchanged tree, or None; {rel: (key, flags, children)} of the
    directories listed again). One stat per known directory in one pass; a directory whose
    stat key changed (the top's does whenever an index is written in it) is listed again.
    None where a directory is gone, not one, or lists other entries: the walk decides."""
    fresh: dict[str, tuple[list[int], int, str]] = {}
    if not known.rels or known.rels[0] != "" or not _complete(known):
        return None, fresh
    settled = time.time_ns() - SETTLE_NS
    base = top if top.endswith("/") else top + "/"
    paths = [top, *[base + rel for rel in known.rels[1:]]]
    try:
        st = os.stat(top)
    except OSError:
        return None, fresh
    rows = lstat_rows(paths[1:])
    if not S_ISDIR(st.st_mode) or ((rows[:, 0] & _FILE_TYPE) != _DIRECTORY).any():
        return None, fresh
    keys = [[st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev],
            *rows[:, _DIRECTORY_KEY].tolist()]
    if keys != known.keys:
        changed = [0] if keys[0] != known.keys[0] else []   # (the top: after an index write)
        if keys[1:] != known.keys[1:]:      # (compared whole first: usually equal)
            changed += [i for i in range(1, len(keys)) if keys[i] != known.keys[i]]
        if len(changed) > MAX_RELISTED:
            return None, fresh
        for i in changed:
            fresh[known.rels[i]] = (keys[i], *_relist(paths[i], known.children[i]))
        if any(fresh[known.rels[i]][1:] != (known.flags[i], known.children[i])
               for i in changed):
            return None, fresh
        for i in changed:     # (as `_key` remembers a key)
            if keys[i][0] > settled or keys[i][1] > settled:
                keys[i] = UNSETTLED
    at = [i for i, flags in enumerate(known.flags) if flags & HAS_RESULTS]
    listings = Listings(known.rels, keys, known.flags, known.children)
    return Walk([paths[i] for i in at], [known.rels[i] for i in at],
                [bool(known.flags[i] & HAS_DONE) for i in at], listings, False), fresh
