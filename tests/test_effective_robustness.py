"""Effective robustness (Taori et al. 2020): each classifier's OOD accuracy above or below
its split's accuracy-on-the-line fit, with the fit's uncertainty."""
import numpy as np
import pytest
from scipy import special, stats

from analysis import aotl
from analysis.aotl.inputs import read_accuracy_csvs
from tests.test_aotl import synthetic_models, write_csv


def test_residuals_and_their_stderr_match_an_ols_fit_done_here(tmp_path):
    accs = synthetic_models(n=60, noise=0.1, seed=3)
    acc = read_accuracy_csvs([write_csv(tmp_path / "env2_out_acc.csv", accs, ood=2)])
    table = aotl.effective_robustness_table(acc)
    assert len(table) == 60 and set(table["ood_env"]) == {2}
    # the same fit by hand: mean ID accuracy over envs 0 and 1, probit with 0.01 clips
    x = (accs[0] + accs[1]) / 2
    tx = special.ndtri(np.clip(x, 0.01, 0.99))
    ty = special.ndtri(np.clip(accs[2], 0.01, 0.99))
    fit = stats.linregress(tx, ty)
    predicted = fit.slope * tx + fit.intercept
    np.testing.assert_allclose(table["er"], ty - predicted, atol=1e-9)
    s = np.sqrt(np.sum((ty - predicted) ** 2) / (len(tx) - 2))
    se = s * np.sqrt(1 / len(tx) + (tx - tx.mean()) ** 2 / np.sum((tx - tx.mean()) ** 2))
    np.testing.assert_allclose(table["er_stderr"], se, rtol=1e-9)
    np.testing.assert_allclose(table["effective_robustness"],
                               100 * (accs[2] - special.ndtr(predicted)), atol=1e-7)
    # OLS residuals sum to zero on the fitted scale
    assert table["er"].sum() == pytest.approx(0, abs=1e-9)


def test_a_robust_model_stands_above_the_line(tmp_path):
    accs = synthetic_models(n=40, noise=0.0, seed=1)
    accs[2][7] = min(0.999, accs[2][7] + 0.2)      # one model 20 points more robust
    acc = read_accuracy_csvs([write_csv(tmp_path / "env2_out_acc.csv", accs, ood=2)])
    table = aotl.effective_robustness_table(acc)
    assert table["effective_robustness"].idxmax() == 7
    assert table.loc[7, "effective_robustness"] > 10


def test_the_command_writes_the_table(tmp_path):
    import subprocess
    import sys
    accs = synthetic_models(n=20, seed=2)
    path = write_csv(tmp_path / "env2_out_acc.csv", accs, ood=2)
    out = tmp_path / "er.csv"
    proc = subprocess.run([sys.executable, "-m", "analysis.aotl", str(path), "--table",
                           "effective-robustness", "--format", "csv", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    header = out.read_text().splitlines()[0].split(",")
    assert {"run", "effective_robustness", "er", "er_stderr"} <= set(header)
