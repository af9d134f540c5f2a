"""Statistics of accuracy on the line: scale transforms, linregress fits, the
well-specified verdict, bootstraps of R (optionally resampling whole runs), the paper's
number-of-classifiers heuristic (Table 3), and PELT change points on a sorted scatter.

Functions take arrays and return numbers or dicts; :mod:`analysis.aotl` builds the
per-split tables from them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import special, stats

from analysis.aotl.options import SCALES
from oodutils.accuracy import AOTL_CLIP, check_clip, probit
from oodutils.errors import UnknownNameError, UserError, require

VERDICTS = ("inverse line", "weak", "on the line")


def transform(acc: ArrayLike, scale: str = "probit", clip: float = AOTL_CLIP) -> np.ndarray:
    """Accuracies -> the fitting scale: ``probit`` Phi^-1 (:func:`oodutils.accuracy.probit`),
    ``logit`` or ``identity``.

    Probit and logit clip accuracies to [clip, 1 - clip] first (identity never clips).
    """
    if scale == "identity":
        return np.asarray(acc, dtype=float).copy()
    if scale not in SCALES:
        raise UnknownNameError("scale", scale, SCALES)
    if scale == "probit":
        return probit(acc, clip)
    a = np.asarray(acc, dtype=float)
    if check_clip(clip) > 0:
        a = np.clip(a, clip, 1 - clip)
    return special.logit(a)


def logit(acc: ArrayLike, clip: float = AOTL_CLIP) -> np.ndarray:
    return transform(acc, "logit", clip)


def inverse_transform(t: ArrayLike, scale: str = "probit") -> np.ndarray:
    t = np.asarray(t, dtype=float)
    if scale == "probit":
        return special.ndtr(t)
    if scale == "logit":
        return special.expit(t)
    return t


def fit_line(x: ArrayLike, y: ArrayLike, scale: str = "probit", clip: float = AOTL_CLIP,
             where: str = "fit") -> dict[str, Any]:
    """Fit OOD accuracy ``y`` on ID accuracy ``x`` on the chosen scale.

    Returns a dict with ``scipy.stats.linregress`` semantics: n, slope, intercept, r, r2,
    p (two-sided, slope = 0), stderr (of the slope), intercept_stderr, and the Spearman rank
    correlation of the raw accuracies. Raises UserError (never returns NaN) when the points
    cannot give a line: fewer than 3, or all x (or all y) equal after clipping.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise UserError(f"{where}: x and y must be 1-d arrays of the same length")
    if len(x) < 3:
        raise UserError(f"{where}: {len(x)} classifier(s); a line needs at least 3")
    tx, ty = transform(x, scale, clip), transform(y, scale, clip)
    if not (np.isfinite(tx).all() and np.isfinite(ty).all()):
        raise UserError(f"{where}: accuracies of exactly 0 or 1 are infinite on the {scale} "
                        "scale; use --clip > 0")
    for t, name in ((tx, "ID"), (ty, "OOD")):
        if np.ptp(t) == 0:
            raise UserError(f"{where}: all {len(t)} {name} accuracies are equal"
                            + (f" after clipping to [{clip}, {1 - clip}]" if clip and
                               scale != "identity" else "") + "; no line can be fitted")
    res = stats.linregress(tx, ty)
    rho = stats.spearmanr(x, y)[0]
    return {"n": int(len(x)), "slope": float(res.slope), "intercept": float(res.intercept),
            "r": float(res.rvalue), "r2": float(res.rvalue ** 2), "p": float(res.pvalue),
            "stderr": float(res.stderr), "intercept_stderr": float(res.intercept_stderr),
            "spearman": float(rho) if np.isfinite(rho) else 0.0}


# Below these a fit is reported with a warning: R over fewer than 10 points has a 95%
# Fisher interval wider than +/-0.63 even at R = 0, so the verdict (R < 0.3) is a coin
# flip; points from fewer than 3 runs are checkpoints of the same few models.
MIN_FIT_POINTS = 10
MIN_FIT_RUNS = 3


def fit_warning(n_points: int, n_runs: int | None = None) -> str | None:
    """Why a fit over `n_points` points from `n_runs` runs means little, or None."""
    reasons = []
    if n_points < MIN_FIT_POINTS:
        reasons.append(f"only {n_points} points (fewer than {MIN_FIT_POINTS}): R's 95% "
                       f"interval is wider than +/-0.63")
    if n_runs is not None and n_runs < MIN_FIT_RUNS:
        reasons.append(f"the points come from {n_runs} run(s) (fewer than {MIN_FIT_RUNS}): "
                       f"checkpoints of the same models, not independent classifiers")
    return "; ".join(reasons) + "; the verdict means little" if reasons else None


def classify(r: float, threshold: float = 0.3) -> tuple[str, bool]:
    """(verdict, well_specified) for a Pearson R.

    ``R <= -threshold``: "inverse line"; ``|R| < threshold``: "weak";
    ``R >= threshold``: "on the line". Well-specified iff ``R < threshold`` (signed: any
    negative or weak correlation), the paper's criterion with threshold 0.3.
    """
    if not (0 < threshold <= 1):
        raise UserError(f"--threshold must lie in (0, 1], got {threshold}")
    verdict = VERDICTS[0] if r <= -threshold else VERDICTS[1] if r < threshold else VERDICTS[2]
    return verdict, bool(r < threshold)


def _unit_stats(tx: np.ndarray, ty: np.ndarray, groups: ArrayLike | None) -> np.ndarray:
    """Per resampling unit: count and sums of x, y, xx, yy, xy (centred), unit count."""
    tx, ty = tx - tx.mean(), ty - ty.mean()
    if groups is None:
        codes, n_units = np.arange(len(tx)), len(tx)
    else:
        codes, uniques = pd.factorize(np.asarray(groups), sort=False)
        n_units = len(uniques)
    cols = [np.ones_like(tx), tx, ty, tx * tx, ty * ty, tx * ty]
    s = np.stack([np.bincount(codes, weights=c, minlength=n_units) for c in cols], axis=1)
    return s


def _r_from_sums(s: np.ndarray) -> np.ndarray:
    n, sx, sy, sxx, syy, sxy = np.moveaxis(s, -1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cxx, cyy, cxy = sxx - sx * sx / n, syy - sy * sy / n, sxy - sx * sy / n
        return cxy / np.sqrt(cxx * cyy)


def bootstrap_r(tx: ArrayLike, ty: ArrayLike, groups: ArrayLike | None = None, n_boot: int = 1000,
                ci: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of Pearson R on already transformed points.

    ``groups`` (e.g. run ids): resample whole groups, since the checkpoints of one run are
    not independent models. Returns (low, high).
    """
    s = _unit_stats(np.asarray(tx, float), np.asarray(ty, float), groups)
    n_units = len(s)
    rng = np.random.default_rng(seed)
    rs: list[np.ndarray] = []
    for start in range(0, n_boot, 100):
        b = min(100, n_boot - start)
        counts = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=b)
        rs.append(_r_from_sums(counts @ s))
    alpha = (1 - ci) / 2
    lo, hi = np.nanquantile(np.concatenate(rs), [alpha, 1 - alpha])
    return float(lo), float(hi)


def classifier_count(tx: ArrayLike, ty: ArrayLike, groups: ArrayLike | None = None,
                     n_boot: int = 1000, conf: float = 0.95, tol: float = 0.01, step: int = 100,
                     start: int = 10, seed: int = 0) -> tuple[int | None, int]:
    """The paper's "number of classifiers" heuristic (Table 3).

    Each bootstrap resample is a sequence of units (classifiers, or whole runs when
    ``groups`` is given) drawn with replacement; R is computed on its first k units for
    k = start, start+step, ... . The minimum count is the first k at which adding ``step``
    more units changes R by less than ``tol`` (relative: |R(k+step) - R(k)| / |R(k)|) in a
    ``conf`` fraction of the resamples. Returns (min_units or None, total_units).
    """
    s = _unit_stats(np.asarray(tx, float), np.asarray(ty, float), groups)
    n_units = len(s)
    grid = np.arange(start, n_units + 1, step)
    if len(grid) < 2:
        return None, n_units
    rng = np.random.default_rng(seed)
    # Draw the resampled sequences window by window (about a million values at a time)
    # and stop at the first stable k, so memory stays bounded whatever n_boot and a split
    # that stabilises early costs little.
    window = max(step, int(1e6 // max(n_boot, 1)) // step * step)
    running = np.zeros((n_boot, 6))
    prev_r, prev_k, pos = None, None, 0
    while pos < grid[-1]:
        end = min(int(grid[-1]), pos + window)
        idx = rng.integers(0, n_units, size=(n_boot, end - pos))
        cs = np.cumsum(s[idx], axis=1) + running[:, None, :]
        running = cs[:, -1, :]
        ks = grid[(grid > pos) & (grid <= end)]
        r = _r_from_sums(cs[:, ks - pos - 1, :])
        if prev_r is not None:
            r, ks = np.column_stack([prev_r, r]), np.concatenate([[prev_k], ks])
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.abs(np.diff(r, axis=1)) / np.abs(r[:, :-1])
        if d.shape[1]:
            q = np.quantile(np.where(np.isfinite(d), d, np.inf), conf, axis=0)
            ok = np.flatnonzero(q < tol)
            if len(ok):
                return int(ks[ok[0]]), n_units
        prev_r, prev_k, pos = r[:, -1], ks[-1], end
    return None, n_units


class _LinearCost:
    """Segment cost for ruptures: residual sum of squares of a least-squares line, O(1)
    per segment from cumulative sums (ruptures' CostLinear solves a lstsq per call)."""
    model = "linear_cumsum"
    min_size = 3

    def fit(self, signal: np.ndarray) -> _LinearCost:
        self.signal = signal
        x, y = signal[:, 0] - signal[:, 0].mean(), signal[:, 1] - signal[:, 1].mean()
        self.c = np.vstack([np.zeros(6), np.cumsum(
            np.stack([np.ones_like(x), x, y, x * x, y * y, x * y], axis=1), axis=0)])
        return self

    def error(self, start: int, end: int) -> float:
        n, sx, sy, sxx, syy, sxy = self.c[end] - self.c[start]
        cxx, cyy, cxy = sxx - sx * sx / n, syy - sy * sy / n, sxy - sx * sy / n
        return max(cyy - (cxy * cxy / cxx if cxx > 1e-12 else 0.0), 0.0)


def changepoints(tx: np.ndarray, ty: np.ndarray, pen: float | None = None,
                 min_size: int | None = None, jump: int | None = None
                 ) -> tuple[np.ndarray, list[int], float]:
    """Change points of a piecewise-linear fit of ty on tx, points sorted by tx (PELT).

    ``pen``: penalty per extra segment in squared residual units; default a BIC penalty
    3 * sigma^2 * ln(n) with sigma^2 the residual variance of one line through all points.
    Returns (order, end indices of the segments in the sorted order, pen used).
    """
    rpt = require("ruptures", extra="analysis")
    BaseCost = require("ruptures.base", extra="analysis").BaseCost
    order = np.argsort(tx, kind="stable")
    sig = np.column_stack([tx[order], ty[order]])
    n = len(sig)
    if pen is None:
        # BIC for one more segment (2 line parameters + 1 change point), with the noise
        # variance of the single-line fit: an overestimate where regimes differ, which keeps
        # PELT from chasing noise (the paper found it noise-sensitive), while a real bend
        # still pays for itself (its residual reduction grows with n).
        var = max(_LinearCost().fit(sig).error(0, n) / max(n - 2, 1), 1e-12)
        pen = 3 * var * np.log(n)
    min_size = max(3, min_size or max(10, n // 20))
    jump = jump or max(1, n // 500)
    cost = type("CostLinearCumsum", (_LinearCost, BaseCost), {})()
    if n < 2 * min_size:
        return order, [n], pen
    algo = rpt.Pelt(custom_cost=cost, min_size=min_size, jump=jump).fit(sig)
    return order, list(algo.predict(pen=pen)), pen
