"""Records from a shared sweep directory are not trusted: one ill-typed or hostile record,
a FIFO or a symlink to /dev/zero where results.jsonl should be, a line without end, JSON
nested 200,000 deep: every reader (collect_results, the leaderboard, aotl) skips it with a
note naming it and gives the numbers of the good records (DomainBed's published ones), never
a traceback, a hang or an exhausted memory. Dataset names never collide as page names."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from domainbed.results import reader
from domainbed.results import records as rec
from domainbed.scripts import collect_results
from tests.builders import read_records, rewrite_records, write_run
from tests.test_collect_results import EXPECTED, assert_same_numbers, run_main, sweep_copy

BAD_ARGS = {  # what the adversarial collaborator tried, each in a run of its own
    "trial_seed_dict": {"trial_seed": {"a": 1}},
    "trial_seed_str": {"trial_seed": "1"},
    "test_envs_int": {"test_envs": 5},
    "test_envs_str": {"test_envs": ["x"]},
    "test_envs_range": {"test_envs": [7], "env_names": ["a", "b", "c", "d"]},
    "dataset_list": {"dataset": ["VLCS"]},
    "env_names_int": {"env_names": 5},
}
BAD_TOP = {"step_str": {"step": "x"}, "acc_str": {"env0_out_acc": "high"},
           "hparams_list": {"hparams": [1, 2]}}


@pytest.fixture
def hostile_sweep(tmp_path):
    """DomainBed's published sweep plus one run per bad record and a 200k-deep line."""
    sweep = sweep_copy(tmp_path)
    good = read_records(sorted(p.parent for p in sweep.glob("*/results.jsonl"))[0])[0]
    for name, change in BAD_ARGS.items():
        bad = {**good, "args": {**good["args"], **change}}
        write_run(sweep / f"zz_{name}", [bad])
    for name, change in BAD_TOP.items():
        write_run(sweep / f"zz_{name}", [{**good, **change}])
    write_run(sweep / "zz_deep", tail="[" * 200_000 + "]" * 200_000 + "\n")
    write_run(sweep / "zz_deep_hparams",
              [{**good, "hparams": {"x": json.loads("[" * 500 + "]" * 500)}}])
    return sweep


def test_collect_results_skips_each_bad_record_with_a_note_naming_it(hostile_sweep, capsys):
    text = run_main(collect_results, ["--input_dir", str(hostile_sweep), "--no_save"])
    assert_same_numbers(text, EXPECTED.read_text())
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "Traceback" not in err
    loaded = rec.load_records(hostile_sweep, quiet=True)
    named = " ".join(loaded.notes)
    for name in [*BAD_ARGS, *BAD_TOP, "deep", "deep_hparams"]:
        assert f"zz_{name}{os.sep}results.jsonl line 1" in named, name
    assert "args.trial_seed is not an int" in named and "step is not an int" in named
    assert "nested deeper" in named and "args.dataset is not a string" in named


def test_leaderboard_and_aotl_read_past_bad_records(hostile_sweep, tmp_path):
    from analysis.aotl.inputs import load_accuracies
    from domainbed.leaderboard.site import build_site
    model = build_site([str(hostile_sweep)], str(tmp_path / "site"))
    notes = " ".join(model["notes"])
    assert "zz_trial_seed_dict" in notes and "zz_deep" in notes
    assert "zz_deep" in (tmp_path / "site" / "index.html").read_text()  # the Notes box
    acc = load_accuracies([hostile_sweep])
    assert acc.datasets() == ["VLCS"]


def _collect_in_a_process(sweep, timeout=120):
    return subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(sweep), "--no_save"], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_or_a_dev_zero_symlink_is_skipped_not_read(tmp_path):
    sweep = sweep_copy(tmp_path)
    fifo = sweep / "zz_fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "results.jsonl")
    (fifo / "done").write_text("")
    zero = sweep / "zz_zero"
    zero.mkdir()
    os.symlink("/dev/zero", zero / "results.jsonl")
    (zero / "done").write_text("")
    endless = write_run(sweep / "zz_endless", tail="")
    with open(endless / "results.jsonl", "wb") as f:  # one line larger than the cap
        f.write(b"x" * (reader.MAX_LINE_BYTES + 10))
    done = _collect_in_a_process(sweep)  # a hang or a MemoryError fails here
    assert done.returncode == 0, done.stderr
    assert_same_numbers(done.stdout, EXPECTED.read_text())
    loaded = rec.load_records(sweep, quiet=True)
    named = " ".join(loaded.notes)
    assert "zz_fifo" in named and "not a regular file" in named
    assert "zz_zero" in named and "symlink" in named
    assert f"longer than {reader.MAX_LINE_BYTES} bytes" in named


def test_pages_of_datasets_never_collide_and_stay_short(tmp_path):
    from domainbed.leaderboard import pages
    sweep = sweep_copy(tmp_path)
    long_name = "D" * 300
    for run in sorted(p.parent for p in sweep.glob("*/results.jsonl")):
        for name in ("My Data", "My_Data", long_name):
            copy = sweep / f"{run.name}_{len(name)}_{name[:2].strip()}{' ' in name}"
            shutil.copytree(run, copy)
            rewrite_records(copy, lambda r, name=name: r["args"].update(dataset=name))
        shutil.rmtree(run)
    names = {pages.dataset_page(n) for n in ("My Data", "My_Data", long_name)}
    assert len(names) == 3 and all(len(n) < 100 for n in names)
    from domainbed.leaderboard.site import build_site
    model = build_site([str(sweep)], str(tmp_path / "site"))
    assert {d["name"] for d in model["datasets"]} == {"My Data", "My_Data", long_name}
    linked = []
    for dataset in model["datasets"]:  # each page shows its own dataset, links its own runs
        page = (tmp_path / "site" / pages.dataset_page(dataset["label"])).read_text()
        page = page.split("<main>", 1)[1]  # the navigation lists every dataset
        assert dataset["name"] in page
        runs = set(re.findall(r'href="(runs_[^"#]+)', page))
        assert runs and all(r.startswith(f"runs_{pages.slug(dataset['label'])}_") and
                            (tmp_path / "site" / r).is_file() for r in runs)
        linked.append(runs)
    assert not (linked[0] & linked[1] or linked[0] & linked[2] or linked[1] & linked[2])
    assert pages.slug("VLCS") == "VLCS" and pages.slug("a-b") != pages.slug("a_b")


def _oodselect_folder(path, curve_bytes=None):
    path.mkdir()
    (path / "summary.csv").write_text("method,n,r_test,r_test_lo,r_test_hi,r_val\n"
                                      "oodselect,5,0.25,0.1,0.4,0.3\n")
    if curve_bytes is not None:
        (path / "correlation_vs_size.png").write_bytes(curve_bytes)
    return path


def test_the_oodselect_folder_gives_only_its_regular_files_with_the_sites_mode(tmp_path):
    from domainbed.leaderboard.site import build_site
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"SECRET-KEY-MATERIAL")
    secret.chmod(0o600)
    linked = _oodselect_folder(tmp_path / "linked")
    os.symlink(secret, linked / "correlation_vs_size.png")
    private = _oodselect_folder(tmp_path / "private", b"\x89PNG fake curve")
    (private / "correlation_vs_size.png").chmod(0o600)
    (tmp_path / "empty").mkdir()
    old = os.umask(0o022)
    try:
        model = build_site([str(tmp_path / "empty")], str(tmp_path / "site"),
                           oodselect_dirs=[str(linked), str(private)])
    finally:
        os.umask(old)
    site = tmp_path / "site"
    first, second = model["analysis"]["oodselect"]
    assert first["image"] is None and "symlink" in (site / "index.html").read_text()
    for path in site.rglob("*"):
        assert path.is_dir() or b"SECRET-KEY-MATERIAL" not in path.read_bytes(), path
    copied = site / second["image"]
    assert copied.read_bytes() == b"\x89PNG fake curve"
    assert not copied.is_symlink() and (copied.stat().st_mode & 0o777) == 0o644


def _walk_by_os(top):
    """What `discovery.walk` finds, by os.walk (sorted, predictions and links not entered):
    a results.jsonl entry that is no directory (a link's target), a done that exists."""
    found = []
    for path, dirs, _ in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "predictions"
                         and not os.path.islink(os.path.join(path, d)))
        results = os.path.join(path, "results.jsonl")
        if os.path.lexists(results) and not os.path.isdir(results):
            found.append((path, os.path.exists(os.path.join(path, "done"))))
    return found


def test_the_walk_finds_what_os_walk_finds_with_and_without_link_counts(tmp_path,
                                                                          monkeypatch):
    """Odd run folders (a results.jsonl that is a folder, a link to nothing or to a
    folder; a done that is a link to nothing or a folder; a run inside a run; a linked
    folder; predictions) are found alike whether link counts spare listing a folder."""
    from domainbed.results import discovery
    top = tmp_path / "s"
    for name in ("a", "b", "c", "d", "e", "f", "g", "g/inner", "g/predictions", "h"):
        (top / name).mkdir(parents=True)
    for name in ("a", "g", "g/inner", "g/predictions", "h"):
        (top / name / "results.jsonl").write_text("{}\n")
        (top / name / "done").write_text("")
    (top / "b" / "results.jsonl").mkdir()
    (top / "c" / "results.jsonl").symlink_to(tmp_path / "nowhere")
    (top / "c" / "done").symlink_to(tmp_path / "nowhere")
    (top / "d" / "results.jsonl").symlink_to(top / "b")
    (top / "e" / "results.jsonl").write_text("{}\n")
    (top / "e" / "done").mkdir()
    (top / "f" / "done").write_text("")
    (top / "link").symlink_to(top / "a")
    want = _walk_by_os(str(top))
    assert [(os.path.basename(p), done) for p, done in want] == [
        ("a", True), ("c", False), ("e", True), ("g", True), ("inner", True), ("h", True)]
    for counting in (True, False):
        if not counting:   # (else where this file system counts them)
            monkeypatch.setattr(discovery, "SUBDIRECTORY_LINKS", frozenset())
        walked = discovery.walk(str(top))
        assert [(p, done) for p, done, _ in walked] == want
        keys = {os.path.basename(p): key for p, _, key in walked}
        st = os.stat(top / "a" / "results.jsonl")
        assert keys["a"] == (st.st_size, st.st_mtime_ns, st.st_ino)
