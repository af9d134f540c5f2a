"""The theory of Salaudeen et al. 2025, as calculators and simulations.

"Are Domain Generalization Benchmarks with Accuracy on the Line Misspecified?" proves when an
ID/OOD split is *well-specified* (the optimal domain-general classifier f_dg beats the
ID-optimal classifier f_X out of distribution) and why accuracy on the line (AoTL) signals a
misspecified split. Setting: X = [Z_dg; Z_spu], f(X) = w_dg^T Z_dg + w_spu^T Z_spu, and the OOD
spurious features are Z_spu^OOD = phi(Z_spu^ID) with E[Z_spu^OOD] = M mu_spu.

Calculators (plain numpy):
    thm1_margin / thm1_well_specified      Theorem 1's sufficient condition
    thm2_sides / thm2_well_specified       Theorem 2's necessary-and-sufficient SNR test
    lemma2_accuracy                        Lemma 2: acc = p F(mu1/sigma) + (1-p)/2
    gaussian_accuracy                      exact accuracy of a linear rule on Gaussian classes
    reflection_construction                the A.7 example M = alpha (I - 2 v v^T)

Simulations (appendix B; Figures 2 and 3):
    simulate_domain                        one domain's samples for a shift M
    generate_shifts                        the authors' random PD / ND shift matrices
    simulate_figure2(setting)              'identity' (2a), 'extrapolation' (2b),
                                           'interpolation' (2c): one row per test shift with
                                           f_X's and f_dg's OOD accuracy and the theory's calls
    simulate_figure3(a=...)                ID vs OOD probit accuracies of many classifiers for
                                           M_OOD = a I (a > 0: on the line, a < 0: inverse
                                           line) or random M_OOD (a=None)

Labels are +-1 and classes are balanced unless said otherwise; classifiers are L2-regularised
logistic regressions fit here with scipy (the same objective as scikit-learn's default
``LogisticRegression(C=1)``), so no optional dependency is needed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

from analysis.aotl.stats import fit_line
from oodutils.accuracy import THEORY_CLIP, probit

MU_DG = np.array([1.0, 1.0])
MU_SPU = np.array([1.0, 1.0])

__all__ = [
    "thm1_margin", "thm1_well_specified", "thm2_sides", "thm2_well_specified",
    "lemma2_accuracy", "gaussian_accuracy", "reflection_construction", "LinearClassifier",
    "fit_logistic", "simulate_domain", "generate_shifts", "simulate_figure2",
    "simulate_figure3", "probit_fit",
]


def _vec(x: ArrayLike) -> np.ndarray:
    return np.atleast_1d(np.asarray(x, dtype=float))


def _mat(x: ArrayLike, dim: int) -> np.ndarray:
    m = np.asarray(x, dtype=float)
    if m.ndim == 0:
        m = m * np.eye(dim)
    if m.shape != (dim, dim):
        raise ValueError(f"expected a {dim}x{dim} matrix, got shape {m.shape}")
    return m


# ---------------------------------------------------------------------------------------------
# Theorems 1-2, Lemma 2, A.7
# ---------------------------------------------------------------------------------------------

def thm1_margin(w_spu: ArrayLike, M: ArrayLike, mu_spu: ArrayLike, delta: float = 0.05,
                lipschitz: float = 1.0, kappa: float = 1.0) -> float:
    """Theorem 1's left-hand side: w^T (M mu) + sqrt(2) L_phi kappa ||w|| sqrt(log(1/delta)).

    Negative means the split is well-specified with probability at least 1 - delta.
    """
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    w, mu = _vec(w_spu), _vec(mu_spu)
    M = _mat(M, len(mu))
    return float(w @ M @ mu + np.sqrt(2.0) * lipschitz * kappa * np.linalg.norm(w)
                 * np.sqrt(np.log(1.0 / delta)))


def thm1_well_specified(w_spu: ArrayLike, M: ArrayLike, mu_spu: ArrayLike, delta: float = 0.05,
                        lipschitz: float = 1.0, kappa: float = 1.0) -> bool:
    """Theorem 1's sufficient condition (a bool)."""
    return thm1_margin(w_spu, M, mu_spu, delta, lipschitz, kappa) < 0


def thm2_sides(w_dg: ArrayLike, mu_dg: ArrayLike, sigma_dg: ArrayLike, w_spu: ArrayLike,
               M: ArrayLike, mu_spu: ArrayLike, sigma_spu: ArrayLike | None = None,
               sigma_phi: ArrayLike | None = None) -> tuple[float, float]:
    """The two SNRs of Theorem 2 (Eq. 10): (f_X's OOD SNR, f_dg's SNR).

    lhs = (w_dg^T mu_dg + w_spu^T M mu_spu) / sqrt(w_dg^T S_dg w_dg + w_spu^T S_phi w_spu)
    rhs = w_dg^T mu_dg / sqrt(w_dg^T S_dg w_dg)
    S_phi is the OOD covariance of Z_spu; for a linear shift it is M S_spu M^T (pass sigma_spu).
    """
    w_dg, mu_dg, w_spu, mu_spu = map(_vec, (w_dg, mu_dg, w_spu, mu_spu))
    s_dg = _mat(sigma_dg, len(mu_dg))
    M = _mat(M, len(mu_spu))
    if sigma_phi is None:
        if sigma_spu is None:
            raise ValueError("pass sigma_phi, or sigma_spu for a linear shift")
        s_spu = _mat(sigma_spu, len(mu_spu))
        sigma_phi = M @ s_spu @ M.T
    s_phi = _mat(sigma_phi, len(mu_spu))
    dg_mean, dg_var = w_dg @ mu_dg, w_dg @ s_dg @ w_dg
    lhs = (dg_mean + w_spu @ M @ mu_spu) / np.sqrt(dg_var + w_spu @ s_phi @ w_spu)
    rhs = dg_mean / np.sqrt(dg_var)
    return float(lhs), float(rhs)


def thm2_well_specified(*args: Any, **kwargs: Any) -> bool:
    """Theorem 2: well-specified iff f_X's OOD SNR is below f_dg's (arguments as thm2_sides)."""
    lhs, rhs = thm2_sides(*args, **kwargs)
    return lhs < rhs


def lemma2_accuracy(r: ArrayLike, p: float = 0.5, cdf: Callable[[Any], Any] = stats.norm.cdf
                    ) -> float | np.ndarray:
    """Lemma 2: accuracy of 1{U > 0} when U|Y=0 ~ sigma W0 and U|Y=1 ~ mu1 + sigma W0.

    acc = p F_W0(r) + (1 - p) / 2 with r = mu1 / sigma; strictly increasing in r.
    """
    if not 0 < p < 1:
        raise ValueError("p must lie in (0, 1)")
    return p * cdf(np.asarray(r, dtype=float)) + (1 - p) / 2


def gaussian_accuracy(w: ArrayLike, mean: ArrayLike, cov: ArrayLike, bias: float = 0.0,
                      p: float = 0.5) -> float:
    """Exact accuracy of sign(w^T x + b) when x | y ~ N(y * mean, cov), y = +-1, P(y=1) = p."""
    w, mean = _vec(w), _vec(mean)
    cov = _mat(cov, len(mean))
    s = np.sqrt(w @ cov @ w)
    m = w @ mean
    if s == 0:
        return float(p * (m + bias > 0) + (1 - p) * (-m + bias < 0))
    return float(p * stats.norm.cdf((m + bias) / s) + (1 - p) * stats.norm.cdf((m - bias) / s))


def reflection_construction(w_spu: ArrayLike, mu_spu: ArrayLike, sigma_spu: ArrayLike,
                            delta: float = 0.05, eta: float = 0.01) -> dict[str, Any]:
    """Appendix A.7: M = alpha R with R = I - 2 v v^T, v = w / ||w||.

    alpha = max{1 + eta, sqrt(2 w^T S w log(1/delta)) / (w^T mu)} as printed. Returns a dict
    with M, R, alpha, the reversal left-hand side of Eq. 36
    (w^T M mu + sqrt(2 w^T M S M^T w log(1/delta))), whether it is negative, and the error
    terms eps1 = ||M mu - mu||, eps2 = |alpha^2 - 1| |w^T S w|.

    Note: Eq. 36 evaluated at M = alpha R equals alpha (-w^T mu + sqrt(2 w^T S w log(1/delta))),
    so for alpha > 0 it holds iff w^T mu > sqrt(2 w^T S w log(1/delta)), whatever alpha is; the
    printed choice of alpha is harmless but does not make the condition hold. ``reversal_holds``
    reports the truth.
    """
    w, mu = _vec(w_spu), _vec(mu_spu)
    S = _mat(sigma_spu, len(mu))
    wmu = float(w @ mu)
    if wmu <= 0:
        raise ValueError("the construction needs w_spu^T mu_spu > 0")
    v = w / np.linalg.norm(w)
    R = np.eye(len(w)) - 2.0 * np.outer(v, v)
    wsw = float(w @ S @ w)
    log_term = np.log(1.0 / delta)
    alpha = max(1.0 + eta, np.sqrt(2.0 * wsw * log_term) / wmu)
    M = alpha * R
    lhs = float(w @ M @ mu + np.sqrt(2.0 * (w @ M @ S @ M.T @ w) * log_term))
    return {
        "M": M, "R": R, "alpha": float(alpha),
        "shift": float(w @ M @ mu),                  # = -alpha w^T mu
        "ood_variance": float(w @ M @ S @ M.T @ w),  # = alpha^2 w^T S w
        "reversal_lhs": lhs,
        "reversal_holds": lhs < 0,
        "eps1": float(np.linalg.norm(M @ mu - mu)),
        "eps2": float(abs(alpha ** 2 - 1.0) * abs(wsw)),
    }


# ---------------------------------------------------------------------------------------------
# Logistic regression (scikit-learn's default objective, without the dependency)
# ---------------------------------------------------------------------------------------------

class LinearClassifier:
    """sign(x @ coef + intercept), labels +-1."""

    def __init__(self, coef: ArrayLike, intercept: float) -> None:
        self.coef = np.asarray(coef, dtype=float)
        self.intercept = float(intercept)

    def decision_function(self, X: ArrayLike) -> np.ndarray:
        return np.asarray(X, dtype=float) @ self.coef + self.intercept

    def predict(self, X: ArrayLike) -> np.ndarray:
        return np.where(self.decision_function(X) > 0, 1, -1)

    def accuracy(self, X: ArrayLike, y: ArrayLike) -> float:
        return float(np.mean(self.predict(X) == np.asarray(y)))


def fit_logistic(X: ArrayLike, y: ArrayLike, C: float = 1.0) -> LinearClassifier:
    """L2-regularised logistic regression: min 0.5 ||w||^2 + C sum log(1 + exp(-y (Xw + b)))."""
    X = np.asarray(X, dtype=float)
    y = np.where(np.asarray(y) > 0, 1.0, -1.0)
    n, d = X.shape

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:d], theta[d]
        z = y * (X @ w + b)
        value = 0.5 * w @ w + C * np.sum(np.logaddexp(0.0, -z))
        g = -C * y * special.expit(-z)
        return value, np.concatenate([w + X.T @ g, [g.sum()]])

    res = optimize.minimize(loss, np.zeros(d + 1), jac=True, method="L-BFGS-B",
                            options={"maxiter": 1000, "gtol": 1e-8})
    return LinearClassifier(res.x[:d], res.x[d])


# ---------------------------------------------------------------------------------------------
# Simulations (appendix B)
# ---------------------------------------------------------------------------------------------

def simulate_domain(M: Any, n: int, rng: np.random.Generator,
                    mu_dg: ArrayLike = MU_DG, mu_spu: ArrayLike = MU_SPU,
                    sigma_dg: ArrayLike | None = None, sigma_spu: ArrayLike | None = None,
                    label_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Samples of one domain: y = +-1 balanced, Z_dg ~ N(y mu_dg, S_dg), Z_spu = M Z_spu^ID with
    Z_spu^ID ~ N(y mu_spu, S_spu), i.e. Z_spu ~ N(y M mu_spu, M S_spu M^T).

    ``M`` may be a list of matrices: the domain is then an equal mixture of those shifts (the
    sub-Gaussian training domains of Figures 2b/2c); ``n`` samples per component.
    With ``label_noise`` > 0 the features follow the clean label as in the authors' code:
    Z_dg from y_true, Z_spu from the observed (flipped) label, which is returned.
    Returns (X, y) with X = [Z_dg, Z_spu].
    """
    if isinstance(M, (list, tuple)):
        parts = [simulate_domain(m, n, rng, mu_dg, mu_spu, sigma_dg, sigma_spu, label_noise)
                 for m in M]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    mu_dg, mu_spu = _vec(mu_dg), _vec(mu_spu)
    k, l = len(mu_dg), len(mu_spu)
    s_dg = np.eye(k) if sigma_dg is None else _mat(sigma_dg, k)
    s_spu = np.eye(l) if sigma_spu is None else _mat(sigma_spu, l)
    M = _mat(M, l)
    y_true = rng.choice([-1, 1], size=n)
    flip = rng.random(n) < label_noise
    y_obs = np.where(flip, -y_true, y_true)
    z_dg = y_true[:, None] * mu_dg + rng.multivariate_normal(np.zeros(k), s_dg, size=n)
    z_id = y_obs[:, None] * mu_spu + rng.multivariate_normal(np.zeros(l), s_spu, size=n)
    z_spu = z_id @ M.T
    return np.hstack([z_dg, z_spu]), y_obs


def generate_shifts(n: int, dim: int = 2, bound: float = 10.0, include_nd: bool = True,
                    rng: int | np.random.Generator | None = None) -> list[np.ndarray]:
    """The authors' random shifts: S = (A + A^T)/2 with A ~ randn, PD = S diag(|eig S| + 0.1) S^T
    rescaled to Frobenius norm U(0, 1) * bound, and ND = -PD. Returns n PD matrices, followed
    (include_nd) by their n negatives."""
    rng = np.random.default_rng(rng)
    pd_mats = []
    for _ in range(n):
        A = rng.standard_normal((dim, dim))
        S = (A + A.T) / 2
        P = S @ np.diag(np.abs(np.linalg.eigvalsh(S)) + 0.1) @ S.T
        P = P / np.linalg.norm(P) * rng.uniform(0, 1) * bound
        pd_mats.append(P)
    return pd_mats + ([-P for P in pd_mats] if include_nd else [])


def _block_diag(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0] + b.shape[0], a.shape[1] + b.shape[1]))
    out[:a.shape[0], :a.shape[1]] = a
    out[a.shape[0]:, a.shape[1]:] = b
    return out


def _mixture_moments(Ms: Sequence[np.ndarray], weights: Sequence[float] | np.ndarray,
                     mu_spu: np.ndarray, s_spu: np.ndarray) -> tuple[Any, Any, Any]:
    """Mean shift M_bar mu and the covariance of w^T Z_spu's class-conditional mixture."""
    M_bar = sum(w * M for w, M in zip(weights, Ms))
    mean = M_bar @ mu_spu
    second = sum(w * (M @ s_spu @ M.T + np.outer(M @ mu_spu, M @ mu_spu))
                 for w, M in zip(weights, Ms))
    return M_bar, mean, second - np.outer(mean, mean)


FIGURE2_SETTINGS = ("identity", "extrapolation", "interpolation")


def simulate_figure2(setting: str = "identity", n_test: int = 50, n: int = 1000,
                     seed: int = 1234, delta: float = 0.5, label_noise: float = 0.0,
                     bound: float = 10.0, n_train_components: int = 4) -> pd.DataFrame:
    """One row per test shift: f_X's and f_dg's OOD accuracy and what the theory says.

    setting:
      'identity'       (Fig. 2a) train at M = I; test shifts: generate_shifts (half PD, half ND)
      'extrapolation'  (Fig. 2b) train on a mixture of ``n_train_components`` PD shifts; test
                       shifts as in 2a, so mostly outside the training mixture
      'interpolation'  (Fig. 2c) train on a mixture of PD and ND shifts; each test domain is a
                       different (Dirichlet-weighted) mixture of the same components
    Columns: shift = w_spu^T M_bar mu_spu (the x-axis; w_spu = f_X's learned spurious weights,
    M_bar the test domain's mean shift), margin = sqrt(2 w^T Cov w log(1/delta)),
    thm1 (shift + margin < 0), thm2 (Theorem 2's SNR test with the learned weights),
    acc_x, acc_dg (empirical OOD accuracies), acc_x_theory, acc_dg_theory (the learned
    classifiers' exact accuracies on the test distribution), dg_wins (acc_dg > acc_x).

    ``delta`` defaults to 0.5: with unit-covariance spurious features the SNR of w^T Z_spu is at
    most ||mu_spu|| = sqrt(2), so Theorem 1's sub-Gaussian condition
    (shift + sqrt(2 var log(1/delta)) < 0) can only be met for delta > 1/e. The authors' code
    draws the margin sqrt(2 w^T Cov w), i.e. delta = 1/e, the boundary.
    """
    if setting not in FIGURE2_SETTINGS:
        raise ValueError(f"setting must be one of {FIGURE2_SETTINGS}, got {setting!r}")
    rng = np.random.default_rng(seed)
    mu_dg, mu_spu, s_dg, s_spu = MU_DG, MU_SPU, np.eye(2), np.eye(2)
    if setting == "identity":
        train_Ms = [np.eye(2)]
    elif setting == "extrapolation":
        train_Ms = generate_shifts(n_train_components, bound=bound, include_nd=False, rng=rng)
    else:
        half = max(1, n_train_components // 2)
        train_Ms = generate_shifts(half, bound=bound, include_nd=True, rng=rng)
    per_component = n if setting == "identity" else max(1, n // 2)
    X, y = simulate_domain(train_Ms, per_component, rng, label_noise=label_noise)
    f_x = fit_logistic(X, y)
    f_dg = fit_logistic(X[:, :2], y)
    w_dg, w_spu = f_x.coef[:2], f_x.coef[2:]

    tests = []  # (list of Ms, weights)
    if setting == "interpolation":
        for _ in range(n_test):
            tests.append((train_Ms, rng.dirichlet(np.ones(len(train_Ms)))))
    else:
        half = n_test // 2
        shifts = generate_shifts(half, bound=bound, include_nd=True, rng=rng)
        shifts += generate_shifts(n_test - 2 * half, bound=bound, include_nd=False, rng=rng)
        tests = [([M], np.ones(1)) for M in shifts]

    rows = []
    for Ms, weights in tests:
        counts = rng.multinomial(n, weights)
        parts = [simulate_domain(M, int(c), rng, label_noise=label_noise)
                 for M, c in zip(Ms, counts) if c > 0]
        Xt = np.concatenate([p[0] for p in parts])
        yt = np.concatenate([p[1] for p in parts])
        M_bar, mean, cov = _mixture_moments(Ms, weights, mu_spu, s_spu)
        shift = float(w_spu @ mean)
        margin = float(np.sqrt(2.0 * (w_spu @ cov @ w_spu) * np.log(1.0 / delta)))
        lhs, rhs = thm2_sides(w_dg, mu_dg, s_dg, w_spu, M_bar, mu_spu, sigma_phi=cov)
        acc_x, acc_dg = f_x.accuracy(Xt, yt), f_dg.accuracy(Xt[:, :2], yt)
        # exact accuracies: the test domain is a mixture of Gaussians (one component unless
        # interpolating); label noise is ignored by the exact formula
        acc_x_theory = sum(
            w * gaussian_accuracy(f_x.coef, np.concatenate([mu_dg, M @ mu_spu]),
                                  _block_diag(s_dg, M @ s_spu @ M.T), f_x.intercept)
            for M, w in zip(Ms, weights))
        acc_dg_theory = gaussian_accuracy(f_dg.coef, mu_dg, s_dg, f_dg.intercept)
        rows.append({"shift": shift, "margin": margin, "thm1": shift + margin < 0,
                     "thm2": lhs < rhs, "snr_x": lhs, "snr_dg": rhs,
                     "acc_x": acc_x, "acc_dg": acc_dg, "acc_x_theory": float(acc_x_theory),
                     "acc_dg_theory": acc_dg_theory, "dg_wins": acc_dg > acc_x,
                     "M": M_bar.ravel().tolist()})
    df = pd.DataFrame(rows)
    df.attrs.update(setting=setting, w_dg=w_dg.tolist(), w_spu=w_spu.tolist(),
                    train_shifts=[M.ravel().tolist() for M in train_Ms])
    return df


def probit_fit(acc_id: ArrayLike, acc_ood: ArrayLike, clip: float = THEORY_CLIP
               ) -> dict[str, float]:
    """linregress(probit(acc_id), probit(acc_ood)) via analysis.aotl.stats.fit_line: a dict
    with slope, intercept, R, p, stderr (and fit_line's other keys). The default clip is
    tiny: the authors' Fig. 3 notebook fits unclipped probits; clipping only keeps
    accuracies of exactly 0 or 1 finite."""
    fit = fit_line(acc_id, acc_ood, scale="probit", clip=clip, where="probit fit")
    return {**fit, "R": fit["r"]}


def simulate_figure3(a: float | None = -1.0, n_classifiers: int = 50, n: int = 1000,
                     seed: int = 1234, label_noise: float = 0.0
                     ) -> tuple[pd.DataFrame, dict[str, float]]:
    """ID vs OOD accuracies of ``n_classifiers`` logistic regressions, each trained on a domain
    with a random shift M_train ~ randn(2, 2) (so they lean on the spurious features to
    different degrees), evaluated ID (M = I) and OOD (M = a I; ``a=None``: a fresh random M per
    classifier, the left panel). Returns (DataFrame acc_id, acc_ood, probit_id, probit_ood;
    probit_fit dict). Theory: a > 0 gives accuracy on the line (R > 0), a < 0 the inverse line
    (R < 0)."""
    rng = np.random.default_rng(seed)
    X_id, y_id = simulate_domain(np.eye(2), n, rng, label_noise=label_noise)
    fixed_ood = None
    if a is not None:
        fixed_ood = simulate_domain(a * np.eye(2), n, rng, label_noise=label_noise)
    rows = []
    for _ in range(n_classifiers):
        M_train = rng.standard_normal((2, 2))
        X, y = simulate_domain(M_train, n, rng, label_noise=label_noise)
        f = fit_logistic(X, y)
        if fixed_ood is None:
            X_ood, y_ood = simulate_domain(rng.standard_normal((2, 2)), n, rng,
                                           label_noise=label_noise)
        else:
            X_ood, y_ood = fixed_ood
        rows.append({"acc_id": f.accuracy(X_id, y_id), "acc_ood": f.accuracy(X_ood, y_ood),
                     "w_spu_mu": float(f.coef[2:] @ MU_SPU)})
    df = pd.DataFrame(rows)
    df["probit_id"] = probit(df["acc_id"], THEORY_CLIP)
    df["probit_ood"] = probit(df["acc_ood"], THEORY_CLIP)
    fit = probit_fit(df["acc_id"], df["acc_ood"])
    df.attrs.update(a=a, **fit)
    return df, fit
