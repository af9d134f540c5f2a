"""Analyses say when their input is too small to mean anything: accuracy-on-the-line fits
with few points or few runs, OODSelect with few models per part or tiny subsets."""
import json

import numpy as np
import pandas as pd

from analysis import oodselect as core
from analysis.aotl import cli as aotl_cli
from analysis.aotl import study as aotl_study
from analysis.aotl.stats import fit_warning
from analysis.oodselect import data, protocol
from analysis.oodselect.report import small_input_warnings
from tests.test_aotl import write_csv


def test_fit_warning_thresholds():
    assert fit_warning(10, 3) is None and fit_warning(500) is None
    assert fit_warning(9, 9).startswith("only 9 points (fewer than 10)")
    assert "come from 2 run(s)" in fit_warning(40, 2)
    assert fit_warning(5, 1).count("fewer than") == 2


def test_aotl_table_and_stderr_warn_about_small_fits(tmp_path, capsys):
    rng = np.random.default_rng(0)
    small = {e: rng.uniform(0.5, 0.9, 6) for e in range(3)}    # 6 classifiers
    big = {e: rng.uniform(0.5, 0.9, 40) for e in range(3)}     # 40 classifiers
    write_csv(tmp_path / "small.csv", small, ood=0, dataset="Small")
    write_csv(tmp_path / "big.csv", big, ood=0, dataset="Big")
    assert aotl_cli.main([str(tmp_path), "--table", "per-ood", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    table = pd.read_csv(pd.io.common.StringIO(out)).set_index("dataset")
    assert table.loc["Small", "n"] == 6
    assert table.loc["Small", "warning"].startswith("only 6 points")
    assert pd.isna(table.loc["Big", "warning"])            # an empty cell in the CSV
    # stderr points at the table's warnings once, not each again (issue 43, item 6)
    assert err == ("warning: 1 of 2 fit(s) have too few points to mean much; see the warning "
                   "column of the table\n")


def test_aotl_table_has_no_warning_column_when_every_fit_is_large(tmp_path, capsys):
    rng = np.random.default_rng(1)
    write_csv(tmp_path / "big.csv", {e: rng.uniform(0.5, 0.9, 40) for e in range(3)}, ood=1)
    aotl_cli.main([str(tmp_path), "--table", "per-ood", "--format", "csv"])
    out, err = capsys.readouterr()
    assert "warning" not in out and "warning" not in err


def test_oodselect_small_input_warnings_by_hand():
    runs = np.array([0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    parts = (np.arange(5, 15), np.array([0, 1, 2, 3]), np.array([4]))
    warnings = small_input_warnings(runs, parts, [5, 30])
    # val: 4 models from 2 runs; Fisher at r = 0, m = 4: tanh(1.96 / sqrt(1)) = 0.96
    assert "only 4 val model(s) (fewer than 10): r_val means little; a correlation of 0 " \
           "would have the 95% interval [-0.96, 0.96]" in warnings
    assert any(w.startswith("the val models come from 2 run(s)") for w in warnings)
    # test: 1 model, no interval at all
    assert any(w.startswith("only 1 test model(s)") and "no confidence interval" in w
               for w in warnings)
    assert not any("train model" in w for w in warnings)   # 10 models from 10 runs: enough
    assert warnings[-1].startswith("subset size(s) [5] have fewer than 10 examples")
    assert small_input_warnings(np.arange(40), (np.arange(20), np.arange(20, 30),
                                                np.arange(30, 40)), [10]) == []


def test_oodselect_run_reports_warnings_in_output_and_split_json(tmp_path):
    cm, _ = data.planted_problem(n_runs=8, checkpoints=3, n_aligned=20, n_conflict=5)
    summary, results = protocol.run_selection(
        cm, [10], baselines=("random",), plots=False, out_dir=str(tmp_path),
        selector=core.OODSelect(steps=20, patience=10), random_draws=3, log=lambda *a: 0)
    assert results["warnings"] and any("test model" in w for w in results["warnings"])
    saved = json.loads((tmp_path / "split.json").read_text())["warnings"]
    assert saved == results["warnings"]
    text = protocol.format_summary(summary, results["warnings"])
    assert text.count("\nwarning: ") == len(results["warnings"])


def test_study_summary_carries_the_warnings(tmp_path):
    per_ood = pd.DataFrame({"ood_env": [0, 1], "r": [0.1, 0.5],
                            "warning": ["only 8 points (fewer than 10): ...", np.nan]})
    assert aotl_study.fit_warnings(per_ood) == ["OOD env 0: only 8 points (fewer than 10): ..."]
    lines = aotl_study._warning_lines(["only 2 test model(s)"])
    assert lines[0].startswith("**Warning: too little input") and "- only 2 test model(s)" \
        in lines
    assert aotl_study._warning_lines([]) == []
