"""Hardening, round 3, the output side: every CSV the project writes is inert in a
spreadsheet (a hostile name never starts a formula, never splits a row; a number stays a
number), a lone surrogate in a record never stops a writer (pages whole or not at all),
an unwritable output is one error line before any work, and the leaderboard's folder
honours the umask. Tiny record folders, built by hand."""
import csv
import dataclasses
import gzip
import io
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from oodutils.csv_out import FORMULA_START, csv_text, csv_value, frame_csv
from oodutils.errors import run_cli
from tests.builders import rewrite_records, toy_record, write_run
from tests.test_labelfree import write_sweep, zoo

DATASET = '=HYPERLINK("http://x.example/?a","click")'
ALGORITHM = "@SUM(A1)"
ENVS = ["-1+cmd|' /C calc'!A0", "\r=1", "\t=2\n=3"]
HOSTILE = [DATASET, ALGORITHM, *ENVS, "+1+cmd", "\uff1dcmd"]
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
SURROGATE = "\ud800"


def read(path):
    """A file's text with its line ends as written (a CR stays a CR)."""
    return path.read_bytes().decode("utf-8")


def csv_rows(text):
    """Rows as a spreadsheet's import reads them (a bare CR ends a line)."""
    return list(csv.reader(io.StringIO(text, newline="")))


def assert_inert(text, where):
    """Every row as wide as the header; no cell starts like a formula unless it is a plain
    number. Returns the cells."""
    rows = csv_rows(text)
    assert rows, where
    cells = []
    for row in rows:
        assert len(row) == len(rows[0]), (where, row)
        for cell in row:
            assert not cell.startswith(FORMULA_START) or NUMBER.fullmatch(cell), (where, cell)
            cells.append(cell)
    return cells


def hostile_sweep(root, dataset=DATASET, algorithm=ALGORITHM, envs=ENVS, extra=None):
    """Two algorithms x three test environments x two trials, three steps each."""
    for a, alg in enumerate(("ERM", algorithm)):
        for test_env in range(3):
            for trial in range(2):
                recs = []
                for step in range(3):
                    accs = {f"env{e}_{s}_acc": 0.5 + 0.1 * ((trial + step + e) % 4)
                            for e in range(3) for s in ("in", "out")}
                    rec = toy_record(step, test_envs=(test_env,), trial_seed=trial, **accs)
                    rec["args"].update(dataset=dataset, algorithm=alg, env_names=list(envs))
                    rec.update(extra or {})
                    recs.append(rec)
                write_run(root / f"run{a}{test_env}{trial}", recs)
    return root


def run_main(main, argv, capsys):
    """(exit code, stdout, stderr) of a command run in-process through run_cli."""
    code = 0
    try:
        result = run_cli(main, argv)
        code = result or 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------ the CSV helper

def test_the_helper_neutralises_formulas_and_keeps_numbers_numeric():
    text = csv_text(["=h", "value"], [[h, -1.5] for h in HOSTILE] +
                    [["-2.5", np.float64(-0.25)], ["1e-3", -7], [None, float("nan")],
                     ["-inf", True], ["x" + SURROGATE, np.int64(-3)]])
    cells = assert_inert(text, "helper")
    rows = csv_rows(text)
    assert len(rows) == 1 + len(HOSTILE) + 5     # "\r=1" and "=3\n" split no row
    assert [r[0] for r in rows[1:len(HOSTILE) + 1]] == ["'" + h for h in HOSTILE]
    assert [csv_value(r[0]) for r in rows[1:len(HOSTILE) + 1]] == HOSTILE   # read back
    assert rows[-5:] == [["-2.5", "-0.25"], ["1e-3", "-7"], ["", ""], ["'-inf", "True"],
                         ["x\ufffd", "-3"]]
    assert "'=h" in cells and "-1.5" in cells


def test_frames_are_written_by_the_helper_with_pandas_numbers():
    import pandas as pd
    frame = pd.DataFrame({"name": HOSTILE, "acc": np.linspace(-1, 1, len(HOSTILE)),
                          "n": range(len(HOSTILE))})
    text = frame_csv(frame)
    assert_inert(text, "frame")
    back = pd.read_csv(io.StringIO(text, newline=""))
    assert back["name"].map(csv_value).tolist() == HOSTILE
    assert back["acc"].tolist() == frame["acc"].tolist()     # full precision, numeric
    assert back["n"].dtype.kind == "i"


def test_examples_csv_of_a_run_is_inert_and_reads_back():
    from domainbed.training.loop import example_paths_csv

    class Env:
        def __init__(self, ids, paths):
            self.ids, self.paths = ids, paths

    paths = [f"{h}.png" for h in HOSTILE] + ['a,"b".png', "é.png"]
    text = example_paths_csv([Env(range(len(paths)), paths)])
    assert_inert(text, "examples.csv")
    assert [csv_value(r[2]) for r in csv_rows(text)[1:]] == paths


def test_no_csv_is_written_but_by_the_helper():
    """csv.writer, DictWriter and DataFrame.to_csv appear only in oodutils/csv_out.py, so a
    new CSV output cannot skip the escaping."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"csv\.writer\(|DictWriter\(|\.to_csv\(")
    found = [f"{path.relative_to(root)}:{n}"
             for package in ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils",
                             "scripts")
             for path in sorted((root / package).rglob("*.py"))
             if path.relative_to(root).as_posix() != "oodutils/csv_out.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert not found, found


# -------------------------------------------------------- every command that writes a CSV

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return hostile_sweep(tmp_path_factory.mktemp("hostile") / "sweep")


def test_collect_results_csv(sweep, capsys):
    from domainbed.scripts.collect_results import main
    code, out, err = run_main(main, ["--input_dir", str(sweep), "--format", "csv"], capsys)
    assert code == 0, err
    for text, where in ((out, "stdout"), (read(sweep / "results.csv"),
                                          "results.csv")):
        cells = assert_inert(text, where)
        assert "'\r=1" in cells and "'" + DATASET in cells and "'" + ALGORITHM in cells


@pytest.fixture(scope="module")
def site(sweep, tmp_path_factory):
    """The leaderboard of the hostile sweep, built under umask 027."""
    from domainbed.leaderboard.site import build_site
    out = tmp_path_factory.mktemp("lb") / "site"
    old = os.umask(0o027)
    try:
        build_site([str(sweep)], str(out), extras=None)
    finally:
        os.umask(old)
    return out


def test_leaderboard_csv(site):
    cells = assert_inert(read(site / "leaderboard.csv"), "leaderboard.csv")
    assert "'\r=1" in cells and "'" + DATASET in cells and "'" + ENVS[0] in cells


def test_leaderboard_folder_honours_the_umask(site):
    assert os.stat(site).st_mode & 0o777 == 0o750
    assert os.stat(site / "index.html").st_mode & 0o777 == 0o640
    assert os.stat(site / "leaderboard.csv").st_mode & 0o777 == 0o640


def test_aotl_csv_table_and_exported_accuracies(sweep, tmp_path, capsys):
    from analysis.aotl.cli import main
    code, out, err = run_main(main, [str(sweep), "--format", "csv"], capsys)
    assert code == 0, err
    assert "'" + DATASET in assert_inert(out, "aotl stdout")
    table = tmp_path / "table.csv"
    exported = tmp_path / "exported"
    code, _, err = run_main(main, [str(sweep), "--output", str(table), "--export_csv",
                                   str(exported), "--table", "per-ood"], capsys)
    assert code == 0, err
    assert_inert(read(table), "aotl --output")
    files = sorted(exported.rglob("*.csv.gz"))
    assert len(files) == 3
    for path in files:
        cells = assert_inert(gzip.decompress(path.read_bytes()).decode(), path.name)
        assert "'" + DATASET in cells and "'" + ALGORITHM in cells
    # aotl reads its own export back with the names as they were
    code, out, err = run_main(main, [str(exported), "--format", "csv"], capsys)
    assert code == 0, err
    cells = assert_inert(out, "aotl on its export")
    assert "'" + DATASET in cells and not any(c.startswith("''") for c in cells)


def test_labelfree_csvs(tmp_path, capsys):
    from analysis.labelfree.cli import main
    cps = [dataclasses.replace(cp, dataset=DATASET) for cp in zoo(4, -0.5, n=200)]
    write_sweep(tmp_path / "sweep", cps)
    out = tmp_path / "out"
    code, _, err = run_main(main, ["--input_dir", str(tmp_path / "sweep"),
                                   "--output_dir", str(out)], capsys)
    assert code == 0, err
    for name in ("estimates", "summary", "agreement", "verdicts"):
        cells = assert_inert(read(out / f"{name}.csv"), name)
        assert "'" + DATASET in cells, name


def test_oodselect_and_validity_tables(tmp_path):
    """The analysis tables' one writer (tables.write / report.write_csv)."""
    import pandas as pd

    from analysis.oodselect.report import write_csv
    from oodutils import tables
    frame = pd.DataFrame({"method": HOSTILE, "r": np.arange(len(HOSTILE)) - 3.5})
    write_csv(tmp_path / "summary.csv", frame)
    tables.write(frame, tmp_path / "t.csv")
    for name in ("summary.csv", "t.csv"):
        cells = assert_inert(read(tmp_path / name), name)
        assert "'\r=1" in cells and "-3.5" in cells


def test_spawrious_splits_files_csv_from_hostile_file_names(tmp_path, capsys, monkeypatch):
    from spawrious import splits_cli
    from spawrious.splits import ENVIRONMENTS, Example

    def hostile_files(dataset_dir, split):
        return {env: [Example(env, 0, "desert", "bulldog", i, f"0/desert/bulldog/{h}.png")
                      for i, h in enumerate(HOSTILE)] for env in ENVIRONMENTS}

    monkeypatch.setattr(splits_cli, "select_files", hostile_files)
    monkeypatch.setattr(splits_cli, "resolve_dataset_dir", lambda root: str(root))
    _, out, err = run_main(splits_cli.main, ["--data_dir", str(tmp_path), "--benchmark",
                                             "o2o_easy", "--format", "files"], capsys)
    cells = assert_inert(out, "spawrious-splits --format files")   # a CR splits no row
    assert len(csv_rows(out)) == 1 + len(ENVIRONMENTS) * len(HOSTILE), err
    assert "0/desert/bulldog/\r=1.png" in cells


# ---------------------------------------------------------------------- unwritable outputs

UNWRITABLE = "/proc/oodbed-no/x"


def _commands(sweep_dir):
    """(main, argv) for every command and every output option it has."""
    from analysis.aotl import cli as aotl_cli
    from analysis.aotl import study_cli as aotl_study_cli
    from analysis.card import cli as card_cli
    from analysis.labelfree import cli as labelfree_cli
    from analysis.oodselect import cli as oodselect_cli
    from analysis.validity import cli as validity_cli
    from domainbed.scripts import collect_results, download, evaluate, leaderboard, train
    from domainbed.scripts import sweep as sweep_cli
    from ood_bench import cli as ood_bench
    from spawrious import generate
    s = str(sweep_dir)
    return {
        "collect_results --export_selected": (collect_results.main, [
            "--input_dir", s, "--export_selected", UNWRITABLE]),
        "leaderboard --output_dir": (leaderboard.main, [
            "--input_dir", s, "--output_dir", UNWRITABLE]),
        "aotl --output": (aotl_cli.main, [s, "--output", UNWRITABLE + ".csv"]),
        "aotl --export_csv": (aotl_cli.main, [s, "--export_csv", UNWRITABLE]),
        "aotl --plot": (aotl_cli.main, [s, "--plot", UNWRITABLE]),
        "labelfree --output_dir": (labelfree_cli.main, [
            "--input_dir", s, "--output_dir", UNWRITABLE]),
        "benchmark-card --output_dir": (card_cli.main, [
            "--input_dir", s, "--output_dir", UNWRITABLE]),
        "benchmark-validity --output": (validity_cli.main, [
            "report", "--input_dir", s, "--output", UNWRITABLE]),
        "oodselect --output_dir": (oodselect_cli.main, [
            "--input_dir", s, "--output_dir", UNWRITABLE]),
        "oodselect --save_matrix": (oodselect_cli.main, [
            "--input_dir", s, "--output_dir", os.path.join(s, "oodselect"), "--save_matrix",
            UNWRITABLE + ".npz"]),
        "aotl-study --output_dir": (aotl_study_cli.main, [
            "--dataset", "ColoredMNIST", "--models", "2", "--output_dir", UNWRITABLE]),
        "ood-bench summarize --output": (ood_bench.main, [
            "summarize", "--input", s, "--output", UNWRITABLE]),
        "sweep launch --output_dir": (sweep_cli.main, [
            "launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", s,
            "--output_dir", UNWRITABLE, "--command_launcher", "dummy"]),
        "download --data_dir": (download.main, ["--data_dir", UNWRITABLE, "--datasets",
                                                "MNIST"]),
        "spawrious-generate --output_dir": (generate.main, [
            "--backend", "procedural", "--output_dir", UNWRITABLE, "--per_cell", "1"]),
        "evaluate --output_dir": (evaluate.main, [
            "--model", "resnet18", "--dataset", "Debug28", "--output_dir", UNWRITABLE]),
        "train --output_dir": (train.main, [
            "--dataset", "Debug28", "--data_dir", s, "--output_dir", UNWRITABLE,
            "--steps", "1"]),
    }


COMMANDS = list(_commands("SWEEP"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("name", COMMANDS)
def test_unwritable_output_is_one_line_before_any_work(name, sweep, capsys, monkeypatch):
    import domainbed.results.discovery as discovery
    main, argv = _commands(sweep)[name]

    def no_work(*args, **kwargs):
        raise AssertionError("records read before the output was checked")

    # (every read of records walks the sweep through this module attribute; patching
    # load_records would leak into modules that first import it by name right here)
    monkeypatch.setattr(discovery, "walk", no_work)
    code, out, err = run_main(main, argv, capsys)
    assert code == 2, (name, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
    assert name.split()[-1] in lines[0] and "/proc" in lines[0], (name, err)
    assert "Traceback" not in err


# ------------------------------------------------------- readers of the CSVs we write

def test_oodselect_reads_examples_csv_back_and_never_blocks_on_a_fifo(tmp_path, capsys):
    """A run's examples.csv: hostile file names come back as written; a FIFO in its
    place is skipped with a warning, never read (a read would block forever)."""
    import threading

    from analysis.oodselect import data
    from domainbed.training.loop import example_paths_csv
    from tests.test_oodselect import write_fake_sweep
    small, _ = data.planted_problem(n_runs=6, checkpoints=1, n_aligned=8, n_conflict=4)
    root = write_fake_sweep(str(tmp_path / "sweep"), small, 1)
    runs = sorted((tmp_path / "sweep").iterdir())
    names = [HOSTILE[i % len(HOSTILE)] + f"{i}.png" for i in range(small.n_examples)]

    class Env:
        def __init__(self, ids, paths):
            self.ids, self.paths = ids, paths

    for run in runs:
        (run / "examples.csv").write_bytes(example_paths_csv(
            [Env(range(small.n_examples), names)]).encode())
    built = data.from_runs(root, quiet=True)
    assert built.examples.sort_values("id")["path"].tolist() == names
    for run in runs:
        (run / "examples.csv").unlink()
        os.mkfifo(run / "examples.csv")
    result = {}
    reader = threading.Thread(target=lambda: result.update(cm=data.from_runs(root, quiet=True)),
                              daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), "blocked on a FIFO"
    assert "path" not in result["cm"].examples and "examples.csv not read" in \
        capsys.readouterr().err


# ---------------------------------------------------- control characters from records

class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("fmt", ["text", "markdown", "latex"])
def test_control_characters_in_names_never_break_a_table(tmp_path, fmt, capsys):
    from domainbed.scripts.collect_results import main
    sweep = hostile_sweep(tmp_path / "sweep", dataset="ds", algorithm="alg\x1b[2J\x9b31m",
                          envs=["e0\r", "e1\x08", "e2\x07"])
    code, out, err = run_main(main, ["--input_dir", str(sweep), "--format", fmt], capsys)
    assert code == 0, err
    suffix = {"text": "txt", "markdown": "md", "latex": "tex"}[fmt]
    for text in (out, read(sweep / f"results.{suffix}")):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), fmt
        assert "x1b" in text and "x9b31m" in text    # escaped, then the format's own escaping


def test_a_terminal_gets_no_control_character_a_pipe_gets_the_csv_as_written(monkeypatch):
    from oodutils.cli import echo
    from oodutils.log import StderrHandler, get_logger
    text = csv_text(["name"], [["\r=1\x1b[2J"]])
    pipe, terminal = io.StringIO(newline=""), Terminal(newline="")
    echo(text, end="", stream=pipe)
    echo(text, end="", stream=terminal)
    assert pipe.getvalue() == text
    assert terminal.getvalue() == text.replace("\r", "\\x0d").replace("\x1b", "\\x1b")
    monkeypatch.setattr(sys, "stderr", Terminal())
    # only our handler: pytest >= 9.2 captures non-propagating loggers too, and its report
    # of a lone surrogate cannot travel to an xdist controller
    package = logging.getLogger("domainbed")
    monkeypatch.setattr(package, "handlers",
                        [h for h in package.handlers if isinstance(h, StderrHandler)])
    get_logger("domainbed.x").warning("skipped run\x1b]0;title\x07" + SURROGATE)
    assert sys.stderr.getvalue() == "skipped run\\x1b]0;title\\x07\ufffd\n"
    from oodutils.errors import UserError

    def refuse(argv):
        raise UserError("no records for dataset 'ds\x1b[2J'")

    monkeypatch.setattr(sys, "stderr", Terminal())
    with pytest.raises(SystemExit):
        run_cli(refuse, [])
    assert sys.stderr.getvalue() == "error: no records for dataset 'ds\\x1b[2J'\n"


# ----------------------------------------------------------- names as long as a record allows

def test_names_longer_than_a_file_name_still_give_files(tmp_path, capsys):
    """File names made from a 300-character dataset name (aotl's plots and export,
    labelfree's plots) stay within the file system's limit, one per name."""
    from analysis.aotl.cli import main as aotl
    from analysis.labelfree.cli import main as labelfree
    from oodutils.fileio import file_name_part
    long_a, long_b = "D" * 300, "D" * 299 + "E"
    assert file_name_part(long_a) != file_name_part(long_b)
    assert len(file_name_part(long_a)) < 100 and file_name_part("PACS") == "PACS"
    sweep = hostile_sweep(tmp_path / "sweep", dataset=long_a, algorithm="A" * 300)
    code, _, err = run_main(aotl, [str(sweep), "--plot", str(tmp_path / "plots"),
                                   "--export_csv", str(tmp_path / "csv")], capsys)
    assert code == 0, err
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3
    assert len(list((tmp_path / "csv").rglob("*.csv.gz"))) == 3
    cps = [dataclasses.replace(cp, dataset=long_a) for cp in zoo(4, -0.5, n=200)]
    write_sweep(tmp_path / "lf", cps)
    code, _, err = run_main(labelfree, ["--input_dir", str(tmp_path / "lf"), "--output_dir",
                                        str(tmp_path / "lf_out")], capsys)
    assert code == 0, err
    assert len(list((tmp_path / "lf_out").glob("estimates_*.png"))) == 1


def test_metrics_on_a_sweep_it_cannot_write_warns_per_run(tmp_path, capsys, monkeypatch):
    """domainbed-metrics writes beside each run's records: a run folder it cannot write
    (a read-only sweep) is one warning, the other runs go on."""
    import errno

    import domainbed.predictions as metrics
    from domainbed.scripts.metrics import main
    cps = zoo(2, -0.5, n=50)
    write_sweep(tmp_path / "sweep", cps)
    for run in (tmp_path / "sweep").iterdir():
        rewrite_records(run, lambda r: r["args"].update(num_classes=2))
    real = metrics.atomic_write_text

    def read_only_first(path, text, *args, **kwargs):
        if "run0" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, text, *args, **kwargs)

    monkeypatch.setattr(metrics, "atomic_write_text", read_only_first)
    code, out, err = run_main(main, ["--input_dir", str(tmp_path / "sweep"), "--metrics",
                                     "balanced_acc"], capsys)
    assert code == 0, err
    assert "run0: metrics.jsonl not written (Read-only file system)" in err
    assert (tmp_path / "sweep" / "run1" / "metrics.jsonl").exists()
    assert "Traceback" not in err


@pytest.mark.parametrize("path, says", [("", "is empty"), ("   ", "is empty"),
                                        ("newdir/", "names a folder"),
                                        ("x" * 300 + ".csv", "File name too long")])
def test_an_empty_output_or_a_folder_for_a_file_is_one_line(path, says, sweep, tmp_path,
                                                            capsys, monkeypatch):
    from analysis.aotl.cli import main as aotl
    monkeypatch.chdir(tmp_path)     # a relative path lands here, whatever happens
    from domainbed.scripts.collect_results import main as collect
    for main, argv in ((aotl, [str(sweep), "--output", path]),
                       (collect, ["--input_dir", str(sweep), "--export_selected", path])):
        if path.endswith("/") and main is collect:
            continue     # a folder option: a trailing / is fine
        code, _, err = run_main(main, argv, capsys)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_reader_that_closes_stdout_early_ends_the_command_quietly():
    """`command | head -1`: exit 141 and nothing on stderr, never a BrokenPipeError
    traceback (run_cli, so every command)."""
    code = ("import sys\nfrom oodutils.errors import run_cli\n"
            "def main(argv):\n    for i in range(200000):\n        print('row', i)\n"
            "sys.exit(run_cli(main))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == b"", err


def test_a_name_never_becomes_a_markdown_link_or_image(tmp_path, capsys):
    """Markdown outputs (collect_results --format markdown, the cards' .md): link and
    image syntax in a name is escaped, so viewing the file neither shows a disguised link
    nor loads a remote image; a backslash cannot unescape the cell separator."""
    from analysis.card.cli import main as card
    from domainbed.scripts.collect_results import main as collect
    alg = "[click](javascript:alert(1))"
    envs = ["![t](https://tracker.example/p.png)", "e1\\|x", "e2"]
    sweep = hostile_sweep(tmp_path / "sweep", dataset="ds[x](y)", algorithm=alg, envs=envs)
    code, out, err = run_main(collect, ["--input_dir", str(sweep), "--format", "markdown",
                                        "--no_save"], capsys)
    assert code == 0, err
    code, _, err = run_main(card, ["--input_dir", str(sweep), "--output_dir",
                                   str(tmp_path / "cards"), "--bootstrap", "5"], capsys)
    assert code == 0, err
    for text in [out] + [p.read_text() for p in (tmp_path / "cards").glob("*.md")]:
        assert "\\[click\\](javascript:alert(1))" in text or "ds\\[x\\](y)" in text
        assert not re.search(r"(?<!\\)\[[^\]]*(?<!\\)\]\(", text), text
        if "e1" in text:     # a backslash then a pipe: both escaped, the pipe splits no cell
            assert "e1\\\\\\|x" in text and "e1\\|x" not in text.replace("e1\\\\\\|x", "")


def test_oodselect_command_csvs(tmp_path, capsys):
    """oodselect on a sweep whose examples are files named like formulas: every CSV it
    writes (summary, subsets with the paths, jaccard, composition) is inert."""
    from analysis.oodselect import data
    from analysis.oodselect.cli import main
    from domainbed.training.loop import example_paths_csv
    from tests.test_oodselect import write_fake_sweep
    cm, _ = data.planted_problem(n_runs=16, checkpoints=1, n_aligned=24, n_conflict=6,
                                 seed=3)
    root = write_fake_sweep(str(tmp_path / "sweep"), cm, 1, dataset=DATASET)
    names = [HOSTILE[i % len(HOSTILE)] + f"{i}.png" for i in range(cm.n_examples)]

    class Env:
        def __init__(self, ids, paths):
            self.ids, self.paths = ids, paths

    for run in (tmp_path / "sweep").iterdir():
        (run / "examples.csv").write_bytes(example_paths_csv(
            [Env(range(cm.n_examples), names)]).encode())
    out = tmp_path / "out"
    code, _, err = run_main(main, ["--input_dir", root, "--sizes", "5", "--output_dir",
                                   str(out), "--steps", "20", "--patience", "10",
                                   "--random-draws", "5", "--greedy-max-cost", "0",
                                   "--bootstrap", "10", "--no_plots"], capsys)
    assert code == 0, err
    written = sorted(out.glob("*.csv"))
    assert {"summary.csv", "subset_5.csv"} <= {p.name for p in written}
    cells = [c for p in written for c in assert_inert(read(p), p.name)]
    paths = [csv_value(c) for c in cells if c.startswith("'")]
    assert paths and set(paths) <= set(names)      # the subsets' file names, escaped


def test_benchmark_validity_csv(tmp_path, capsys):
    """benchmark-validity report --format csv on benchmarks named like formulas."""
    from analysis.validity import cli as validity_cli
    from tests.test_validity import ACC
    from tests.test_validity import write_run as write_group_run
    names = dict(zip(ACC, ['=HYPERLINK("x")', "@A1", "-1+cmd", "\r=1"]))
    for bench, per_method in ACC.items():
        for method, seeds in per_method.items():
            for seed, accs in enumerate(seeds):
                write_group_run(tmp_path / "sweep" / f"{bench}_{method}_{seed}", names[bench],
                                method, seed, [0, 100], test_accs=accs)
    kcsv = tmp_path / "k.csv"
    kcsv.write_text(csv_text(["benchmark", "K"], [[n, 0.5] for n in names.values()]))
    code, out, err = run_main(validity_cli.main, [
        "report", "--input_dir", str(tmp_path / "sweep"), "--k_csv", str(kcsv),
        "--format", "csv"], capsys)
    assert code == 0, err
    cells = assert_inert(out, "benchmark-validity --format csv")
    assert {"'" + n for n in names.values()} <= set(cells)
    rows = csv_rows(out)
    assert [r[rows[0].index("K")] for r in rows[1:]] == ["0.5"] * 4   # K read back by name


def test_a_name_that_is_not_valid_mathtext_still_gives_plots(tmp_path, capsys):
    """Plot titles and labels from names: `$...$` that matplotlib cannot parse as math is
    drawn as plain text (aotl --plot, the leaderboard's figures), never a ParseException."""
    from analysis.aotl.cli import main as aotl
    from domainbed.scripts.leaderboard import main as leaderboard
    sweep = hostile_sweep(tmp_path / "sweep", dataset="a$\\frac{$b", algorithm="x$^^$",
                          envs=["e$\\x$", "e1", "e2"])
    code, _, err = run_main(aotl, [str(sweep), "--plot", str(tmp_path / "plots")], capsys)
    assert code == 0, err
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3
    code, _, err = run_main(leaderboard, ["--input_dir", str(sweep), "--output_dir",
                                          str(tmp_path / "site"), "--bootstrap", "5"], capsys)
    assert code == 0, err
    assert list((tmp_path / "site" / "img").glob("*.png"))
