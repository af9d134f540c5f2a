"""The leaderboard site: its cells equal DomainBed's printed results of its test sweep and
collect_results' numbers on our runs, published rows (conversion of DomainBed's results.tex,
transcriptions checked against the paper notes), a tiny Debug28 sweep trained here
(worst-group tables, data variants shown apart, missing cells with their reason), OODSelect
panels, bad input."""
import csv
import io
import json
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from domainbed.leaderboard import model as lbmodel
from domainbed.leaderboard import published
from domainbed.results import model_selection
from domainbed.scripts import collect_results
from domainbed.scripts import leaderboard as cli
from tests.requirements import data_dir, need_data
from tests.test_collect_results import EXPECTED, SWEEP, parse_text_tables

REPO = Path(__file__).resolve().parents[1]
TEX = data_dir("domainbed_published") / "results.tex"
# The team's paper notes are development material, not shipped: shared/spec beside the clone
# (CI) or beside the folder of worktrees.
NOTES = next((d / "shared" / "spec" for d in (REPO.parent, REPO.parent.parent)
              if (d / "shared" / "spec").is_dir()), REPO.parent / "shared" / "spec")


def run_cli(argv):
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.leaderboard", *argv],
                          capture_output=True, text=True, cwd=REPO)
    return proc


def train(out, data_dir, *extra, test_envs=("0",)):
    from domainbed.scripts import train as train_script
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with redirect_stdout(io.StringIO()):
        train_script.main(["--dataset", "Debug28", "--algorithm", "ERM", "--data_dir",
                           str(data_dir), "--output_dir", str(out), "--steps", "2",
                           "--checkpoint_freq", "1", "--test_envs", *test_envs,
                           "--num_threads", "1", "--skip_model_save", *extra])


def write_subpop_run(path):
    """A run directory of a dataset whose environments are official splits (records as
    train.py writes them for Waterbirds, val and test held out), for SubpopBench's
    selection."""
    args = {"dataset": "Waterbirds", "algorithm": "GroupDRO", "trial_seed": 0,
            "hparams_seed": 0, "test_envs": [1, 2], "env_names": ["train", "val", "test"],
            "data_source": "w", "data_fingerprint": "f", "data_seed": 0, "precision": "fp32"}
    lines = []
    for step, (val_wga, test_wga, test_acc) in enumerate([(0.3, 0.5, 0.9), (0.6, 0.7, 0.8)]):
        record = {"args": args, "hparams": {"lr": 0.001}, "step": step}
        for env, wga in enumerate((0.5, val_wga, test_wga)):
            record.update({f"env{env}_in_acc": test_acc, f"env{env}_out_acc": test_acc,
                           f"env{env}_in_wga": wga, f"env{env}_out_wga": wga})
        lines.append(json.dumps(record) + "\n")
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(lines))
    (path / "done").write_text("done\n")


@pytest.fixture(scope="module")
def mixed_site(tmp_path_factory):
    """DomainBed's test sweep (VLCS) + Debug28 runs on two data seeds (two fingerprints)
    + a corrupt results.jsonl line + an unfinished run, built into one site."""
    need_data(SWEEP, "DomainBed's published test sweep")
    tmp = tmp_path_factory.mktemp("lb")
    debug = tmp / "debug"
    train(debug / "seed0", tmp / "data")
    train(debug / "seed1", tmp / "data", "--data_seed", "1")
    with open(debug / "seed0" / "results.jsonl", "a") as f:
        f.write('{"args": {"dataset": "Debug28", "trunc\n')
    write_subpop_run(debug / "waterbirds")
    unfinished = debug / "unfinished"
    shutil.copytree(debug / "seed1", unfinished)
    (unfinished / "done").unlink()
    out = tmp / "site"
    with redirect_stdout(io.StringIO()):
        cli.main(["--input_dir", str(SWEEP), "--input_dir", str(debug), "--out", str(out)])
    return out, json.loads((out / "leaderboard.json").read_text())


def text_tables(text):
    """{table header: {algorithm: [cells]}} from collect_results' text format."""
    tables, current = {}, None
    for line in text.splitlines():
        if line.startswith("-------- "):
            current, tables[line[9:].strip()] = line[9:].strip(), {}
        elif current and line.strip() and not line.startswith("Algorithm"):
            cells = re.split(r"\s{2,}", line.strip())
            tables[current][cells[0]] = cells[1:]
    return tables


def model_tables(model):
    """The same shape from leaderboard.json: the text the pages show, per cell, with the
    "+/- 0.0" collect_results prints for a one-trial cell (the pages leave it out)."""
    tables = {}
    for s in model["sections"]:
        shown = s["tables"] + ([s["overview"]] if s["overview"] else []) + s["extra_tables"]
        for t in shown:
            tables[t["title"]] = {r["algorithm"]: [_as_collect_results(c) for c in r["cells"]]
                                  + [r["avg_text"]] for r in t["rows"]}
    return tables


def _as_collect_results(cell):
    if cell.get("n_trials") == 1:
        assert "+/-" not in cell["text"] and cell["err"] == 0.0
        return f"{cell['text']} +/- 0.0"
    return cell["text"]


def collect(argv):
    out = io.StringIO()
    with redirect_stdout(out):
        collect_results.main([*argv, "--no_save"])
    return out.getvalue()


def test_numbers_equal_collect_results(mixed_site):
    out, model = mixed_site
    debug = Path(model["inputs"][1])
    keys = [s["key"] for s in model["sections"]]
    # collect_results per method family: SubpopBench's selection on the runs it covers.
    runs = [([str(SWEEP), str(debug)], [k for k in keys if k != "val_worst_group"]),
            ([str(debug / "waterbirds")], [k for k in keys if k == "val_worst_group"])]
    want_tables, want_csv = {}, []
    for inputs, methods in runs:
        argv = ["--input_dir", *inputs, "--selection_methods", *methods]
        want_tables.update(text_tables(collect(argv)))
        rows = list(csv.reader(io.StringIO(collect([*argv, "--format", "csv"]))))
        want_csv += rows[len(want_csv) > 0:]
    assert want_tables == model_tables(model)
    # The user rows of leaderboard.csv are collect_results' CSV, line for line.
    rows = list(csv.reader(io.StringIO((out / "leaderboard.csv").read_text())))
    got = [r[:8] for r in rows[:1] + [r for r in rows[1:] if not r[9]]]
    assert got[0][:6] == ["selection_method", "table", "algorithm", "column", "env", "mean"]
    assert got == [r[:8] for r in want_csv]
    assert {r[-1] for r in rows[1:] if not r[9]} == {r[-1] for r in want_csv[1:]}  # metric
    # The pages show the same text: VLCS, training-domain validation, env C.
    page = (out / "dataset_VLCS.html").read_text()
    assert "98.0 +/- 0.2" in page and "2 trials · 3 hparams" in page
    index = (out / "index.html").read_text()
    assert "78.3 +/- 0.0" in index                       # two trials that agree
    assert re.search(r">100\.0</a>", index) and "100.0 +/-" not in index   # one trial
    assert any(title.startswith("Test average accuracy") for title in model_tables(model))


@pytest.fixture(scope="module")
def sweep_site(tmp_path_factory):
    """DomainBed's test sweep alone, built into a site."""
    need_data(SWEEP, "DomainBed's published test sweep")
    out = tmp_path_factory.mktemp("sweep") / "site"
    with redirect_stdout(io.StringIO()):
        cli.main(["--input_dir", str(SWEEP), "--out", str(out)])
    return out, json.loads((out / "leaderboard.json").read_text())


def test_cells_equal_domainbeds_test_sweep_results(sweep_site):
    """Every cell of DomainBed's own collect_results output for its test sweep
    (test_sweep_results.txt) is the cell the leaderboard holds and its pages show."""
    need_data(EXPECTED, "DomainBed's printed results of its test sweep")
    out, model = sweep_site
    expected = parse_text_tables(EXPECTED.read_text())
    got = model_tables(model)
    assert len(expected) == 6
    for header, (_, rows) in expected.items():
        assert got[header] == rows, header
    dataset_page = (out / "dataset_VLCS.html").read_text()
    for header, (_, rows) in expected.items():
        if header.startswith("Dataset: VLCS"):
            assert all(cell in dataset_page for cell in rows["ERM"][:-1]), header


def test_subpopbench_selection_and_published_worst_group(mixed_site):
    out, model = mixed_site
    section = next(s for s in model["sections"] if s["key"] == "val_worst_group")
    assert section["overview"]["columns"] == ["Waterbirds"]
    dro = section["overview"]["rows"][0]
    assert dro["algorithm"] == "GroupDRO" and dro["cells"][0]["text"] == "70.0"   # 1 trial
    assert section["extra_tables"][0]["rows"][0]["cells"][0]["text"] == "80.0"
    pub = section["published_overview"][0]
    assert pub["algorithm"] == "LISA" and pub["cells"][0]["text"] == "86.98"
    page = (out / "dataset_Waterbirds.html").read_text()
    assert ">70.0<" in page and ">80.0<" in page and "+/- 0.0" not in page


def test_title_names_the_sweeps_and_reasons_are_footnotes_once_per_table(mixed_site):
    out, model = mixed_site
    names = [Path(p).name for p in model["inputs"]]
    assert model["sweeps"] == names and re.fullmatch(r"\d{4}-\d\d-\d\d", model["built"])
    index = (out / "index.html").read_text()
    assert f"<title>Leaderboard of {', '.join(names)}, built {model['built']}</title>" in index
    pages_with_reasons = 0
    for page in out.glob("dataset_*.html"):
        for section in page.read_text().split('<section class="method"')[1:]:
            section = section.split("</section>")[0]
            for table in section.split('<table class="board">')[1:]:
                refs = re.findall(r'<small class="note-ref">\[(\d+)\]</small>', table)
                notes = re.findall(r'<li><small class="note-ref">\[\d+\]</small> X: '
                                   r'([^<]*)</li>', table)
                assert len(notes) == len(set(notes))            # each reason once
                assert set(refs) == {str(i + 1) for i in range(len(notes))}
                pages_with_reasons += lbmodel.LOO_NEEDS in notes
                if notes:
                    assert len(refs) > 2 * len(notes)           # cells point at them
    assert pages_with_reasons


def test_runs_behind_each_cell(mixed_site):
    out, model = mixed_site
    from domainbed.results.records import load_records
    selected = model_selection.select(load_records(str(SWEEP), quiet=True),
                                      model_selection.OracleSelectionMethod)
    table = next(t for s in model["sections"] if s["key"] == "oracle"
                 for t in s["tables"] if t["dataset"] == "VLCS")
    cell = table["rows"][0]["cells"][1]
    want = selected[selected.test_env == 1].sort_values("trial_seed")
    assert [r["run_dir"] for r in cell["runs"]] == list(want.run_dir)
    page = (out / "runs_VLCS_oracle.html").read_text()
    assert 'id="cell-ERM-e1"' in page
    assert all(r["run_dir"] in page for r in cell["runs"])
    assert 'href="runs_VLCS_oracle.html#cell-ERM-e1"' in (out / "dataset_VLCS.html").read_text()


def test_ranks_gain_and_published_difference(mixed_site):
    out, model = mixed_site
    section = next(s for s in model["sections"] if s["key"] == "training_domain")
    erm, dro = section["overview"]["rows"]
    vlcs = section["overview"]["columns"].index("VLCS")
    assert erm["algorithm"] == "ERM" and erm["cells"][vlcs]["gain_over_erm"] == 0
    assert erm["avg"] is None and erm["gain_over_erm"] is None    # X where a cell is
    assert erm["mean_rank"] == 1 and erm["cells"][vlcs]["rank"] == 1
    assert dro["cells"][vlcs]["rank"] is None                     # no GroupDRO on VLCS
    pub = next(p for p in section["published_overview"]
               if p["source"] == "domainbed_2020" and p["algorithm"] == "ERM")
    assert pub["cells"][vlcs]["text"] == "77.5 +/- 0.4"
    assert pub["cells"][vlcs]["diff"] == pytest.approx(erm["cells"][vlcs]["mean"] - 77.5)
    table = next(t for t in section["tables"] if t["dataset"] == "VLCS")
    irm = next(p for p in table["published"] if p["algorithm"] == "IRM")
    assert [c["text"] for c in irm["cells"]] == ["98.6 +/- 0.1", "64.9 +/- 0.9",
                                                 "73.4 +/- 0.6", "77.3 +/- 0.9"]
    assert "diff" not in irm["cells"][0]          # the user has no IRM run
    html = (out / "dataset_VLCS.html").read_text()
    assert 'class="published"' in html and "Δ +0.3" in html   # ERM C: 98.0 vs 97.7


def test_bad_input_is_reported_not_fatal(mixed_site):
    out, model = mixed_site
    labels = [d["label"] for d in model["datasets"]]
    assert "VLCS" in labels
    variants = [label for label in labels if label.startswith("Debug28[")]
    assert len(variants) == 2                      # two fingerprints, never pooled
    notes = " ".join(model["notes"])
    assert "1 corrupt or truncated results.jsonl line" in notes
    assert "1 run without a 'done' marker" in notes
    assert "shown apart" in notes and all(v in notes for v in variants)
    index = (out / "index.html").read_text()
    assert "1 corrupt or truncated results.jsonl line" in index
    assert len(list(out.glob("dataset_Debug28*.html"))) == 2
    sections = {s["key"]: s for s in model["sections"]}
    loo = next(t for t in sections["leave_one_out"]["tables"] if t["dataset"] == variants[0])
    assert loo["rows"][0]["cells"][0]["missing"] == lbmodel.LOO_NEEDS
    wg = next(t for t in sections["worst_group"]["tables"] if t["dataset"] == variants[0])
    assert wg["rows"][0]["cells"][0]["text"] != "X"   # worst-group accuracy where groups
    assert wg["rows"][0]["cells"][1]["missing"] == "no run with test environment 1 alone"
    assert "VLCS" not in [t["dataset"] for t in sections["worst_group"]["tables"]]
    assert model["analysis"]["aotl"]["VLCS"]["splits"][0]["verdict"]
    assert "at least 3" in model["analysis"]["aotl"][variants[0]]["missing"]
    assert (out / model["analysis"]["aotl"]["VLCS"]["splits"][0]["image"]).stat().st_size


def test_empty_sweep_builds_with_published_rows(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli(["--input_dir", str(tmp_path / "empty"), "--out", str(tmp_path / "site")])
    assert proc.returncode == 0, proc.stderr
    assert "no records found under" in proc.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "no records found under" in index and "Missing: no records" in index
    assert "72.15 +/- 0.03" in (tmp_path / "site" / "published.html").read_text()


def test_bad_arguments_exit_2_before_any_work(tmp_path):
    cases = [(["--input_dir", str(tmp_path / "nope"), "--out", str(tmp_path / "a")],
              "does not exist"),
             (["--input_dir", str(tmp_path), "--out", str(tmp_path / "a"), "--oodselect",
               str(tmp_path)], "has no summary.csv"),
             (["--input_dir", str(tmp_path), "--out", str(REPO / "docs")],
              "holds no leaderboard")]
    for argv, message in cases:
        proc = run_cli(argv)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "a").exists()


def test_oodselect_panel(tmp_path):
    import numpy as np

    from analysis.oodselect import cli as oodselect_cli
    rng = np.random.default_rng(0)
    a = (rng.random((30, 60)) < np.linspace(0.3, 0.9, 30)[:, None]).astype(np.uint8)
    np.savez(tmp_path / "m.npz", A=a, y=a.mean(1) * 0.5 + 0.4)
    ood = tmp_path / "ood"
    with redirect_stdout(io.StringIO()):
        oodselect_cli.main(["--matrix", str(tmp_path / "m.npz"), "--sizes", "5", "10",
                            "--out", str(ood), "--steps", "30", "--patience", "10",
                            "--baselines", "random", "--random-draws", "3", "--bootstrap",
                            "5", "--quiet"])
    (tmp_path / "empty").mkdir()
    with redirect_stdout(io.StringIO()):
        cli.main(["--input_dir", str(tmp_path / "empty"), "--out", str(tmp_path / "site"),
                  "--oodselect", str(ood)])
    site = tmp_path / "site"
    model = json.loads((site / "leaderboard.json").read_text())
    panel = model["analysis"]["oodselect"][0]
    assert (site / panel["image"]).read_bytes() == (ood / "correlation_vs_size.png").read_bytes()
    r_test = next(r["r_test"] for r in panel["summary"] if r["method"] == "oodselect"
                  and r["n"] == "5")
    assert f"{float(r_test):.3f}" in (site / "index.html").read_text()


def shipped(name):
    return published.load_source(name)


def test_domainbed_conversion_matches_results_tex():
    need_data(TEX, "DomainBed's published results.tex")
    rows = published.parse_results_tex(TEX.read_text())
    assert rows == shipped("domainbed_2020.json")["rows"]
    assert {r["method"] for r in rows} == {"training_domain", "leave_one_out", "oracle"}
    tables = {r["table"] for r in rows}
    assert tables == {"ColoredMNIST", "RotatedMNIST", "VLCS", "PACS", "OfficeHome",
                      "TerraIncognita", "DomainNet", "Averages"}
    # Every printed cell reads back as printed.
    printed = re.findall(r"(\d+\.\d) \$\\pm\$ (\d+\.\d)", TEX.read_text())
    shown = [(f"{r['mean']:.1f}", f"{r['err']:.1f}") for r in rows if r["err"] is not None]
    assert shown == printed


def test_transcriptions_match_paper_notes():
    # development material, never shipped: a user's clone (even under CI=true) lacks it, so
    # this is a plain skip, unlike the reference data in tests/data
    if not (NOTES / "notes_003.md").is_file():
        pytest.skip(f"the team's paper notes (development material, not shipped) are not at "
                    f"{NOTES}")
    checks = [("spawrious_2023_table3.json", "notes_003.md", "ERM", "SpawriousO2O_easy",
               "72.15±0.03", "| ERM | 72.15±0.03 | 69.85±0.01 |"),
              ("spawrious_2023_table3.json", "notes_003.md", "MMD-AAE", "SpawriousM2M_hard",
               "58.26±0.00", "| MMD-AAE |"),
              ("oodbench_2022_tables12.json", "notes_004.md", "RSC", "PACS", "82.8±0.4",
               "| RSC | 82.8±0.4↑ |"),
              ("oodbench_2022_tables12.json", "notes_004.md", "VREx", "OoDBenchColoredMNIST",
               "56.3±1.9", "| VREx | 56.3±1.9↑ |"),
              ("spurious_validity_table1.json", "notes_002.md", "LISA", "Waterbirds", "86.98",
               "| Waterbirds | 1.32 | 12.65 | 5.31 | 0.41 | LISA | 86.98 |")]
    for name, notes, alg, column, value, line in checks:
        full = next(t for t in (NOTES / notes).read_text().splitlines() if t.startswith(line))
        assert value in full, (line, value)
        row = next(r for r in shipped(name)["rows"]
                   if r["algorithm"] == alg and r["column"] == column)
        mean, _, err = value.partition("±")
        assert row["mean"] == float(mean) and row["err"] == (float(err) if err else None)
    for name in published.data_files():
        src = shipped(name)["source"]
        assert src["licence"] and src["citation"] and src["note"], name


def test_dataset_level_published_rows_land_in_the_avg_column(tmp_path):
    """Spawrious' Table 3 gives one number per benchmark: it sits in the Avg column of the
    dataset's table and in the overview, with the difference to the user's number."""
    from domainbed.results.records import load_records
    args = {"dataset": "SpawriousO2O_easy", "algorithm": "ERM", "trial_seed": 0,
            "hparams_seed": 0, "test_envs": [2], "env_names": ["e0", "e1", "test"]}
    record = {"args": args, "hparams": {}, "step": 10, "env0_in_acc": 0.9,
              "env0_out_acc": 0.9, "env1_in_acc": 0.9, "env1_out_acc": 0.8,
              "env2_in_acc": 0.7, "env2_out_acc": 0.7}
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text(json.dumps(record) + "\n")
    (run / "done").write_text("done\n")
    model = lbmodel.build_model(load_records(str(tmp_path), quiet=True),
                                published.load_published(),
                                [model_selection.IIDAccuracySelectionMethod])
    table = model["sections"][0]["tables"][0]
    spawrious = [p for p in table["published"] if p["source"] == "spawrious_2023_table3"]
    erm = next(p for p in spawrious if p["algorithm"] == "ERM")
    assert erm["avg"]["text"] == "72.15 +/- 0.03" and erm["cells"] == [None, None, None]
    assert table["rows"][0]["avg"] is None and "diff" not in erm["avg"]  # Avg is X
    # The overview averages over the environments run, so there the difference shows.
    section = model["sections"][0]
    over = next(p for p in section["published_overview"]
                if p["source"] == "spawrious_2023_table3" and p["algorithm"] == "ERM")
    assert section["overview"]["rows"][0]["cells"][0]["text"] == "70.0"   # one trial
    assert over["cells"][0]["diff"] == pytest.approx(70.0 - 72.15)
    assert {p["algorithm"] for p in spawrious} == {"ERM", "GroupDRO", "IRM", "CORAL",
                                                   "CausIRL", "MMD-AAE"}


def test_overview_explains_its_x_cells(mixed_site):
    """Each X of the overview points at a footnote saying why (as the dataset pages'
    cells do; issue 43, item 6)."""
    out, _ = mixed_site
    index = (out / "index.html").read_text()
    tables = index.split('<table class="board">')[1:]
    with_x = [t.split("</ul>")[0] for t in tables if re.search(r">X(<| <small)", t)]
    assert with_x
    for table in with_x:
        assert "X: " in table and 'class="note-ref">[1]</small>' in table, table[-600:]
