"""A vectorised Gaussian kernel density estimator that gives scipy.stats.gaussian_kde's numbers.

Same bandwidth rules (Scott's by default, Silverman's, a scalar factor or a callable taking
the estimator), the same full data covariance (unbiased, scaled by factor**2), the same
density values (whitening by the Cholesky factor, kernel sum, normalisation), and
`resample` draws the very numbers scipy draws for the same integer seed. Evaluation is done
in float64 blocks with torch matrix products instead of scipy's per-pair loop, so large
evaluations (tens of thousands of points against as many) stay practical.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy.linalg import solve_triangular

#: entries of the (points x data) block evaluated at once (float64: 8 bytes each)
BLOCK_ENTRIES = 1 << 17


class KDEError(ValueError):
    """Too few or degenerate points for a Gaussian KDE (scipy raises LinAlgError/ValueError)."""


def _bandwidth_factor(bw_method: str | float | Callable[[GaussianKDE], float] | None, n: int,
                      d: int, kde: GaussianKDE) -> float:
    if bw_method is None or bw_method == "scott":
        return n ** (-1.0 / (d + 4))
    if bw_method == "silverman":
        return (n * (d + 2) / 4.0) ** (-1.0 / (d + 4))
    if isinstance(bw_method, str):
        raise ValueError(f"unknown bandwidth rule {bw_method!r}; valid: scott, silverman, "
                         f"or a positive number")
    if callable(bw_method):
        return float(bw_method(kde))
    return float(bw_method)


class GaussianKDE:
    """Gaussian KDE of `data` (n, d) with a full bandwidth matrix (scipy's model).

    Attributes as scipy: `n`, `d`, `factor`, `covariance`, `cho_cov`, `log_det`.
    """

    def __init__(self, data: ArrayLike,
                 bw_method: str | float | Callable[[GaussianKDE], float] | None = None,
                 device: str = "cpu") -> None:
        data = np.asarray(data, dtype=np.float64)
        if data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2:
            raise KDEError(f"data must be (n, d), got shape {data.shape}")
        self.dataset = data
        self.n, self.d = data.shape
        if self.n <= self.d:
            raise KDEError(f"{self.n} points cannot fit a {self.d}-dimensional Gaussian KDE "
                           f"(need more points than dimensions)")
        if not np.all(np.isfinite(data)):
            raise KDEError("data contain NaN or infinite values")
        self.device = torch.device(device)
        self.factor = _bandwidth_factor(bw_method, self.n, self.d, self)
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise KDEError(f"bandwidth factor must be positive and finite, not {self.factor}")
        cov = np.atleast_2d(np.cov(data, rowvar=False, bias=False))
        try:
            chol = np.linalg.cholesky(cov)
        except np.linalg.LinAlgError as e:
            raise KDEError(f"singular data covariance ({self.n} points in {self.d} "
                           f"dimensions): {e}") from None
        if not np.all(np.diag(chol) > 0):
            raise KDEError("singular data covariance")
        self.data_covariance = cov
        self.covariance = cov * self.factor ** 2
        self.cho_cov = chol * self.factor
        self.log_det = 2.0 * float(np.log(np.diag(self.cho_cov)).sum())
        self._log_norm = 0.5 * self.d * math.log(2 * math.pi) + 0.5 * self.log_det
        self._white: torch.Tensor | None = None

    # --- evaluation -------------------------------------------------------------------
    def _whiten(self, x: ArrayLike) -> np.ndarray:
        return solve_triangular(self.cho_cov, np.asarray(x, dtype=np.float64).T, lower=True).T

    def _white_data(self) -> torch.Tensor:
        """Data as a (d + 2, n) matrix D such that [x, -|x|^2, 1] @ D = -|x - data|^2 for
        whitened, sqrt(1/2)-scaled x: one matrix product gives every kernel exponent."""
        if self._white is None:
            w = np.sqrt(0.5) * self._whiten(self.dataset)
            aug = np.concatenate([2.0 * w.T, np.ones((1, self.n)), -(w * w).sum(1)[None]])
            self._white = torch.from_numpy(np.ascontiguousarray(aug)).to(self.device)
        return self._white

    def _exponents(self, points: ArrayLike) -> Iterator[tuple[int, torch.Tensor]]:
        """Blocks (start, E) with E[i, j] = -|L^-1 (x_i - data_j)|^2 / 2 (L: cho_cov)."""
        points = np.asarray(points, dtype=np.float64)
        if points.ndim == 1:
            points = points[:, None] if self.d == 1 else points[None, :]
        if points.ndim != 2 or points.shape[1] != self.d:
            raise ValueError(f"points have shape {points.shape}, expected (m, {self.d})")
        data = self._white_data()
        pts = np.sqrt(0.5) * self._whiten(points)
        pts = np.concatenate([pts, -(pts * pts).sum(1, keepdims=True),
                              np.ones((len(pts), 1))], axis=1)
        pts = torch.from_numpy(pts).to(self.device)
        block = max(1, BLOCK_ENTRIES // max(1, self.n))
        for start in range(0, len(pts), block):
            # rounding can leave a tiny positive exponent where a point equals a datum
            yield start, torch.mm(pts[start:start + block], data).clamp_(max=0.0)

    def evaluate(self, points: ArrayLike) -> np.ndarray:
        """Density at `points` (m, d) -> (m,), equal to scipy's `gaussian_kde(data.T)(points.T)`.

        Densities that underflow float64 are exactly 0 (as scipy's)."""
        scale = math.exp(-self._log_norm) / self.n
        out = [e.exp_().sum(1).mul_(scale).cpu().numpy() for _, e in self._exponents(points)]
        return np.concatenate(out) if out else np.empty(0)

    __call__ = evaluate
    pdf = evaluate

    def logpdf(self, points: ArrayLike) -> np.ndarray:
        """log density, finite where the density itself underflows (log-sum-exp)."""
        out = [(torch.logsumexp(e, dim=1) - math.log(self.n) - self._log_norm).cpu().numpy()
               for _, e in self._exponents(points)]
        return np.concatenate(out) if out else np.empty(0)

    # --- sampling ---------------------------------------------------------------------
    def resample(self, size: int, seed: int | np.random.RandomState | np.random.Generator
                 | None = None) -> np.ndarray:
        """(size, d) draws, the same numbers as scipy's `resample(size, seed).T`."""
        rng = seed if isinstance(seed, (np.random.RandomState, np.random.Generator)) \
            else np.random.RandomState(seed)
        norm = rng.multivariate_normal(np.zeros(self.d), self.covariance, size=int(size))
        indices = rng.choice(self.n, size=int(size), p=np.full(self.n, 1.0 / self.n))
        return self.dataset[indices] + norm
