"""Hardening, round 3, the output side: text that cannot be encoded. A lone surrogate in
a record never stops a writer (every format of collect_results, the leaderboard, cards,
logs; pages whole or not at all); a run folder whose name is not UTF-8 is skipped with a
note. Tiny record folders, built by hand (tests/test_hardening_outputs.py's helpers)."""
import io
import json
import os
import subprocess
import sys

import pytest

from tests.test_hardening_outputs import SURROGATE, hostile_sweep, run_main


@pytest.fixture(scope="module")
def broken_sweep(tmp_path_factory):
    """Lone surrogates in the dataset, algorithm and environment names."""
    return hostile_sweep(tmp_path_factory.mktemp("surrogate") / "sweep",
                         dataset="ds" + SURROGATE, algorithm="alg" + SURROGATE,
                         envs=[f"e{i}{SURROGATE}" for i in range(3)])


@pytest.mark.parametrize("fmt", ["text", "markdown", "latex", "csv", "html"])
def test_collect_results_writes_every_format_with_a_lone_surrogate(broken_sweep, fmt,
                                                                     capsys):
    from domainbed.scripts.collect_results import main
    code, out, err = run_main(main, ["--input_dir", str(broken_sweep), "--format", fmt],
                              capsys)
    assert code == 0, err
    assert "Traceback" not in err and "alg\ufffd" in out
    suffix = {"text": "txt", "markdown": "md", "latex": "tex"}.get(fmt, fmt)
    assert "alg\ufffd" in (broken_sweep / f"results.{suffix}").read_text(encoding="utf-8")


def test_collect_results_real_stdout_with_a_lone_surrogate(broken_sweep):
    """A real process's stdout, in UTF-8 and in ASCII."""
    for encoding in ("utf-8", "ascii"):
        proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                               "--input_dir", str(broken_sweep), "--no_save"],
                              capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONIOENCODING": encoding})
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        assert b"Traceback" not in proc.stderr
        assert ("alg\ufffd".encode() if encoding == "utf-8" else b"alg\\ufffd") in proc.stdout


def test_every_command_prints_a_lone_surrogate(tmp_path):
    """stdout of every command (run_cli): list_top_hparams prints the hparams the records
    reader gave (a lone surrogate read as U+FFFD)."""
    sweep = hostile_sweep(tmp_path / "sweep", dataset="ds", algorithm="alg",
                          extra={"hparams": {"lr": 0.001, "k" + SURROGATE: "v"}})
    proc = subprocess.run([sys.executable, "-c", "import sys; from oodutils.errors import "
                           "run_cli; from domainbed.scripts.list_top_hparams import main; "
                           "sys.exit(run_cli(main))", "--input_dir", str(sweep),
                           "--dataset", "ds", "--test_env", "0"],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert "k\ufffd: v".encode() in proc.stdout


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    """The leaderboard and the cards of records with lone surrogates in every string
    the pages show beyond the table keys: environment names, hparams, data source."""
    root = tmp_path_factory.mktemp("surrogate-site")
    sweep = hostile_sweep(root / "sweep", dataset="ds", algorithm="alg",
                          envs=[f"e{i}{SURROGATE}" for i in range(3)],
                          extra={"hparams": {"lr": 0.001, "k" + SURROGATE: "v" + SURROGATE}})
    for run in sweep.iterdir():      # the data source too
        lines = (run / "results.jsonl").read_text().splitlines()
        recs = [json.loads(line) for line in lines]
        for r in recs:
            r["args"]["data_source"] = "src" + SURROGATE
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root, sweep


def test_leaderboard_with_lone_surrogates(broken_site, capsys):
    from domainbed.scripts.leaderboard import main
    root, sweep = broken_site
    code, _, err = run_main(main, ["--input_dir", str(sweep), "--output_dir",
                                   str(root / "site"), "--bootstrap", "5"], capsys)
    assert code == 0, err
    pages = list((root / "site").rglob("*.html"))
    assert len(pages) > 5
    for page in pages:
        assert page.stat().st_size > 0 and page.read_bytes().decode("utf-8")
    assert "e1\ufffd" in (root / "site" / "leaderboard.csv").read_text(encoding="utf-8")


def test_benchmark_card_with_lone_surrogates(broken_site, capsys):
    from analysis.card.cli import main
    root, sweep = broken_site
    out = root / "cards"
    code, stdout, err = run_main(main, ["--input_dir", str(sweep), "--output_dir", str(out),
                                        "--bootstrap", "5"], capsys)
    assert code == 0, err
    cards = sorted(out.iterdir())
    assert [p.suffix for p in cards] == [".html", ".md"]
    assert all(p.stat().st_size > 0 for p in cards)


def test_a_card_that_fails_leaves_no_page(broken_site, tmp_path, monkeypatch, capsys):
    """Pages whole or not at all: a card whose rendering fails writes nothing."""
    from analysis.card import build as card
    from analysis.card.cli import main

    def fail(*args, **kwargs):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(card, "render_markdown", fail)
    _, sweep = broken_site
    out = tmp_path / "cards"
    with pytest.raises(RuntimeError):
        main(["--input_dir", str(sweep), "--output_dir", str(out), "--bootstrap", "5"])
    assert not out.exists() or not list(out.iterdir())


def test_a_job_log_line_naming_a_non_utf8_path_is_written(tmp_path):
    """A command line holding a folder name that is not UTF-8 (argv decodes it with
    surrogates) goes into launcher.log escaped, never an encoding error in the launcher."""
    from domainbed.launch.jobs import JobClaim
    claim = JobClaim(str(tmp_path / "job"))
    assert claim.outcome is None
    claim.write_log("python -m domainbed.scripts.train --dataset folder:/data/\udcff")
    claim.release()
    assert (tmp_path / "job" / "launcher.log").read_bytes().endswith(b"folder:/data/\\udcff\n")


def test_writers_encode_lone_surrogates(tmp_path):
    from oodutils.cli import echo
    from oodutils.fileio import atomic_write_text
    from oodutils.pinned_dir import PinnedDir
    atomic_write_text(tmp_path / "page.html", "a" + SURROGATE)
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == "a\ufffd"
    with PinnedDir.open(tmp_path / "run", create=True) as run:    # a run's own files
        run.write_text("err.txt", "cannot read /data/\udcff.png")
    assert (tmp_path / "run" / "err.txt").read_text(encoding="utf-8") == \
        "cannot read /data/\ufffd.png"
    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    echo("b" + SURROGATE + "\u00b1", stream=strict)
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    echo("c" + SURROGATE + "\u00b1", stream=ascii_out)
    strict.flush()
    ascii_out.flush()
    assert strict.buffer.getvalue() == "b\ufffd\u00b1\n".encode()
    assert ascii_out.buffer.getvalue() == b"c\\ufffd\\xb1\n"


def test_a_run_folder_named_in_no_utf8_is_skipped_with_a_note(tmp_path, capsys):
    """A run folder whose name is not UTF-8 is skipped with one note naming it; the other
    runs give their tables (it stopped collect_results and the leaderboard before)."""
    from domainbed.scripts.collect_results import main as collect
    from domainbed.scripts.leaderboard import main as leaderboard
    sweep = hostile_sweep(tmp_path / "sweep")
    os.rename(sweep / "run000", os.fsdecode(bytes(sweep / "run000") + b"\xff"))
    code, out, err = run_main(collect, ["--input_dir", str(sweep), "--format", "csv"],
                              capsys)
    assert code == 0 and "Traceback" not in err, err
    assert "run000\\udcff: skipped, its folder name is not valid UTF-8" in err
    assert ",ERM," in out
    code, out, err = run_main(leaderboard, ["--input_dir", str(sweep), "--output_dir",
                                            str(tmp_path / "site")], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert (tmp_path / "site" / "index.html").is_file()
