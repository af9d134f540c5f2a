"""OoD-Bench estimator: KDE agreement with scipy, Algorithm 2 on synthetic features with
known answers, guards (finite values, class skipping), calibration search."""
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import gaussian_kde

from ood_bench.estimator import (
    ShiftDensities,
    ShiftEstimationError,
    ShiftEstimator,
    SkippedClassWarning,
    estimate_shifts,
    iid_split,
)
from ood_bench.estimator_defaults import parse_bandwidth
from ood_bench.kde import GaussianKDE, KDEError
from ood_bench.reference import reference_estimate
from ood_bench.trials import bisect_thresholds, mean_se, summarize
from oodutils.log import ProjectWarning


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def learned_like(n, agree, rng, shift=0.0, d=8):
    """Features the way a trained environment classifier's look: a smooth map of two
    latents (a colour cluster and a nuisance) into d dimensions, so low-dimensional and
    concentrated rather than isotropic. Labels balanced; colour = label w.p. `agree`."""
    w1 = np.random.RandomState(123).randn(2, 16)
    w2 = np.random.RandomState(7).randn(16, d)
    y = rng.randint(0, 2, n)
    c = np.where(rng.rand(n) < agree, y, 1 - y)
    u = np.stack([2.0 * c - 1 + 0.3 * rng.randn(n), rng.randn(n)], 1)
    z = np.tanh(u @ w1) @ w2
    z[:, 0] += shift
    return z, y


# --- KDE -----------------------------------------------------------------------------

@pytest.mark.parametrize("bw", [None, "silverman", 0.3])
def test_kde_matches_scipy(bw):
    rng = np.random.RandomState(0)
    x = rng.randn(600, 8) @ rng.randn(8, 8) * 0.3
    pts = np.concatenate([rng.randn(400, 8), x[:50], 30 * rng.randn(20, 8)])
    ours, ref = GaussianKDE(x, bw), gaussian_kde(x.T, bw)
    a, b = ours(pts), ref(pts.T)
    assert np.array_equal(a == 0, b == 0)  # underflow at the same points
    nz = b > 0
    np.testing.assert_allclose(a[nz], b[nz], rtol=1e-9)
    np.testing.assert_allclose(ours.covariance, ref.covariance, rtol=1e-12)
    np.testing.assert_allclose(ours.resample(200, seed=5), ref.resample(200, seed=5).T,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.logpdf(pts[:30]), ref.logpdf(pts[:30].T), rtol=1e-9)


def test_kde_one_dimensional_and_errors():
    x = np.random.RandomState(1).randn(40, 1)
    np.testing.assert_allclose(GaussianKDE(x)(np.linspace(-3, 3, 9)[:, None]),
                               gaussian_kde(x[:, 0])(np.linspace(-3, 3, 9)), rtol=1e-10)
    with pytest.raises(KDEError):
        GaussianKDE(np.random.randn(5, 8))  # fewer points than dimensions
    with pytest.raises(KDEError):
        GaussianKDE(np.ones((50, 3)))  # singular covariance
    assert parse_bandwidth("Scott") == "scott" and parse_bandwidth("0.5") == 0.5
    with pytest.raises(ValueError):
        parse_bandwidth("-1")


# --- Algorithm 2 ---------------------------------------------------------------------

def test_estimator_matches_scipy_reference():
    rng = np.random.RandomState(3)
    z_p, y_p = learned_like(300, 0.9, rng)
    z_q, y_q = learned_like(300, 0.3, rng)
    # balance classes exactly, as the environment classifier's data are
    keep_p, keep_q = [], []
    for c in (0, 1):
        n = min((y_p == c).sum(), (y_q == c).sum())
        keep_p.append(np.flatnonzero(y_p == c)[:n])
        keep_q.append(np.flatnonzero(y_q == c)[:n])
    z_p, y_p = z_p[np.concatenate(keep_p)], y_p[np.concatenate(keep_p)]
    z_q, y_q = z_q[np.concatenate(keep_q)], y_q[np.concatenate(keep_q)]
    for eps_div, eps_cor in ((1e-12, 5e-4), (1e-3, 1e-2)):
        ours = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=2000, seed=4,
                               eps_div=eps_div, eps_cor=eps_cor)
        ref = reference_estimate(z_p, y_p, z_q, y_q, sample_size=2000, seed=4,
                                 eps_div=eps_div, eps_cor=eps_cor)
        assert ours["diversity"] == pytest.approx(ref["diversity"], rel=1e-7, abs=1e-12)
        assert ours["correlation"] == pytest.approx(ref["correlation"], rel=1e-7, abs=1e-12)


def _estimate(agree_p, agree_q, shift_q=0.0, n=2000, d=8, seed=0):
    rng = np.random.RandomState(seed)
    z_p, y_p = learned_like(n, agree_p, rng, d=d)
    z_q, y_q = learned_like(n, agree_q, rng, shift=shift_q, d=d)
    return estimate_shifts(z_p, y_p, z_q, y_q, sample_size=5000, seed=seed)


def test_known_answers_on_learned_like_features():
    same = _estimate(0.9, 0.9)
    flip = _estimate(0.9, 0.1)
    apart = _estimate(0.9, 0.9, shift_q=30.0)
    # identical distributions: no diversity; correlation only KDE noise, far below a flip
    assert same["diversity"] < 0.01
    assert same["correlation"] < 0.15
    assert same["correlation"] < 0.2 * flip["correlation"]
    # same support, p(y|z) flipped (|0.9 - 0.1| = 0.8 for exact colour features)
    assert flip["diversity"] < 0.01
    assert 0.6 < flip["correlation"] <= 1.0
    # disjoint supports: diversity ~1 (importance sampling error allowed), no correlation
    assert 0.85 < apart["diversity"] < 1.25
    assert apart["correlation"] < 0.01
    assert apart["frac_div_region"] > 0.99
    for r in (same, flip, apart):
        assert r["diversity"] >= 0 and r["correlation"] >= 0
        assert np.isfinite(r["diversity"]) and np.isfinite(r["correlation"])


def test_identical_low_dimensional_features_are_near_zero():
    r = _estimate(0.8, 0.8, d=2)
    assert r["diversity"] < 0.01 and r["correlation"] < 0.06


def test_correlation_grows_with_the_flip():
    cors = [_estimate(0.9, agree, n=1000)["correlation"] for agree in (0.9, 0.7, 0.5, 0.1)]
    assert cors == sorted(cors)


def test_finite_where_densities_underflow():
    rng = np.random.RandomState(0)
    z_p, y_p = learned_like(400, 0.9, rng)
    z_q, y_q = learned_like(400, 0.9, rng, shift=15.0)
    # thresholds 0: points where p or q underflows to exactly 0 must not give NaN / inf
    r = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=2000, eps_div=0.0, eps_cor=0.0)
    assert np.isfinite(r["diversity"]) and np.isfinite(r["correlation"])
    dens = ShiftDensities(z_p, y_p, z_q, y_q, sample_size=2000)
    assert (dens.p == 0).any() or (dens.q == 0).any()


def test_small_class_is_skipped_or_strict_error():
    rng = np.random.RandomState(1)
    z_p, y_p = learned_like(600, 0.9, rng)
    z_q, y_q = learned_like(600, 0.2, rng)
    y_p, y_q = y_p.copy(), y_q.copy()
    y_p[:3], y_q[:3] = 2, 2  # a class of 3 points per side: no 8-d KDE possible
    with pytest.warns(SkippedClassWarning, match="y=2"):
        r = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=1000)
    assert "2" in r["skipped_classes"] and set(r["per_class"]) == {"0", "1"}
    assert np.isfinite(r["correlation"])
    with pytest.raises(ShiftEstimationError, match="y=2"):
        estimate_shifts(z_p, y_p, z_q, y_q, sample_size=1000, strict=True)


def test_input_checks_and_constant_dimensions():
    rng = np.random.RandomState(2)
    z, y = learned_like(300, 0.9, rng)
    with pytest.raises(ShiftEstimationError):
        estimate_shifts(z, y[:-1], z, y)
    with pytest.raises(ShiftEstimationError):
        estimate_shifts(z[:, :4], y, z, y)
    z_nan = z.copy()
    z_nan[0, 0] = np.nan
    with pytest.raises(ShiftEstimationError):
        estimate_shifts(z_nan, y, z, y)
    padded = np.concatenate([z, np.ones((len(z), 1))], 1)  # a dead feature dimension
    with pytest.warns(UserWarning, match="constant"):
        r = estimate_shifts(padded, y, padded, y, sample_size=500)
    assert r["dim"] == 9 and np.isfinite(r["correlation"])


def test_modes_and_sklearn_style_estimator():
    rng = np.random.RandomState(5)
    z_p, y_p = learned_like(300, 0.9, rng)
    z_q, y_q = learned_like(300, 0.1, rng)
    r = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=1000, mode="div")
    assert "diversity" in r and "correlation" not in r
    est = ShiftEstimator(sample_size=1000, seed=0).fit(z_p, y_p, z_q, y_q)
    both = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=1000, seed=0)
    assert est.correlation_ == both["correlation"] and est.diversity_ == both["diversity"]


def test_iid_split_and_calibration_search():
    rng = np.random.RandomState(6)
    z_p, y_p = learned_like(600, 0.9, rng)
    z_q, y_q = learned_like(600, 0.1, rng)
    a, b, c, d = iid_split(z_p, y_p, z_q, y_q, seed=0)
    assert len(a) + len(c) == 1200
    for label in (0, 1):
        assert abs((b == label).sum() - (d == label).sum()) <= 1
    iid = [ShiftDensities(a, b, c, d, sample_size=2000, seed=0)]
    # this pair's i.i.d. correlation stays above the bound whatever the threshold: the
    # search moves eps_cor up at every step and says that it stopped short
    with pytest.warns(ProjectWarning, match="did not bring the i.i.d. estimates"):
        cal = bisect_thresholds(iid)
    assert not cal["converged"] and cal["iterations"] == 20
    assert 0 <= cal["eps_div"] <= 1e-6 and 0 <= cal["eps_cor"] <= 1
    eps_cor = [h["eps_cor"] for h in cal["history"]]
    assert eps_cor == sorted(eps_cor) and all(h["iid_cor"] > 1e-2 for h in cal["history"])


class _LinearShift:
    """i.i.d. estimates with a known shape: diversity 3e4 * eps, correlation 0.03 (1 - eps)."""

    def diversity(self, eps):
        return 3e4 * eps

    def correlation(self, eps):
        return 0.03 * (1 - eps)


def test_calibration_search_halves_toward_the_band():
    # step 1: eps 5e-7 / 0.5 give 0.015 / 0.015, both above 0.01: eps_div down, eps_cor up;
    # step 2: eps 2.5e-7 / 0.75 give 0.0075 / 0.0075, inside [0.005, 0.01]
    cal = bisect_thresholds([_LinearShift()])
    assert cal["converged"] and cal["iterations"] == 2
    assert cal["eps_div"] == pytest.approx(2.5e-7) and cal["eps_cor"] == pytest.approx(0.75)
    assert cal["iid_div"] == pytest.approx(0.0075) and cal["iid_cor"] == pytest.approx(0.0075)


def test_summary_is_mean_and_standard_error():
    s = summarize([{"diversity": 0.1, "correlation": 0.5},
                   {"diversity": 0.3, "correlation": 0.7}])
    assert s["diversity"]["mean"] == pytest.approx(0.2)
    assert s["diversity"]["se"] == pytest.approx(np.std([0.1, 0.3], ddof=1) / np.sqrt(2))
    assert mean_se([])["n"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mean_se([1.0])["se"] == 0.0
