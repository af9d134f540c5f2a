"""Algorithm 2 of OoD-Bench (Ye et al., CVPR 2022): diversity and correlation shift of two
feature samples.

    F = F_p u F_q, standardised (pooled zero mean, unit variance)
    w = KDE(F) (importance proposal), p = KDE(F_p), q = KDE(F_q), p_y, q_y per class
    z_1..z_M ~ w (one draw, reused for every class, as the official code)
    D_div = 1/(2M) sum_j [p(z_j) < eps_div or q(z_j) < eps_div] |p - q| / w
    D_cor = 1/(2M) sum_j [p > eps_cor and q > eps_cor]
            sum_y |p(y) p_y sqrt(q/p) - q(y) q_y sqrt(p/q)| / w

The correlation term is Definition 1's sqrt(pq) sum_y |p(y|z) - q(y|z)| with the conditionals
from Bayes' rule, p(y|z) = p(y) p_y(z) / p(z), and p(y), q(y) the class frequencies of each
side. With balanced classes (what the environment classifier's sampling produces) this is
Algorithm 2's 1/|Y| and the official code's sample-size-weighted class average. A class too
small (or too degenerate) for a KDE on either side is skipped with a warning (an error with
strict=True) and the remaining class weights are renormalised, as the official code does.
Every point where a density is 0 (underflow) contributes nothing to the correlation term,
so the estimate is always finite.

The KDE evaluations do not depend on the thresholds, so `ShiftDensities` computes them once
and `diversity(eps)` / `correlation(eps)` are cheap: calibration bisects on them.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ood_bench.kde import GaussianKDE, KDEError


class ShiftEstimationError(ValueError):
    """Inputs the estimator cannot work with (shapes, too few points, degenerate features)."""


class SkippedClassWarning(UserWarning):
    pass


def check_features(z_p: ArrayLike, y_p: ArrayLike, z_q: ArrayLike,
                   y_q: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    z_p, z_q = np.asarray(z_p, dtype=np.float64), np.asarray(z_q, dtype=np.float64)
    y_p, y_q = np.asarray(y_p).reshape(-1), np.asarray(y_q).reshape(-1)
    if z_p.ndim == 1:
        z_p = z_p[:, None]
    if z_q.ndim == 1:
        z_q = z_q[:, None]
    if z_p.ndim != 2 or z_q.ndim != 2 or z_p.shape[1] != z_q.shape[1]:
        raise ShiftEstimationError(f"features must be (n, d) arrays of equal d; got "
                                   f"z_p {z_p.shape}, z_q {z_q.shape}")
    if len(z_p) != len(y_p) or len(z_q) != len(y_q):
        raise ShiftEstimationError(f"features and labels differ in length: z_p {len(z_p)} vs "
                                   f"y_p {len(y_p)}, z_q {len(z_q)} vs y_q {len(y_q)}")
    if not (np.all(np.isfinite(z_p)) and np.all(np.isfinite(z_q))):
        raise ShiftEstimationError("features contain NaN or infinite values")
    return z_p, y_p, z_q, y_q


def standardize(z_p: np.ndarray, z_q: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Pooled standardisation (sklearn's StandardScaler: population std). Columns constant
    over the pooled data carry no information and make every KDE singular: dropped with a
    warning. Returns (z_p, z_q, info)."""
    pooled = np.concatenate([z_p, z_q])
    mean, std = pooled.mean(0), pooled.std(0)
    keep = std > 1e-12 * np.maximum(1.0, np.abs(mean))
    if not keep.any():
        raise ShiftEstimationError("every feature dimension is constant over the pooled data")
    if not keep.all():
        warnings.warn(f"dropping {int((~keep).sum())} constant feature dimension(s) "
                      f"{np.flatnonzero(~keep).tolist()} before the KDEs", stacklevel=2)
    f = lambda z: (z[:, keep] - mean[keep]) / std[keep]  # noqa: E731
    return f(z_p), f(z_q), {"mean": mean.tolist(), "std": std.tolist(),
                            "kept_dims": np.flatnonzero(keep).tolist()}


def _fit(data: np.ndarray, bw_method: str | float | None, device: str, what: str) -> GaussianKDE:
    try:
        return GaussianKDE(data, bw_method=bw_method, device=device)
    except KDEError as e:
        raise ShiftEstimationError(f"cannot fit the KDE of {what}: {e}") from None


class ShiftDensities:
    """All density values Algorithm 2 needs at one importance sample (threshold-free)."""

    def __init__(self, z_p: ArrayLike, y_p: ArrayLike, z_q: ArrayLike, y_q: ArrayLike,
                 sample_size: int = 10000, seed: int = 0, bw_method: str | float | None = "scott",
                 strict: bool = False, standardize_features: bool = True, device: str = "cpu",
                 need_classes: bool = True) -> None:
        t0 = time.time()
        z_p, y_p, z_q, y_q = check_features(z_p, y_p, z_q, y_q)
        self.n_p, self.n_q, self.dim = len(z_p), len(z_q), z_p.shape[1]
        self.scaler: dict[str, Any] | None = None
        if standardize_features:
            z_p, z_q, self.scaler = standardize(z_p, z_q)
        bw = None if bw_method == "scott" else bw_method
        self.bw_method, self.seed, self.sample_size = bw_method, seed, int(sample_size)
        if self.sample_size < 1:
            raise ShiftEstimationError("sample_size must be positive")
        w_kde = _fit(np.concatenate([z_p, z_q]), bw, device, "the pooled features")
        self.points = w_kde.resample(self.sample_size, seed=seed)
        self.w = w_kde(self.points)
        self.p = _fit(z_p, bw, device, "side P")(self.points)
        self.q = _fit(z_q, bw, device, "side Q")(self.points)
        self.classes: list[Any] = []
        self.prior_p: dict[Any, float] = {}
        self.prior_q: dict[Any, float] = {}
        self.p_y: dict[Any, np.ndarray] = {}
        self.q_y: dict[Any, np.ndarray] = {}
        self.skipped: dict[Any, str] = {}
        self.counts: dict[Any, tuple[int, int]] = {}
        if need_classes:
            self._fit_classes(z_p, y_p, z_q, y_q, bw, device, strict)
        self.seconds = time.time() - t0

    def _fit_classes(self, z_p: np.ndarray, y_p: np.ndarray, z_q: np.ndarray, y_q: np.ndarray,
                     bw: str | float | None, device: str, strict: bool) -> None:
        labels = np.union1d(np.unique(y_p), np.unique(y_q))
        for y in labels:
            in_p, in_q = y_p == y, y_q == y
            key = y.item() if hasattr(y, "item") else y
            self.counts[key] = (int(in_p.sum()), int(in_q.sum()))
            self.prior_p[key] = in_p.mean() if self.n_p else 0.0
            self.prior_q[key] = in_q.mean() if self.n_q else 0.0
            try:
                if not in_p.any() or not in_q.any():
                    raise KDEError("the class is absent from one side (label shift)")
                p_y = GaussianKDE(z_p[in_p], bw_method=bw, device=device)(self.points)
                q_y = GaussianKDE(z_q[in_q], bw_method=bw, device=device)(self.points)
            except KDEError as e:
                msg = (f"class y={key}: cannot fit a KDE with {self.counts[key][0]} (P) and "
                       f"{self.counts[key][1]} (Q) points in {z_p.shape[1]} dimensions ({e})")
                if strict:
                    raise ShiftEstimationError(msg + "; drop --strict to skip such classes") from e
                warnings.warn(msg + "; skipped", SkippedClassWarning, stacklevel=3)
                self.skipped[key] = str(e)
                continue
            self.classes.append(key)
            self.p_y[key], self.q_y[key] = p_y, q_y

    # --- the two estimates ------------------------------------------------------------
    def div_mask(self, eps_div: float) -> np.ndarray:
        return (self.p < eps_div) | (self.q < eps_div)

    def cor_mask(self, eps_cor: float) -> np.ndarray:
        eps = max(float(eps_cor), 0.0)
        return (self.p > eps) & (self.q > eps)

    def _ratio(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # |.| / w where the point counts; w > 0 for any point drawn from w, but guard anyway
        ok = mask & (self.w > 0)
        inv_w = np.zeros_like(self.w)
        inv_w[ok] = 1.0 / self.w[ok]
        return ok, inv_w

    def diversity(self, eps_div: float = 1e-12) -> float:
        ok, inv_w = self._ratio(self.div_mask(eps_div))
        value = float(np.sum(np.abs(self.p - self.q) * inv_w) / (2 * self.sample_size))
        return value if np.isfinite(value) else 0.0

    def _cor_factors(self, eps_cor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ok, inv_w = self._ratio(self.cor_mask(eps_cor))
        sq = np.zeros_like(self.p)
        sq[ok] = np.sqrt(self.q[ok] / self.p[ok])
        isq = np.zeros_like(self.p)
        isq[ok] = 1.0 / sq[ok]
        return ok, inv_w, sq, isq

    def class_terms(self, eps_cor: float = 5e-4) -> dict[Any, float]:
        """{y: 1/(2M) sum_j |p_y sqrt(q/p) - q_y sqrt(p/q)| / w} (the official per-class value)."""
        ok, inv_w, sq, isq = self._cor_factors(eps_cor)
        return {y: float(np.sum((np.abs(self.p_y[y] * sq - self.q_y[y] * isq) * inv_w)[ok])
                         / (2 * self.sample_size)) for y in self.classes}

    def correlation(self, eps_cor: float = 5e-4) -> float:
        if not self.classes:
            raise ShiftEstimationError(
                f"no class could be estimated (counts per class P/Q: {self.counts})")
        ok, inv_w, sq, isq = self._cor_factors(eps_cor)
        total, mass = 0.0, 0.0
        for y in self.classes:
            a, b = self.prior_p[y], self.prior_q[y]
            term = np.abs(a * self.p_y[y] * sq - b * self.q_y[y] * isq) * inv_w
            total += float(np.sum(term[ok]))
            mass += 0.5 * (a + b)
        value = total / (2 * self.sample_size) / mass
        return value if np.isfinite(value) else 0.0

    def result(self, eps_div: float = 1e-12, eps_cor: float = 5e-4,
               mode: str = "both") -> dict[str, Any]:
        out = {"eps_div": eps_div, "eps_cor": eps_cor, "sample_size": self.sample_size,
               "seed": self.seed, "bandwidth": self.bw_method, "n_p": self.n_p,
               "n_q": self.n_q, "dim": self.dim, "seconds": round(self.seconds, 3)}
        if mode in ("both", "div"):
            out["diversity"] = self.diversity(eps_div)
            out["frac_div_region"] = float(self.div_mask(eps_div).mean())
        if mode in ("both", "cor"):
            out["correlation"] = self.correlation(eps_cor)
            out["frac_cor_region"] = float(self.cor_mask(eps_cor).mean())
            terms = self.class_terms(eps_cor)
            out["per_class"] = {str(y): {"n_p": self.counts[y][0], "n_q": self.counts[y][1],
                                         "correlation": terms[y]} for y in self.classes}
            out["skipped_classes"] = {str(y): {"n_p": self.counts[y][0],
                                               "n_q": self.counts[y][1], "reason": r}
                                      for y, r in self.skipped.items()}
        return out


def estimate_shifts(z_p: ArrayLike, y_p: ArrayLike, z_q: ArrayLike, y_q: ArrayLike,
                    sample_size: int = 10000, eps_div: float = 1e-12, eps_cor: float = 5e-4,
                    seed: int = 0, mode: str = "both", bw_method: str | float | None = "scott",
                    strict: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Algorithm 2: {'diversity', 'correlation', ...diagnostics}. mode: both | div | cor."""
    if mode not in ("both", "div", "cor"):
        raise ShiftEstimationError(f"mode must be both, div or cor, not {mode!r}")
    dens = ShiftDensities(z_p, y_p, z_q, y_q, sample_size=sample_size, seed=seed,
                          bw_method=bw_method, strict=strict, device=device,
                          need_classes=mode != "div")
    return dens.result(eps_div, eps_cor, mode)


class ShiftEstimator:
    """scikit-learn style: configure, `fit(z_p, y_p, z_q, y_q)`, read `diversity_`,
    `correlation_` and `result_`."""

    def __init__(self, sample_size: int = 10000, eps_div: float = 1e-12, eps_cor: float = 5e-4,
                 bw_method: str | float | None = "scott", seed: int = 0, strict: bool = False,
                 device: str = "cpu") -> None:
        self.sample_size, self.eps_div, self.eps_cor = sample_size, eps_div, eps_cor
        self.bw_method, self.seed, self.strict, self.device = bw_method, seed, strict, device

    def fit(self, z_p: ArrayLike, y_p: ArrayLike, z_q: ArrayLike, y_q: ArrayLike) -> ShiftEstimator:
        self.densities_ = ShiftDensities(z_p, y_p, z_q, y_q, self.sample_size, self.seed,
                                         self.bw_method, self.strict, device=self.device)
        self.result_ = self.densities_.result(self.eps_div, self.eps_cor)
        self.diversity_ = self.result_["diversity"]
        self.correlation_ = self.result_["correlation"]
        return self


def iid_split(z_p: ArrayLike, y_p: ArrayLike, z_q: ArrayLike, y_q: ArrayLike,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pool both sides and split every class 50/50 at random (the i.i.d. reference)."""
    z_p, y_p, z_q, y_q = check_features(z_p, y_p, z_q, y_q)
    z, y = np.concatenate([z_p, z_q]), np.concatenate([y_p, y_q])
    rng = np.random.RandomState(seed)
    parts_a: list[np.ndarray] = []
    parts_b: list[np.ndarray] = []
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        rng.shuffle(idx)
        parts_a.append(idx[: len(idx) // 2])
        parts_b.append(idx[len(idx) // 2:])
    a, b = np.concatenate(parts_a), np.concatenate(parts_b)
    return z[a], y[a], z[b], y[b]
