"""OoD-Bench on Colored MNIST (the paper's Table 3), end to end on the 5,000 offline digits.

Select alone with `pytest tests/test_ood_bench_colored_mnist.py` (or `-k colored_mnist`).
It runs in the default suite: the reduced setting (table3.QUICK: 300 steps of a 128-wide
MLP, 3 seeds, 6 rows + an i.i.d. reference = 21 environment classifiers) takes about half
a minute of CPU time.
"""
import numpy as np
import pytest
import torch

from ood_bench import table3


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data_dir = str(tmp_path_factory.mktemp("digits"))  # empty: the offline 5,000 digits
        return table3.run_table3(data_dir, n_trials=3, seed=0, iid_reference=True,
                                 **table3.QUICK)
    finally:
        torch.set_num_threads(old)


def test_colored_mnist_correlation_shift_tracks_rho_te(results):
    cors = [results[r]["correlation"]["mean"] for r in ("0.9", "0.7", "0.5", "0.3", "0.1")]
    assert table3.spearman_cor_vs_rho(results) >= 0.9, cors
    assert cors[0] > 0.3
    for row in ("0.9", "0.7", "0.5", "0.3", "0.1"):  # red / green only: no diversity shift
        assert results[row]["diversity"]["mean"] < 0.05
    for row in results:
        if row == "iid":
            continue
        for key in ("diversity", "correlation"):
            assert all(np.isfinite(v) and v >= 0 for v in results[row][key]["values"])


def test_colored_mnist_no_shift_row_is_within_iid_noise(results):
    iid = results["iid"]
    row = results["0.1"]
    for key in ("diversity", "correlation"):
        # the calibration accepts i.i.d. estimates up to 1e-2 as noise
        noise = max(1e-2, iid[key]["mean"] + 3 * iid[key]["se"])
        assert row[key]["mean"] <= noise, (key, row[key], iid[key])


def test_colored_mnist_blue_is_diversity_shift(results):
    blue = results["0.1+blue"]
    assert blue["diversity"]["mean"] > 0.7
    assert blue["correlation"]["mean"] < 0.05
    assert blue["diversity"]["mean"] > 10 * blue["correlation"]["mean"]


def test_table3_text_has_ours_beside_the_papers(results):
    text = table3.format_table3(results)
    assert "cor (paper)" in text and "0.67 ± 0.04" in text and "0.1+blue" in text
