"""The walk that finds run directories (domainbed.results.discovery): the same run
directories in the same order as os.walk (nested runs, `predictions` folders and
symlinked folders not entered, a `done` that is a folder), and with a previous walk's
listings, only changed folders listed again, their changes seen."""
import os

import pytest

from domainbed.results import discovery
from tests.requirements import need_stat_kernel


def _os_walk_runs(top):
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        dirnames[:] = [d for d in dirnames if d != "predictions"]
        if "results.jsonl" in filenames:
            found.append((dirpath, os.path.exists(os.path.join(dirpath, "done"))))
    return found


def _run(path, done=True):
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("{}\n")
    if done:
        (path / "done").write_text("")


def _spy_reads(monkeypatch):
    """The directories read again from the disk (listed, or their names read), in order."""
    read = []
    for name in ("_list", "_relist"):
        real = getattr(discovery, name)
        monkeypatch.setattr(discovery, name, lambda path, *more, real=real:
                            read.append(path) or real(path, *more))
    return read


def _tree(tmp_path):
    top = tmp_path / "sweep"
    _run(top / "b_run")
    _run(top / "a_run", done=False)
    _run(top / "a_run" / "nested")                 # a run inside a run
    _run(top / "c" / "d" / "deep")
    _run(top / "a_run" / "predictions" / "not_a_run")
    (top / "e_run").mkdir()
    (top / "e_run" / "results.jsonl").write_text("{}\n")
    (top / "e_run" / "done").mkdir()               # a folder named done counts, as before
    (tmp_path / "elsewhere").mkdir()
    _run(tmp_path / "elsewhere" / "outside")
    (top / "link").symlink_to(tmp_path / "elsewhere")
    return top


def test_the_walk_finds_what_os_walk_finds_in_its_order(tmp_path):
    top = _tree(tmp_path)
    walked = discovery.walk(str(top))
    assert list(zip(walked.run_dirs, walked.done)) == _os_walk_runs(str(top))
    assert walked.rels == ["a_run", "a_run/nested", "b_run", "c/d/deep", "e_run"]
    assert walked.changed


def test_known_listings_are_reused_and_changes_are_seen(tmp_path, monkeypatch):
    top = _tree(tmp_path)
    monkeypatch.setattr(discovery, "SETTLE_NS", 0)   # settled at once (ctime is now)
    first = discovery.walk(str(top))
    listed = _spy_reads(monkeypatch)
    again = discovery.walk(str(top), first.listings)
    assert listed == [] and not again.changed and again.run_dirs == first.run_dirs
    _run(top / "c" / "d" / "new_run")              # changes c/d's mtime only
    (top / "b_run" / "done").unlink()
    walked = discovery.walk(str(top), again.listings)
    assert sorted(listed) == sorted([str(top / "b_run"), str(top / "c" / "d"),
                                     str(top / "c" / "d" / "new_run")])
    assert walked.changed
    assert list(zip(walked.run_dirs, walked.done)) == _os_walk_runs(str(top))


def test_an_unsettled_folder_is_listed_again_every_time(tmp_path, monkeypatch):
    top = tmp_path / "sweep"
    _run(top / "run")                               # modified just now: not settled
    first = discovery.walk(str(top))
    assert first.listings.keys[0] == discovery.UNSETTLED
    listed = _spy_reads(monkeypatch)
    again = discovery.walk(str(top), first.listings)
    assert str(top) in listed and not again.changed     # listed again, found the same


def test_a_listing_never_leads_through_a_symlink(tmp_path, monkeypatch):
    top = _tree(tmp_path)
    monkeypatch.setattr(discovery, "SETTLE_NS", 0)
    first = discovery.walk(str(top))
    at = first.listings.rels.index("")
    children = first.listings.children[at].split("/")
    first.listings.children[at] = "/".join(sorted(children + ["link"]))   # crafted
    first.listings.keys[at] = list(first.listings.keys[at])
    walked = discovery.walk(str(top), first.listings)
    assert not any("outside" in d for d in walked.run_dirs)


def test_a_tree_whose_listings_are_unchanged_is_statted_not_listed(tmp_path, monkeypatch):
    """A file written into the top (as the records index is) changes the top's stat key
    only: the top is listed again, found the same; every other folder is only statted.
    A folder replaced by a file, or one more changed folder than the stat pass lists,
    goes to the walk, which sees it."""
    top = _tree(tmp_path)
    monkeypatch.setattr(discovery, "SETTLE_NS", 0)
    first = discovery.walk(str(top))
    listed = _spy_reads(monkeypatch)
    (top / "a_file").write_text("")
    again = discovery.walk(str(top), first.listings)
    assert listed == [str(top)] and not again.changed
    assert list(zip(again.run_dirs, again.done)) == _os_walk_runs(str(top))
    assert again.listings.keys[0] != first.listings.keys[0]     # the top's new key kept
    listed.clear()
    third = discovery.walk(str(top), again.listings)
    assert listed == [] and not third.changed
    (top / "b_run" / "results.jsonl").unlink()
    (top / "b_run" / "done").unlink()
    (top / "b_run").rmdir()
    (top / "b_run").write_text("")                  # a file where a run was
    monkeypatch.setattr(discovery, "MAX_RELISTED", 0)
    gone = discovery.walk(str(top), third.listings)
    assert gone.changed and list(zip(gone.run_dirs, gone.done)) == _os_walk_runs(str(top))


def test_a_walk_split_at_the_top_joins_back_to_the_whole_walk(tmp_path):
    """The top's own listing plus each child's subtree walked apart (as worker processes
    walk them) is the whole walk: the same runs, order, done flags and listings."""
    top = _tree(tmp_path)
    whole = discovery.walk(str(top))
    joined, children = discovery.split_walk(str(top))
    assert children == ["a_run", "b_run", "c", "e_run"]      # no link, sorted
    discovery.extend(joined, discovery.walk_children(str(top), children[:1]))
    discovery.extend(joined, discovery.walk_children(str(top), children[1:]))
    assert (joined.run_dirs, joined.rels, joined.done) == \
        (whole.run_dirs, whole.rels, whole.done)
    assert joined.listings == whole.listings
    (tmp_path / "elsewhere" / "results.jsonl").write_text("{}\n")
    assert discovery.walk_children(str(top), ["link"]).run_dirs == []   # not followed
    assert discovery.walk(str(top / "link")).run_dirs != []


def test_stats_taken_half_in_a_forked_child_equal_those_taken_here(tmp_path, monkeypatch):
    from domainbed.results import parallel_read
    top = _tree(tmp_path)
    paths = [str(p) for p in sorted(top.rglob("*"))] + [str(top / "gone")]
    monkeypatch.setattr(parallel_read, "_stat_kernel", lambda: None)
    here = parallel_read.lstat_rows(paths)
    assert (here == parallel_read._stat_rows(paths)).all()
    monkeypatch.setattr(parallel_read, "MIN_STATS", 2)
    monkeypatch.setattr(parallel_read, "workers", lambda: 2)
    forked = parallel_read.lstat_rows(paths)
    assert (forked == here).all() and here.shape == (len(paths), 6)
    assert (here[-1] == -1).all()                               # missing: -1s
    link = paths.index(str(top / "link"))
    assert here[link, 0] == os.lstat(top / "link").st_mode      # a link: not followed
    assert here[link, 4] == os.lstat(top / "link").st_ino
    real, parent = parallel_read._stat_rows, os.getpid()

    def failing_in_the_child(some):
        if os.getpid() != parent:
            raise OSError("the child's stats failed")
        return real(some)
    monkeypatch.setattr(parallel_read, "_stat_rows", failing_in_the_child)
    assert (parallel_read.lstat_rows(paths) == here).all()     # its half taken here


def test_stats_taken_by_the_stat_kernel_in_threads_equal_python_s(tmp_path, monkeypatch):
    from domainbed.results import parallel_read
    need_stat_kernel()
    top = _tree(tmp_path)
    (top / "caf\u00e9").mkdir()
    odd = os.fsdecode(b"not-utf8-\xff")       # a name held as a surrogate escape
    (top / odd).write_text("")
    paths = [str(p) for p in sorted(top.rglob("*"))] + [str(top / "gone"), "",
                                                         str(top / ("x" * 5000))]
    expected = parallel_read._stat_rows(paths)
    assert (expected[-3:] == -1).all() and (expected[:-3] != -1).all()
    assert (parallel_read.lstat_rows(paths) == expected).all()       # one thread
    monkeypatch.setattr(parallel_read, "MIN_THREADED_STATS", 2)
    monkeypatch.setattr(parallel_read, "workers", lambda: 3)
    threaded = parallel_read.lstat_rows(paths)
    assert (threaded == expected).all() and threaded.shape == (len(paths), 6)
    assert parallel_read.lstat_rows([]).shape == (0, 6)
    bad = paths[:4] + ["with\0nul"] + paths[4:]     # one part statted by Python
    with pytest.raises(ValueError):                # (as os.lstat says of it)
        parallel_read.lstat_rows(bad)


def test_the_workers_send_their_chunks_through_a_wide_pipe():
    """The pool's result pipe is widened to 1 MiB (or left alone where that fails)."""
    import multiprocessing

    from domainbed.results import parallel_read
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("pipe sizes are Linux's")
    with open("/proc/sys/fs/pipe-max-size") as f:
        refused = int(f.read()) < parallel_read.RESULT_PIPE_BYTES and os.geteuid() != 0
    with multiprocessing.get_context("fork").Pool(1) as pool:
        before = fcntl.fcntl(pool._outqueue._reader.fileno(), fcntl.F_GETPIPE_SZ)
        parallel_read._widen_result_pipe(pool)
        after = fcntl.fcntl(pool._outqueue._reader.fileno(), fcntl.F_GETPIPE_SZ)
        assert after == (before if refused else parallel_read.RESULT_PIPE_BYTES)
        assert pool.apply(len, ("abc",)) == 3
    parallel_read._widen_result_pipe(object())      # no such pipe: nothing happens


def _leaves(tmp_path):
    """Folders without subfolders, one of each kind of entry the listing tells apart."""
    (tmp_path / "target_dir").mkdir()
    (tmp_path / "target_file").write_text("")
    kinds = {
        "run": {"results.jsonl": "file", "done": "file"},
        "unfinished": {"results.jsonl": "file"},
        "no results": {"done": "file", "out.txt": "file"},
        "empty": {},
        "results to nothing": {"results.jsonl": "dangling"},
        "results to a folder": {"results.jsonl": "to_dir", "done": "file"},
        "results to a file": {"results.jsonl": "to_file"},
        "done to nothing": {"results.jsonl": "file", "done": "dangling"},
        "done to a file": {"results.jsonl": "file", "done": "to_file"},
        "done to a folder": {"results.jsonl": "file", "done": "to_dir"},
    }
    made = {}
    for name, entries in kinds.items():
        folder = tmp_path / name
        folder.mkdir()
        for entry, kind in entries.items():
            path = folder / entry
            if kind == "file":
                path.write_text("{}\n")
            else:
                path.symlink_to(tmp_path / {"dangling": "nothing", "to_dir": "target_dir",
                                            "to_file": "target_file"}[kind])
        made[name] = str(folder)
    return made


def test_a_folder_without_subfolders_reads_from_two_stats_as_its_listing(tmp_path,
                                                                          monkeypatch):
    """Where the link count says a folder has no subfolder (on a file system that counts
    them), its flags come from a stat of results.jsonl and of done: the listing's, for
    files, links to files, links to folders and links to nothing."""
    monkeypatch.setattr(discovery, "_LINK_COUNTING", {})
    monkeypatch.setattr(discovery, "_file_system", lambda device: "ext4")
    for name, folder in _leaves(tmp_path).items():
        st = os.lstat(folder)
        assert discovery._is_leaf(st), name      # (no folder here has a subfolder)
        listed = discovery._list(folder)
        assert discovery._leaf_flags(folder) == listed[0], name
        assert discovery._list(folder, st) == listed, name


def test_a_folder_is_listed_where_the_link_count_cannot_be_trusted(tmp_path, monkeypatch):
    """Other file systems (CIFS gives every folder 2 links), and a folder with
    subfolders, are listed: a nested run is found."""
    _run(tmp_path / "sweep" / "inner" / "run")
    monkeypatch.setattr(discovery, "_LINK_COUNTING", {})
    monkeypatch.setattr(discovery, "_file_system", lambda device: "cifs")
    st = os.lstat(tmp_path / "sweep")
    assert not discovery._is_leaf(os.stat_result((st.st_mode, st.st_ino, st.st_dev, 2,
                                                  *st[4:])))
    assert discovery.walk(str(tmp_path / "sweep")).rels == ["inner/run"]
    monkeypatch.setattr(discovery, "_LINK_COUNTING", {})
    monkeypatch.setattr(discovery, "_file_system", lambda device: "ext4")
    assert not discovery._is_leaf(st)             # (inner: a subfolder)
    assert discovery.walk(str(tmp_path / "sweep")).rels == ["inner/run"]


def test_the_file_system_of_a_device_is_read_from_mountinfo(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        assert discovery._file_system(os.stat(tmp_path).st_dev) is None
        return
    with open("/proc/self/mountinfo") as f:
        types = {line.split(" - ")[1].split()[0] for line in f if " - " in line}
    assert discovery._file_system(os.stat(tmp_path).st_dev) in types
    assert discovery._file_system(os.makedev(4095, 1048575)) is None


def test_a_folder_read_again_by_its_names_lists_as_its_listing(tmp_path):
    """A changed folder is read again from its names (only the names that were not
    subfolders statted): the listing's flags and subfolders, whether the known
    subfolders are current, one is gone or new ones came (a link to a folder and a
    predictions folder are no subfolders; results.jsonl and done as files, links and
    folders)."""
    top = tmp_path / "top"
    for name in ("a", "b", "c", "predictions"):
        (top / name).mkdir(parents=True)
    (tmp_path / "away").mkdir()
    (top / "link").symlink_to(tmp_path / "away")
    (top / "results.txt").write_text("")
    known = discovery._list(str(top))[1]
    assert known == "a/b/c"
    states = [lambda: None,
              lambda: (top / "results.jsonl").write_text("{}\n"),
              lambda: (top / "done").symlink_to(tmp_path / "nothing"),
              lambda: (top / "b").rmdir(),
              lambda: (top / "new").mkdir(),
              lambda: (top / "done").unlink() or (top / "done").mkdir(),
              lambda: (top / "results.jsonl").unlink() or
              (top / "results.jsonl").symlink_to(tmp_path / "away"),
              lambda: (top / "0_first").mkdir()]
    seen = set()
    for change in states:
        change()
        listing = discovery._list(str(top))
        assert discovery._relist(str(top), known) == listing
        seen.add(listing)
    assert len(seen) > 5


def test_a_stored_walk_that_skipped_a_child_is_not_trusted(tmp_path, monkeypatch):
    """Listings that name a child the stored walk holds nothing of (it was gone while
    walked, or someone else wrote them) are walked again, not taken as the tree: the
    child's runs are found."""
    top = _tree(tmp_path)
    monkeypatch.setattr(discovery, "SETTLE_NS", 0)
    first = discovery.walk(str(top))
    assert discovery._complete(first.listings)
    keep = [i for i, rel in enumerate(first.listings.rels) if not rel.startswith("c")]
    skipped = discovery.Listings(*([column[i] for i in keep] for column in first.listings))
    assert "c" in skipped.children[0].split("/") and not discovery._complete(skipped)
    again = discovery.walk(str(top), skipped)
    assert again.changed and "c/d/deep" in again.rels
    assert list(zip(again.run_dirs, again.done)) == _os_walk_runs(str(top))
    assert discovery._complete(again.listings)


def test_a_flat_stored_walk_is_whole_only_with_every_child_in_order():
    """A top whose children hold no folders (a DomainBed sweep) is checked at once: its
    listing must name exactly the walk's next folders, in order."""
    def flat(rels, kids="a/b/c"):
        return discovery.Listings(rels, [[0] * 4] * len(rels), [0] * len(rels),
                                  [kids] + [""] * (len(rels) - 1))
    assert discovery._complete(flat(["", "a", "b", "c"]))
    for rels in (["", "a", "c"], ["", "a", "c", "b"], ["", "a", "b", "c", "d"],
                 ["x", "a", "b", "c"], ["", "a", "b", "b"]):
        assert not discovery._complete(flat(rels))
    assert not discovery._complete(flat(["", "a/x", "b", "c"], "a/b/c"))
    assert discovery._complete(flat([""], ""))


def test_a_child_gone_while_walked_leaves_its_parent_to_be_listed_again(tmp_path,
                                                                        monkeypatch):
    """A child directory listed but gone by the time the walk enters it is dropped from
    its parent's stored listing, which is unsettled: the next walk lists the parent
    again and finds the child's runs once it is back."""
    top = _tree(tmp_path)
    monkeypatch.setattr(discovery, "SETTLE_NS", 0)
    real = os.lstat

    def lstat_while_c_is_gone(path, *args, **kwargs):
        if str(path) == str(top / "c"):
            raise FileNotFoundError(path)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "lstat", lstat_while_c_is_gone)
    raced = discovery.walk(str(top))
    monkeypatch.setattr(os, "lstat", real)
    assert "c" not in raced.listings.children[0].split("/")
    assert raced.listings.keys[0] == discovery.UNSETTLED
    assert discovery._complete(raced.listings) and "c/d/deep" not in raced.rels
    again = discovery.walk(str(top), raced.listings)
    assert list(zip(again.run_dirs, again.done)) == _os_walk_runs(str(top))
