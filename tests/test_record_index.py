"""The records index (domainbed.results.record_index): collect_results prints the same bytes
cold and through the index, as the code before it did (golden output of a replicated
sweep); the index serves a file only while the file is unchanged (changed in place, touched,
replaced, truncated, deleted, new: read again), and a corrupt, crafted or symlinked index
is ignored with a warning and rebuilt, never trusted."""
import importlib.util
import json
import os
import pickle
import shutil
import struct
import time
from pathlib import Path

import pytest

from domainbed.results import record_index, sweep_reader
from domainbed.results import records as rec
from domainbed.scripts import collect_results
from tests.test_collect_results import run_main, sweep_copy

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "replicated_sweep"
PAST_NS = time.time_ns() - 3600 * 10**9   # an hour ago: settled, so the index stores it


def _settle(sweep):
    """Date every file an hour back (the index does not store a file modified just now)."""
    for path in Path(sweep).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, ns=(PAST_NS, PAST_NS))


def _sweep_replica():
    spec = importlib.util.spec_from_file_location("sweep_replica",
                                                  ROOT / "scripts" / "sweep_replica.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, params=["one process", "worker processes"])
def readers(request, monkeypatch):
    """Every test with the files read in this process, and again by two worker processes
    (an unindexed sweep's subtrees walked and read by them, three children a batch)."""
    if request.param == "worker processes":
        from domainbed.results import parallel_read
        monkeypatch.setattr(parallel_read, "MIN_FILES", 2)
        monkeypatch.setattr(parallel_read, "CHUNK", 3)
        monkeypatch.setattr(parallel_read, "workers", lambda: 2)
    return request.param


@pytest.fixture
def sweep(tmp_path):
    """A copy of DomainBed's test sweep (40 runs of 5 records), settled."""
    copy = sweep_copy(tmp_path)
    (copy / record_index.INDEX_FILE).unlink(missing_ok=True)  # another reader's index
    _settle(copy)
    return copy


class _Reads:
    """The run directories read from their files, logged to a file so that reads in
    worker processes count too (in no particular order between processes)."""

    def __init__(self, log):
        self.log = log
        self.clear()

    def clear(self):
        self.log.write_text("")

    def _names(self):
        return self.log.read_text().split()

    def __len__(self):
        return len(self._names())

    def __eq__(self, other):
        return sorted(self._names()) == sorted(other)

    def __repr__(self):
        return repr(self._names())


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """The run directories whose results.jsonl was read from the file (not the index)."""
    seen = _Reads(tmp_path / "reads.log")
    real = sweep_reader.read_run_parts

    def counting(run_dir, notes=None, fields=None):
        with open(seen.log, "a") as log:
            log.write(os.path.basename(run_dir) + "\n")
        return real(run_dir, notes, fields)

    monkeypatch.setattr(sweep_reader, "read_run_parts", counting)
    return seen


def _load(sweep):
    return rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS)


def _first_run(sweep):
    return sorted(p.parent for p in Path(sweep).glob("*/results.jsonl"))[0]


def test_replicated_sweep_prints_the_golden_bytes_cold_and_through_the_index(tmp_path, reads):
    sweep = tmp_path / "replica"
    _sweep_replica().build_sweep(sweep, runs=400, checkpoints=3)
    _settle(sweep)
    for fmt, suffix in (("text", "txt"), ("csv", "csv")):
        golden = (GOLDEN / f"results_400x3.{suffix}").read_text()
        cold = run_main(collect_results, ["--input_dir", str(sweep), "--no_save",
                                          "--format", fmt])
        reads.clear()
        warm = run_main(collect_results, ["--input_dir", str(sweep), "--no_save",
                                          "--format", fmt])
        assert reads == []                     # every file came from the index
        assert cold == golden and warm == golden


def test_index_records_equal_the_files_records(sweep, reads):
    from_files = rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS,
                                  use_index=False)
    _load(sweep)
    assert (sweep / record_index.INDEX_FILE).is_file()
    reads.clear()
    warm = _load(sweep)
    assert reads == []
    assert warm.records == from_files.records and warm.run_dirs == from_files.run_dirs
    assert [list(r) for r in warm.records] == [list(r) for r in from_files.records]


def test_a_file_changed_in_place_with_its_size_and_mtime_kept_is_read_again(sweep, reads):
    _load(sweep)
    path = _first_run(sweep) / "results.jsonl"
    text = path.read_text()
    changed = text.replace('"step": 0', '"step": 7', 1)
    assert len(changed) == len(text) and changed != text
    with open(path, "r+") as f:        # same inode, same size
        f.write(changed)
    os.utime(path, ns=(PAST_NS, PAST_NS))   # same mtime: only the change time tells
    reads.clear()
    loaded = _load(sweep)
    assert reads == [path.parent.name]
    assert 7 in [r["step"] for r in loaded.records if r["run_dir"] == str(path.parent)]


@pytest.mark.parametrize("how", ["touched", "replaced", "truncated"])
def test_a_touched_replaced_or_truncated_file_is_read_again(sweep, reads, how):
    _load(sweep)
    path = _first_run(sweep) / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if how == "touched":
        os.utime(path, ns=(PAST_NS + 10**9, PAST_NS + 10**9))
    elif how == "replaced":                 # a new inode, same bytes, same mtime
        fresh = path.with_name("fresh")
        fresh.write_text("".join(lines))
        os.utime(fresh, ns=(PAST_NS, PAST_NS))
        os.replace(fresh, path)
    else:
        path.write_text("".join(lines[:2]))
        os.utime(path, ns=(PAST_NS, PAST_NS))
    reads.clear()
    loaded = _load(sweep)
    assert reads == [path.parent.name]
    mine = [r for r in loaded.records if r["run_dir"] == str(path.parent)]
    assert len(mine) == (2 if how == "truncated" else len(lines))


def test_a_deleted_run_drops_out_and_a_new_run_is_read(sweep, reads):
    first = _load(sweep)
    gone = _first_run(sweep)
    shutil.rmtree(gone)
    new = sweep / "zz_new_run"
    shutil.copytree(sorted(p.parent for p in sweep.glob("*/results.jsonl"))[0], new)
    _settle(new)      # (dating a file changes its change time: only the new run's)
    reads.clear()
    loaded = _load(sweep)
    assert reads == ["zz_new_run"]
    assert str(gone) not in loaded.run_dirs and str(new) in loaded.run_dirs
    assert len(loaded.records) == len(first.records)   # one run of 5 records for another
    reads.clear()
    _load(sweep)
    assert reads == []                      # the rebuilt index holds the new run


def test_a_file_written_just_now_is_not_stored(sweep, reads):
    _load(sweep)
    path = _first_run(sweep) / "results.jsonl"
    path.write_text(path.read_text())       # mtime now: a same-tick rewrite could hide
    for _ in range(2):
        reads.clear()
        _load(sweep)
        assert reads == [path.parent.name]


def _header(data):
    """(header dict, where the arrays start) of an index file's bytes."""
    size = len(record_index.MAGIC)
    header_end = record_index.PREFIX + int.from_bytes(data[size:size + 8], "little")
    return json.loads(data[record_index.PREFIX:header_end]), header_end


def _with_value(data, array, index, value, fmt="<q"):
    """The index with element `index` of a named array set to `value`."""
    header, base = _header(data)
    dtype, _, offset = header["arrays"][array]
    at = base + offset + struct.calcsize(fmt) * index
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt):]


def _with_step(data, step):
    """The index with the last record of layout 0 given this step value (in its float64
    matrix, where the numbers live)."""
    header, _ = _header(data)
    keys, _ = header["layouts"][0]
    rows, width = header["arrays"]["matrix0"][1]
    return _with_value(data, "matrix0", (rows - 1) * width + keys.index("step"), step,
                       "<d")


def _corrupt_variants(data):
    header, header_end = _header(data)
    crafted = data.replace(b'"step"]', b'"stepx"]', 1)      # a column renamed
    bad_value = data.replace(b'"\\"VLCS\\""', b'"[\\"VLCS\\"]"', 1)   # dataset a list
    assert crafted != data and bad_value != data
    n_codes = len(header["values"][0])
    return {"garbage": b"\x00" * 100, "truncated": data[:header_end - 10],
            "overlapping": _with_value(data, "block_offset", 1, 0),
            "code out of range": _with_value(data, "block_keys", 0, n_codes),
            "fractional step": _with_step(data, 100.5),
            "negative step": _with_step(data, -100.0),
            "huge step": _with_step(data, 2.0 ** 60),
            "cut values": data[:-8], "crafted keys": crafted, "bad value": bad_value,
            "pickle": b"\x80\x04\x95" + data, "old version": data.replace(
                b'"version": 3', b'"version": 2', 1),
            "head in its header": _with_head(data, record_index.PREFIX + 1),
            "head in a blob": _with_head(data, len(data) - 8)}


def _with_head(data, head):
    """The index with its prefix's head length (where the lazily read blobs start) set."""
    at = len(record_index.MAGIC) + 8
    return data[:at] + head.to_bytes(8, "little") + data[at + 8:]


@pytest.mark.parametrize("variant", ["garbage", "truncated", "cut values", "crafted keys",
                                     "bad value", "pickle", "overlapping",
                                     "code out of range", "old version",
                                     "fractional step", "negative step", "huge step",
                                     "head in its header", "head in a blob"])
def test_a_corrupt_or_crafted_index_is_ignored_with_a_warning_and_rebuilt(sweep, reads,
                                                                         variant, capsys):
    expected = _load(sweep).records
    index = sweep / record_index.INDEX_FILE
    index.write_bytes(_corrupt_variants(index.read_bytes())[variant])
    reads.clear()
    loaded = _load(sweep)
    assert len(reads) == 40                 # nothing taken from the bad index
    assert loaded.records == expected
    assert any("ignored the records index" in n for n in loaded.notes)
    # the package loggers write to stderr and do not propagate (oodutils.log): read stderr,
    # which caplog sees only from pytest 9.2 on
    stderr = capsys.readouterr().err
    assert "ignored the records index" in stderr
    if variant == "overlapping":
        assert "overlap" in stderr
    reads.clear()
    _load(sweep)
    assert reads == []                      # rebuilt


def test_a_symlinked_index_is_not_followed_and_is_replaced(sweep, reads, tmp_path):
    _load(sweep)
    index = sweep / record_index.INDEX_FILE
    target = tmp_path / "elsewhere"
    target.write_bytes(index.read_bytes())
    index.unlink()
    index.symlink_to(target)
    reads.clear()
    loaded = _load(sweep)
    assert len(reads) == 40 and any("ignored the records index" in n for n in loaded.notes)
    assert not index.is_symlink() and index.is_file()   # rebuilt as a file of its own
    assert target.read_bytes()[:len(record_index.MAGIC)] == record_index.MAGIC


def test_an_unwritable_sweep_keeps_its_index_in_the_cache_dir(sweep, reads, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(record_index.os, "access", lambda path, mode: False)
    _load(sweep)
    assert not (sweep / record_index.INDEX_FILE).exists()
    assert Path(record_index.cache_path(str(sweep))).is_file()
    reads.clear()
    _load(sweep)
    assert reads == []


def test_bad_lines_are_noted_alike_cold_and_through_the_index(sweep):
    path = _first_run(sweep) / "results.jsonl"
    path.write_text(path.read_text() + "{not json\n")
    os.utime(path, ns=(PAST_NS, PAST_NS))
    cold, warm = _load(sweep), _load(sweep)
    assert cold.skipped_lines == warm.skipped_lines == 1
    assert cold.notes == warm.notes and str(path) in warm.notes[0]


def test_an_unchanged_sweep_is_served_without_rewriting_its_index(sweep, reads):
    _load(sweep)
    index = sweep / record_index.INDEX_FILE
    os.utime(sweep, ns=(PAST_NS, PAST_NS))     # the index write changed the sweep folder
    before = index.stat().st_mtime_ns, index.stat().st_ino
    reads.clear()
    _load(sweep)
    assert reads == []
    assert (index.stat().st_mtime_ns, index.stat().st_ino) == before


def test_a_removed_done_marker_drops_the_run_through_the_index(sweep, reads):
    first = _load(sweep)
    run = _first_run(sweep)
    (run / "done").unlink()          # the run folder's mtime changes: listed again
    reads.clear()
    loaded = _load(sweep)
    assert reads == [] and str(run) not in loaded.run_dirs
    assert loaded.skipped_runs == first.skipped_runs + 1


def _indexed(sweep):
    """(the records read from the files, the index's path, bytes, header and where its
    arrays start) of `sweep`, its index just written."""
    from_files = rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS,
                                  use_index=False)
    _load(sweep)
    index = sweep / record_index.INDEX_FILE
    data = index.read_bytes()
    return (from_files, index, data, *_header(data))


def test_a_tampered_args_text_sends_the_records_api_back_to_the_files(sweep, capsys):
    from_files, index, data, header, base = _indexed(sweep)
    at = base + header["arrays"]["args_blob"][2]
    assert data[at:].startswith(b'{"algorithm"')
    start = data.index(b'"dataset":', at) + len(b'"dataset":')
    start = data.index(b'"', start) + 1
    wrong = b"PACS" if data[start:start + 4] != b"PACS" else b"VLCS"
    index.write_bytes(data[:start] + wrong + data[start + 4:])    # same length, same header
    loaded = _load(sweep)
    assert loaded.records == from_files.records      # checked when the dicts are built
    assert any("ignored the records index" in n for n in loaded.notes)
    assert "key values differ" in capsys.readouterr().err


def test_runs_read_again_between_served_ones_keep_their_order_in_workers(sweep, monkeypatch):
    from domainbed.results import parallel_read
    _load(sweep)
    runs = sorted(p.parent for p in sweep.glob("*/results.jsonl"))
    for run in (runs[3], runs[4], runs[20], runs[-1]):       # read again: four misses
        os.utime(run / "results.jsonl", ns=(PAST_NS + 10**9, PAST_NS + 10**9))
    monkeypatch.setattr(parallel_read, "MIN_FILES", 2)
    monkeypatch.setattr(parallel_read, "CHUNK", 3)           # chunks cut across segments
    monkeypatch.setattr(parallel_read, "workers", lambda: 2)
    (runs[7] / "results.jsonl").unlink()                   # gone: no stat, no run
    runs[9].rename(sweep / "zzz_moved")                     # moved: read again
    mixed = _load(sweep)
    cold = rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS, use_index=False)
    assert mixed.run_dirs == cold.run_dirs and mixed.records == cold.records
    assert [list(r) for r in mixed.records] == [list(r) for r in cold.records]


def test_done_is_a_file_or_a_link_to_one_never_a_broken_link(tmp_path):
    """A run is done where its `done` exists as os.path.exists sees it: a file, or a link
    to one; a broken link is not done (the walk follows only links to see that)."""
    from domainbed.results import discovery
    for name in ("file", "link", "broken", "none"):
        run = tmp_path / name
        run.mkdir()
        (run / "results.jsonl").write_text("{}\n")
    (tmp_path / "file" / "done").write_text("")
    (tmp_path / "target").write_text("")
    os.symlink(tmp_path / "target", tmp_path / "link" / "done")
    os.symlink(tmp_path / "missing", tmp_path / "broken" / "done")
    walked = discovery.walk(str(tmp_path))
    done = {os.path.basename(p): d for p, d in zip(walked.run_dirs, walked.done)}
    assert done == {"file": True, "link": True, "broken": False, "none": False}


def test_an_index_written_in_the_background_is_waited_for_before_it_is_read(sweep, reads,
                                                                            monkeypatch):
    """collect_results writes the index in a thread while it reports: the next read in the
    process waits for that write (and so is served), and the process's exit joins it."""
    import threading
    started, release = threading.Event(), threading.Event()
    real = record_index.RecordIndex._save_quietly

    def slow(self, data):
        started.set()
        release.wait(30)
        real(self, data)
    monkeypatch.setattr(record_index.RecordIndex, "_save_quietly", slow)
    first = rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS,
                             index_in_background=True)
    assert started.wait(5) and len(reads) == 40
    assert not (sweep / record_index.INDEX_FILE).exists()      # still being written
    writer = [t for t in threading.enumerate() if t.name == "records-index-writer"]
    assert writer and not writer[0].daemon                     # joined at exit
    release.set()                  # the read below waits for the write it lets finish
    reads.clear()
    again = _load(sweep)
    assert reads == [] and again.records == first.records


@pytest.mark.parametrize("edit", [b"//", b"./", b"../"], ids=["empty", "dot", "dotdot"])
def test_a_listing_naming_an_empty_dot_or_dotdot_child_is_refused(sweep, edit, capsys):
    """A listing's children are joined to paths: "", "." or ".." would walk elsewhere."""
    _load(sweep)
    index = sweep / record_index.INDEX_FILE
    data = index.read_bytes()
    header, base = _header(data)
    at = base + header["arrays"]["dir_children"][2]     # the top's children come first
    if edit == b"//":
        at = data.index(b"/", at)
    assert data[at:at + len(edit)] != edit
    index.write_bytes(data[:at] + edit + data[at + len(edit):])
    with pytest.raises(record_index.CorruptIndex, match="names no child directory"):
        record_index.decode(index.read_bytes())
    loaded = _load(sweep)
    assert any("ignored the records index" in n for n in loaded.notes)


def _tail_of(loaded):
    """The FileTail the args texts of a table read through the index are cut from."""
    pieces = loaded.table.args.pieces
    assert len(pieces) == 1
    return pieces[0].blob


def test_the_args_and_hparams_texts_are_read_only_when_asked_for(sweep, reads):
    """A report reads key codes, never the args and hparams texts: the index's tail (its
    two blobs, last in the file) stays unread until record dicts are asked for, then comes
    from the file opened, even where another index has replaced it since."""
    from_files, index, data, header, base = _indexed(sweep)
    head = int.from_bytes(data[len(record_index.MAGIC) + 8:record_index.PREFIX], "little")
    assert head == base + header["arrays"]["args_blob"][2]        # the blobs: the tail
    assert head < base + header["arrays"]["hparams_blob"][2] < len(data)
    reads.clear()
    warm = _load(sweep)
    tail = _tail_of(warm)
    assert isinstance(tail, record_index.FileTail) and tail.size == len(data) - head
    run_main(collect_results, ["--input_dir", str(sweep), "--no_save"])
    assert tail._bytes is None                                    # not read by a report
    replaced = sweep / "elsewhere"
    replaced.write_bytes(data[:head] + b"x" * (len(data) - head))
    os.replace(replaced, index)                                   # a new file at the path
    assert warm.records == from_files.records and reads == []     # the opened file's tail
    assert tail._bytes == data[head:] and not warm.notes
    assert pickle.loads(pickle.dumps(warm.table.args)).tolist() == warm.table.args.tolist()


def test_a_tail_cut_short_after_the_load_sends_the_records_api_back_to_the_files(sweep,
                                                                                 capsys):
    from_files = rec.load_records(sweep, quiet=True, fields=rec.TABLE_FIELDS,
                                  use_index=False)
    _load(sweep)
    index = sweep / record_index.INDEX_FILE
    size = index.stat().st_size
    warm = _load(sweep)
    with open(index, "r+b") as f:        # cut in place, under the open file
        f.truncate(size - 1000)
    assert warm.records == from_files.records
    assert any("ignored the records index" in n for n in warm.notes)
    assert capsys.readouterr().err.count("warning: ignored the records index") == 1
