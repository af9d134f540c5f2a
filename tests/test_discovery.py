"""The walk that finds run directories (domainbed.results.discovery): the same run
directories in the same order as os.walk (nested runs, `predictions` folders and
symlinked folders not entered, a `done` that is a folder), and with a previous walk's
listings, only changed folders listed again, their changes seen."""
import os

from domainbed.results import discovery


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
    listed = []
    real = discovery._list
    monkeypatch.setattr(discovery, "_list", lambda path: listed.append(path) or real(path))
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
    listed = []
    real = discovery._list
    monkeypatch.setattr(discovery, "_list", lambda path: listed.append(path) or real(path))
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
    listed = []
    real = discovery._list
    monkeypatch.setattr(discovery, "_list", lambda path: listed.append(path) or real(path))
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
    here = parallel_read.lstat_rows(paths)
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
