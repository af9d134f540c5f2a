"""How sure a leaderboard is (collect_results --stats): each statistic on synthetic sweeps
whose answer is known by construction, and the command on DomainBed's test sweep."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import selection_stats as stats
from domainbed.results import model_selection as ms
from tests.builders import record, run_args
from tests.requirements import data_dir, need_data

ROOT = Path(__file__).resolve().parents[1]
IID = ms.IIDAccuracySelectionMethod


def run(algorithm, trial, test_env, hparams_seed, val, test, dataset="Toy"):
    """One finished run's last record on 3 environments: `val` on every training env's
    out split (what training-domain validation reads), `test` on the test env's in split;
    the oracle reads the test env's out split, set to `test` too."""
    accs = {env: (test, test) if env == test_env else (val, val) for env in range(3)}
    return record(10, run_args(dataset, algorithm, [test_env], trial, hparams_seed),
                  {"lr": 0.001 * (hparams_seed + 1)}, accs)


def sweep(spec):
    """spec: {algorithm: fn(trial, test_env, hparams_seed) -> (val, test)}."""
    return [run(a, t, e, h, *fn(t, e, h)) for a, fn in spec.items()
            for t in range(3) for e in range(3) for h in range(4)]


def test_expected_best_is_dodges_formula():
    # validation order 1 < 2 < 3; k=1: the mean; k=2: 10/9 + 20*3/9 + 30*5/9
    assert stats.expected_best([1, 2, 3], [10, 20, 30], 1) == pytest.approx(20)
    assert stats.expected_best([1, 2, 3], [10, 20, 30], 2) == pytest.approx(220 / 9)
    # many draws: the validation-best candidate's test accuracy
    assert stats.expected_best([3, 1, 2], [5, 7, 9], 200) == pytest.approx(5)


def test_a_dominant_algorithm_ranks_first_in_every_resample():
    records = sweep({"ERM": lambda t, e, h: (0.5 + 0.01 * h, 0.5 + 0.01 * t),
                     "Best": lambda t, e, h: (0.5 + 0.01 * h, 0.9 + 0.01 * t),
                     "Worst": lambda t, e, h: (0.5 + 0.01 * h, 0.1 + 0.01 * t)})
    ranks, tau = stats.rank_stability(stats.candidate_table(records, IID), n_boot=50)
    assert list(ranks.index) == ["Best", "ERM", "Worst"]
    assert ranks["P(rank 1)"].tolist() == [1.0, 0.0, 0.0]
    assert ranks["P(rank 3)"].tolist() == [0.0, 0.0, 1.0]
    assert tau == {"mean": 1.0, "low": 1.0, "high": 1.0}


def test_two_close_algorithms_swap_ranks():
    """A wins trial 0, B wins trial 1 (and leads by 0.1 point overall): resampling the
    trials gives each rank 1 in some resamples."""
    records = sweep({"A": lambda t, e, h: (0.5, 0.6 + 0.1 * (t == 0)),
                     "B": lambda t, e, h: (0.5, 0.601 + 0.1 * (t == 1))})
    ranks, tau = stats.rank_stability(stats.candidate_table(records, IID), n_boot=200)
    assert list(ranks.index) == ["B", "A"]
    assert 0.1 < ranks.loc["A", "P(rank 1)"] < 0.9
    assert ranks["P(rank 1)"].sum() == pytest.approx(1)
    assert tau["low"] == -1.0 and tau["high"] == 1.0 and -1 < tau["mean"] < 1


def test_paired_comparison_finds_a_real_gain_and_not_a_null_one():
    gain = sweep({"ERM": lambda t, e, h: (0.5, 0.60 + 0.01 * (3 * t + e)),
                  "Plus": lambda t, e, h: (0.5, 0.65 + 0.01 * (3 * t + e)),
                  "Same": lambda t, e, h: (0.5, 0.60 + 0.01 * (3 * t + e))})
    table = stats.paired_comparison(ms.select(gain, IID)).set_index("algorithm")
    assert table.loc["Plus", "n_pairs"] == 9
    assert table.loc["Plus", "mean_diff"] == pytest.approx(5.0)
    # nine positive differences: Wilcoxon's exact two-sided p = 2 / 2^9
    assert table.loc["Plus", "p_value"] == pytest.approx(2 / 2 ** 9)
    assert table.loc["Same", "mean_diff"] == 0 and table.loc["Same", "p_value"] == 1.0
    assert (table["p_adjusted"] >= table["p_value"] - 1e-12).all()


def test_selection_regret_is_oracle_minus_method():
    # validation prefers hparams 0, whose test accuracy is 10 points below hparams 3's;
    # the oracle reads the test env's out split (= test) and picks hparams 3
    records = sweep({"ERM": lambda t, e, h: (0.9 - 0.1 * h, 0.5 + 0.1 * h / 3)})
    regret = stats.selection_regret(records, IID)
    assert regret.loc["ERM", "Toy"] == pytest.approx(10.0)
    assert stats.selection_regret(records, ms.OracleSelectionMethod).loc["ERM", "Avg"] == 0


def test_expected_best_table_grows_with_draws_when_validation_is_informative():
    records = sweep({"ERM": lambda t, e, h: (0.5 + 0.1 * h, 0.5 + 0.1 * h)})
    table = stats.expected_best_table(stats.candidate_table(records, IID))
    assert list(table.columns) == ["dataset", "algorithm", "k=1", "k=2", "k=4"]
    values = table.iloc[0, 2:].to_numpy(dtype=float)
    assert values[0] == pytest.approx(65.0) and np.all(np.diff(values) > 0)


def test_collect_results_stats_on_domainbeds_test_sweep():
    sweep_dir = need_data(data_dir("domainbed_test_sweep") / "test_sweep_data",
                          "DomainBed's test sweep")
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(sweep_dir), "--no_save", "--stats"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    plain = subprocess.run(proc.args[:-1], capture_output=True, text=True, timeout=600,
                           cwd=ROOT).stdout
    assert proc.stdout.startswith(plain)      # --stats only adds sections
    for title in stats.TITLES:
        assert proc.stdout.count(f"{title}, model selection method:") == 3
    # the oracle's regret against itself is zero
    oracle = proc.stdout.split("Selection regret, model selection method: test-domain")[1]
    assert "ERM        0.00  0.00" in oracle
