"""OODSelect (Salaudeen et al. 2025, "Aggregation Hides Out-of-Distribution Generalization
Failures from Spurious Correlations"): find OOD subsets on which ID and OOD accuracy are
anti-correlated.

Given a correctness matrix ``A`` (models x OOD examples, 1 = correct) and the models'
held-out ID accuracies ``y``, OODSelect looks for a subset ``S`` of ``n`` examples that
minimises the Pearson correlation, across models, between probit(ID accuracy) and
probit(accuracy on S). The selection is relaxed to ``s = sigmoid(theta)`` and optimised
with Adam, as the authors' code does it (the default; notes_001 section 2.1):

    acc   = A_train @ s / (sum(s) + 1e-6)
    r     = pearson(probit_eps(acc), probit_eps(y_train))      # centred, +1e-6 variances
    loss  = r + lam_t * softplus(n - sum(s))                    # one-sided size penalty
    lam_t = lam_max * (1 - cos(pi * min(t / K_anneal, 1))) / 2  # cosine warm-up
    lr_t  = CosineAnnealingLR(lr, T_max, eta_min)               # stepped once per step

The paper's squared penalty ``lam_t * (sum(s) - n)^2`` is ``penalty_form="squared"``.
Each step the hard top-n subset is scored on the validation models; training stops
after ``patience`` steps without improvement, and the subset is the top-n of theta.
Rows of ``theta`` are independent problems (subset sizes, restarts, Optuna trials), so
several of them run in one batch: one pass over ``A`` serves them all.

    sel = OODSelect(seed=0).fit(A_tr, y_tr, n=[100, 500], A_val=A_va, y_val=y_va)
    sel.subsets_[0]            # example indices of the n=100 subset, in rank order
    subset_correlation(A_te, y_te, sel.subsets_[0])

The command line lives in ``analysis.oodselect.cli`` (``python -m analysis.oodselect``);
data loading and model splits in ``analysis.oodselect.data``; baselines in
``analysis.oodselect.baselines``; intervals, overlaps, composition, files and plots in
``analysis.oodselect.report``.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike
from scipy.stats import rankdata
from tqdm import tqdm

from analysis.oodselect.config import (
    LOSSES,
    PENALTY_FORMS,
    SEARCH_SPACE,
    Hparams,
)
from oodutils.accuracy import OODSELECT_CLIP
from oodutils.accuracy import probit as _probit
from oodutils.errors import UserError, require
from oodutils.log import get_logger

logger = get_logger(__name__)

PROBIT_EPS = OODSELECT_CLIP   # [code] clamp(x, eps, 1 - eps) before the probit
VAR_EPS = 1e-6          # [code] added to both variances in the Pearson denominator
# The optimiser's configuration lives in a module without torch (commands answer --help
# before importing torch); these names stay importable from here.


def probit(x: Any, eps: float = PROBIT_EPS) -> Any:
    """Phi^-1(clip(x, eps, 1 - eps)) for a torch tensor or anything array-like: the shared
    :func:`oodutils.accuracy.probit` at OODSelect's clip."""
    return _probit(x, eps)


def pearson(u: Any, v: Any, var_eps: float = VAR_EPS) -> Any:
    """Pearson r over the last axis with population moments, as the authors' code:
    mean(u~ v~) / sqrt((mean(u~^2) + eps) (mean(v~^2) + eps)). Broadcasts: u (K, M) and
    v (M,) give (K,). A constant u gives r = 0 (that is what the +eps is for)."""
    lib = torch if torch.is_tensor(u) else np
    uc = u - u.mean(-1, keepdims=True) if lib is np else u - u.mean(-1, keepdim=True)
    vc = v - v.mean(-1, keepdims=True) if lib is np else v - v.mean(-1, keepdim=True)
    num = (uc * vc).mean(-1)
    return num / lib.sqrt(((uc * uc).mean(-1) + var_eps) * ((vc * vc).mean(-1) + var_eps))


def subset_accuracy(A: ArrayLike, subset: ArrayLike) -> np.ndarray:
    """Per-model accuracy on the examples `subset` (indices, or a boolean mask)."""
    A = np.asarray(A)
    sub = np.asarray(subset)
    if sub.dtype == bool:
        sub = np.flatnonzero(sub)
    if sub.size == 0:
        raise UserError("an empty subset has no accuracy")
    return A[:, sub].mean(axis=1, dtype=np.float64)


def subset_correlation(A: ArrayLike, y: ArrayLike, subset: ArrayLike, eps: float = PROBIT_EPS,
                       method: str = "pearson") -> float:
    """Correlation across models of probit(y) and probit(accuracy on `subset`).
    method: "pearson" (the authors' formula) or "spearman". Undefined (NaN, never 0.0)
    when either side is constant across the models: there is nothing to correlate."""
    acc = subset_accuracy(A, subset)
    y = np.asarray(y, dtype=np.float64)
    if len(acc) < 2 or np.ptp(acc) == 0 or np.ptp(y) == 0:
        return float("nan")
    if method == "spearman":
        return float(pearson(rankdata(acc), rankdata(y), var_eps=0.0))
    return float(pearson(probit(acc, eps), probit(y, eps)))


def _device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _as_tensor(x: Any, device: torch.device, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    if torch.is_tensor(x):
        return x.to(device=device, dtype=dtype)
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


def topn_masks(theta: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Dense 0/1 masks (K, N) of the top-n entries of each row of theta (n per row)."""
    K, N = theta.shape
    mask = torch.zeros_like(theta)
    if bool((sizes == sizes[0]).all()):
        idx = torch.topk(theta, int(sizes[0]), dim=1, sorted=False).indices
        return mask.scatter_(1, idx, 1.0)
    for k in range(K):
        idx = torch.topk(theta[k], int(sizes[k]), sorted=False).indices
        mask[k, idx] = 1.0
    return mask


class _torch_threads:
    """Run tiny problems single-threaded: their ops are too small to split, and on a
    busy machine idle OpenMP workers spinning for a second core cost more than they save."""

    def __init__(self, work: int) -> None:
        self.one = work < 4_000_000 and torch.get_num_threads() > 1

    def __enter__(self) -> None:
        if self.one:
            self.saved = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.one:
            torch.set_num_threads(self.saved)


@dataclass
class BatchResult:
    """The outcome of one batched optimisation: one row per problem."""
    theta: np.ndarray            # (K, N) the returned logits
    val_r: np.ndarray            # (K,) hard top-n correlation on the validation models
    best_step: np.ndarray        # (K,) step at which val_r was reached
    n_steps: np.ndarray          # (K,) steps run before (early) stopping
    history: list = field(default_factory=list)  # (step, train r (K,), val r (K,))


def optimize_batch(A_train: Any, y_train: Any, sizes: ArrayLike, hparams: Hparams | list[Hparams],
                   A_val: Any = None, y_val: Any = None, **kw: Any) -> BatchResult:
    """Optimise K independent selections at once.

    A_train (M, N) and y_train (M,): the models the loss sees. sizes: K subset sizes.
    hparams: K Hparams (or one, shared). A_val/y_val: validation models for early
    stopping (none: the training models stand in, and early stopping still applies).
    restore_best: return each row's theta at its best validation step (the authors'
    code returns the last theta; ``restore_best=False`` does that).
    Returns a BatchResult with numpy arrays.
    """
    shape = np.shape(A_train)
    work = shape[0] * shape[1] * len(np.atleast_1d(sizes))
    with _torch_threads(work):
        return _optimize_batch(A_train, y_train, sizes, hparams, A_val, y_val, **kw)


def _optimize_batch(A_train: Any, y_train: Any, sizes: ArrayLike,
                    hparams: Hparams | list[Hparams], A_val: Any, y_val: Any, *,
                    steps: int = 3000, patience: int = 500, penalty_form: str = "softplus",
                    loss: str = "r", eps: float = PROBIT_EPS, restore_best: bool = True,
                    eval_every: int = 1, seed: int = 0, device: str | torch.device | None = None,
                    history_every: int = 0) -> BatchResult:
    if penalty_form not in PENALTY_FORMS:
        raise UserError(f"penalty_form must be one of {PENALTY_FORMS}, not {penalty_form!r}")
    if loss not in LOSSES:
        raise UserError(f"loss must be one of {LOSSES}, not {loss!r}")
    dev = _device(device)
    A_tr = _as_tensor(A_train, dev)
    M, N = A_tr.shape
    sizes_t = torch.as_tensor(np.atleast_1d(np.asarray(sizes)), dtype=torch.long)
    K = int(sizes_t.numel())
    if int(sizes_t.min()) < 1 or int(sizes_t.max()) > N:
        raise UserError(f"subset sizes must lie in 1..{N} (the number of OOD examples); "
                        f"got {sizes_t.tolist()}")
    if isinstance(hparams, Hparams):
        hparams = [hparams] * K
    if len(hparams) != K:
        raise ValueError("one Hparams per size")
    col = lambda name: torch.tensor([float(getattr(h, name)) for h in hparams],  # noqa
                                    dtype=torch.float32, device=dev)
    lr0, eta_min, t_max = col("lr"), col("eta_min"), col("t_max")
    lam_max, anneal = col("penalty"), col("anneal_iters").clamp(min=1)
    n_f = sizes_t.to(dev, torch.float32)
    u_tr = probit(_as_tensor(y_train, dev), eps)
    if A_val is None:
        A_va, u_va = A_tr, u_tr
    else:
        A_va = _as_tensor(A_val, dev)
        u_va = probit(_as_tensor(y_val, dev), eps)
        if A_va.shape[1] != N:
            raise UserError("validation and training models must score the same examples")

    gen = torch.Generator().manual_seed(int(seed))
    theta = torch.randn(K, N, generator=gen).to(dev)     # [code] theta ~ N(0, I)
    m1, m2 = torch.zeros_like(theta), torch.zeros_like(theta)
    b1, b2, adam_eps = 0.9, 0.999, 1e-8
    best_theta = theta.clone()
    best_r = torch.full((K,), float("inf"), device=dev)
    best_step = torch.zeros(K, dtype=torch.long, device=dev)
    active = torch.ones(K, dtype=torch.bool, device=dev)
    n_steps = torch.zeros(K, dtype=torch.long, device=dev)
    sizes_dev = sizes_t.to(dev)
    history = []

    # Validation: the hard top-n subset's correct counts per validation model. The
    # subset changes by a few examples per step, so the counts are updated through the
    # changed columns only (rows of A_val^T), with a full recount when many changed.
    A_vaT = A_va.T.contiguous()
    state: dict[str, Any] = {"mask": None, "counts": None}

    def evaluate(th: torch.Tensor) -> torch.Tensor:
        mask = topn_masks(th.detach(), sizes_dev)
        old = state["mask"]
        if old is None:
            counts = mask @ A_vaT
        else:
            changed = (mask != old).any(0).nonzero().squeeze(1)
            if changed.numel() > N // 8:
                counts = mask @ A_vaT
            else:
                delta = mask[:, changed] - old[:, changed]
                counts = state["counts"] + delta @ A_vaT[changed]
        state["mask"], state["counts"] = mask, counts
        return pearson(probit(counts / n_f[:, None], eps), u_va)

    for t in range(int(steps)):
        theta.requires_grad_(True)
        s = torch.sigmoid(theta)
        total = s.sum(1)
        acc = (s @ A_tr.T) / (total[:, None] + 1e-6)
        r = pearson(probit(acc, eps), u_tr)
        frac = torch.clamp(t / anneal, max=1.0)
        lam = lam_max * 0.5 * (1 - torch.cos(math.pi * frac))
        if penalty_form == "softplus":
            pen = torch.nn.functional.softplus(n_f - total)
        else:
            pen = (total - n_f) ** 2
        obj = (r if loss == "r" else r * r) + lam * pen
        (grad,) = torch.autograd.grad(obj.sum(), theta)
        theta = theta.detach()
        with torch.no_grad():
            lr = eta_min + (lr0 - eta_min) * 0.5 * (1 + torch.cos(math.pi * t / t_max))
            m1.mul_(b1).add_(grad, alpha=1 - b1)
            m2.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            step_size = (lr / (1 - b1 ** (t + 1)))[:, None]
            denom = (m2 / (1 - b2 ** (t + 1))).sqrt_().add_(adam_eps)
            update = step_size * m1 / denom
            theta = torch.where(active[:, None], theta - update, theta)
            n_steps += active.long()
            if t % eval_every == 0 or t == steps - 1:
                r_val = evaluate(theta)
                better = active & (r_val < best_r)
                best_r = torch.where(better, r_val, best_r)
                best_step = torch.where(better, torch.full_like(best_step, t), best_step)
                best_theta[better] = theta[better]
                active &= (t - best_step) < patience
                if history_every and t % history_every == 0:
                    history.append((t, r.detach().cpu().numpy(), r_val.cpu().numpy()))
            if not bool(active.any()):
                break
    out_theta = best_theta if restore_best else theta
    val_r = best_r if restore_best else evaluate(theta)
    return BatchResult(theta=out_theta.cpu().numpy(), val_r=val_r.cpu().numpy(),
                       best_step=best_step.cpu().numpy(), n_steps=n_steps.cpu().numpy(),
                       history=history)


def top_subset(scores: ArrayLike, n: int) -> np.ndarray:
    """Indices of the n largest scores, best first (ties broken by index)."""
    scores = np.asarray(scores)
    order = np.lexsort((np.arange(scores.size), -scores))
    return order[:int(n)]


def sample_hparams(trial: Any) -> Hparams:
    """An Optuna trial's draw from the paper's search space."""
    out: dict[str, Any] = {}
    for name, (kind, lo, hi) in SEARCH_SPACE.items():
        if kind == "log":
            out[name] = trial.suggest_float(name, lo, hi, log=True)
        elif kind == "int":
            out[name] = trial.suggest_int(name, lo, hi)
        else:
            out[name] = trial.suggest_float(name, lo, hi)
    return Hparams(**out)


class OODSelect:
    """The selector, scikit-learn style: configure, ``fit``, read the attributes.

    trials: 0 runs the fixed ``hparams``; T > 0 runs an Optuna TPE search of T trials
    per subset size over the paper's space (the fixed hparams are enqueued as the first
    trial), scored by the validation correlation. trial_batch trials run at once.
    steps: optimisation steps per trial (3000; the paper's configs use 50,000).
    restarts: with fixed hparams, R random initialisations per size run side by side and
    the best on validation is kept (the relaxation is non-convex; 1 = the code's run).

    After ``fit``: ``sizes_``, ``subsets_`` (index arrays in rank order, one per size),
    ``scores_`` (sigmoid(theta), one array per size), ``val_r_``, ``hparams_`` (the
    chosen Hparams per size), ``best_step_``, ``n_steps_``, ``trials_`` (a list of
    dicts, one per trial run). As DataFrames: :meth:`results_frame` (one row per size)
    and :meth:`trials_frame` (one row per trial).
    """

    def __init__(self, hparams: Hparams | dict[str, Any] | None = None, trials: int = 0,
                 steps: int = 3000, patience: int = 500, penalty_form: str = "softplus",
                 loss: str = "r", eps: float = PROBIT_EPS, restore_best: bool = True,
                 eval_every: int = 1, trial_batch: int = 8, restarts: int = 1, seed: int = 0,
                 device: str | torch.device | None = None, verbose: bool = False) -> None:
        self.hparams: Hparams = Hparams(**hparams) if isinstance(hparams, dict) else \
            hparams if hparams is not None else Hparams()
        self.trials, self.steps, self.patience = int(trials), int(steps), int(patience)
        self.penalty_form, self.loss, self.eps = penalty_form, loss, eps
        self.restore_best, self.eval_every = restore_best, int(eval_every)
        self.trial_batch, self.seed, self.device = max(1, int(trial_batch)), seed, device
        self.restarts = max(1, int(restarts))
        self.verbose = verbose

    def _run(self, A_train: Any, y_train: Any, sizes: ArrayLike, hps: Hparams | list[Hparams],
             A_val: Any, y_val: Any, seed: int) -> BatchResult:
        return optimize_batch(A_train, y_train, sizes, hps, A_val, y_val, steps=self.steps,
                              patience=self.patience, penalty_form=self.penalty_form,
                              loss=self.loss, eps=self.eps, restore_best=self.restore_best,
                              eval_every=self.eval_every, seed=seed, device=self.device)

    def fit(self, A_train: ArrayLike, y_train: ArrayLike, n: int | ArrayLike,
            A_val: ArrayLike | None = None, y_val: ArrayLike | None = None) -> OODSelect:
        sizes = [int(v) for v in np.atleast_1d(n)]
        A_train = np.asarray(A_train)
        dev = _device(self.device)
        # Move the matrices once; every batch below reuses them.
        A_tr = _as_tensor(A_train, dev)
        A_va = None if A_val is None else _as_tensor(A_val, dev)
        self.trials_: list[dict[str, Any]] = []
        if self.trials <= 0:
            R = self.restarts
            res = self._run(A_tr, y_train, np.repeat(sizes, R), self.hparams, A_va, y_val,
                            self.seed)
            # rows are (size, restart); keep each size's best restart on validation
            pick = [k * R + int(np.argmin(res.val_r[k * R:(k + 1) * R]))
                    for k in range(len(sizes))]
            thetas, val_r = [res.theta[j] for j in pick], [res.val_r[j] for j in pick]
            best_step = [res.best_step[j] for j in pick]
            n_steps = [res.n_steps[j] for j in pick]
            chosen = [self.hparams] * len(sizes)
        else:
            thetas, val_r, best_step, n_steps, chosen = self._tune(
                A_tr, y_train, sizes, A_va, y_val)
        self.sizes_ = sizes
        self.theta_ = thetas
        self.scores_ = [1.0 / (1.0 + np.exp(-np.asarray(th, dtype=np.float64)))
                        for th in thetas]
        self.subsets_ = [top_subset(th, k) for th, k in zip(thetas, sizes)]
        self.val_r_ = np.asarray(val_r, dtype=np.float64)
        self.best_step_ = np.asarray(best_step)
        self.n_steps_ = np.asarray(n_steps)
        self.hparams_ = chosen
        return self

    def results_frame(self) -> pd.DataFrame:
        """After ``fit``: one row per subset size n: val_r, best_step, n_steps, the chosen
        hyperparameters, and the selected example indices (rank order)."""
        rows = [{"n": n, "val_r": float(r), "best_step": int(b), "n_steps": int(s),
                 **hp.as_dict(), "subset": np.asarray(sub).tolist()}
                for n, r, b, s, hp, sub in zip(self.sizes_, self.val_r_, self.best_step_,
                                               self.n_steps_, self.hparams_, self.subsets_)]
        return pd.DataFrame(rows)

    def trials_frame(self) -> pd.DataFrame:
        """After ``fit``: ``trials_`` as a DataFrame (one row per Optuna trial; empty
        with fixed hyperparameters)."""
        return pd.DataFrame(self.trials_)

    def _tune(self, A_tr: torch.Tensor, y_train: ArrayLike, sizes: list[int],
              A_va: torch.Tensor | None, y_val: ArrayLike | None
              ) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Hparams]]:
        optuna = require("optuna", extra="analysis")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        studies = []
        for i, _size in enumerate(sizes):
            sampler = optuna.samplers.TPESampler(seed=int(self.seed) + 7919 * i)
            study = optuna.create_study(direction="minimize", sampler=sampler)
            study.enqueue_trial(self.hparams.as_dict())
            studies.append(study)
        best: list[Any] = [None] * len(sizes)
        done, batch_no = 0, 0
        bar = tqdm(total=self.trials, desc="OODSelect trials", unit="trial",
                   disable=not sys.stderr.isatty())
        while done < self.trials:
            b = min(self.trial_batch, self.trials - done)
            asked, batch_sizes, hps = [], [], []
            for i, study in enumerate(studies):
                for _ in range(b):
                    trial = study.ask()
                    asked.append((i, study, trial))
                    batch_sizes.append(sizes[i])
                    hps.append(sample_hparams(trial))
            res = self._run(A_tr, y_train, batch_sizes, hps, A_va, y_val,
                            seed=int(self.seed) + 104729 * batch_no)
            for j, (i, study, trial) in enumerate(asked):
                value = float(res.val_r[j])
                value = value if np.isfinite(value) else 1.0
                study.tell(trial, value)
                self.trials_.append({"n": sizes[i], "trial": trial.number, "val_r": value,
                                     "best_step": int(res.best_step[j]),
                                     "n_steps": int(res.n_steps[j]), **hps[j].as_dict()})
                if best[i] is None or value < best[i][0]:
                    best[i] = (value, res.theta[j], int(res.best_step[j]),
                               int(res.n_steps[j]), hps[j])
            done += b
            bar.update(b)
            batch_no += 1
            if self.verbose:
                logger.info(f"[oodselect] {done}/{self.trials} trials per size; best val r: "
                            + ", ".join(f"n={s}: {b_[0]:.3f}" for s, b_ in zip(sizes, best)))
        bar.close()
        return ([b_[1] for b_ in best], [b_[0] for b_ in best], [b_[2] for b_ in best],
                [b_[3] for b_ in best], [b_[4] for b_ in best])
