"""A literal scipy implementation of Algorithm 2 (the official quantify.py's steps with
sklearn's StandardScaler and scipy.stats.gaussian_kde), kept to check that the vectorised
estimator gives the same numbers. Slow: every KDE is evaluated by scipy."""
from __future__ import annotations

import numpy as np
from scipy.stats import gaussian_kde

from oodutils.errors import require


def reference_estimate(z_p: np.ndarray, y_p: np.ndarray, z_q: np.ndarray, y_q: np.ndarray,
                       sample_size: int = 10000, eps_div: float = 1e-12, eps_cor: float = 5e-4,
                       seed: int = 0, bw_method: str | float | None = None) -> dict[str, float]:
    StandardScaler = require("sklearn.preprocessing", extra="analysis").StandardScaler
    z_p, z_q = np.asarray(z_p, dtype=np.float64), np.asarray(z_q, dtype=np.float64)
    y_p, y_q = np.asarray(y_p), np.asarray(y_q)
    z_all = np.append(z_p, z_q, 0)
    scaler = StandardScaler().fit(z_all)
    z_all, z_p, z_q = map(scaler.transform, (z_all, z_p, z_q))
    sampling_pdf = gaussian_kde(z_all.T, bw_method)
    points = sampling_pdf.resample(sample_size, seed=seed)
    probs = sampling_pdf(points)
    p = gaussian_kde(z_p.T, bw_method)(points)
    q = gaussian_kde(z_q.T, bw_method)(points)

    in_div = (p < eps_div) | (q < eps_div)
    div = float(np.sum(np.abs(p - q)[in_div] / probs[in_div]) / (2 * sample_size))

    classes = sorted(np.unique(y_p))
    sizes, cors = np.zeros(len(classes)), np.zeros(len(classes))
    in_cor = (p > eps_cor) & (q > eps_cor)
    for i, y in enumerate(classes):
        p_y = gaussian_kde(z_p[y_p == y].T, bw_method)(points)
        q_y = gaussian_kde(z_q[y_q == y].T, bw_method)(points)
        sizes[i] = np.sum(y_p == y)
        integrand = np.abs(p_y[in_cor] * np.sqrt(q[in_cor] / p[in_cor])
                           - q_y[in_cor] * np.sqrt(p[in_cor] / q[in_cor]))
        cors[i] = np.sum(integrand / probs[in_cor]) / (2 * sample_size)
    cor = float(np.sum(sizes * cors) / np.sum(sizes))
    return {"diversity": div, "correlation": cor}
