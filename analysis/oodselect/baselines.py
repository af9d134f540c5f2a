"""Baselines for OODSelect: random subsets, hardest examples, greedy selection, and the
exact optimum by exhaustive enumeration (tiny problems only).

Every function takes the correctness matrix of the models it may look at and returns
example indices (best first) or, for random subsets, many draws at once.
"""
from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from analysis.oodselect.selector import PROBIT_EPS, _torch_threads, pearson, probit
from oodutils.errors import UserError


def masks_correlation(A: ArrayLike, y: ArrayLike, masks: ArrayLike, eps: float = PROBIT_EPS,
                      chunk: int = 256) -> np.ndarray:
    """Pearson r (the authors' formula) of probit(y) against probit(accuracy on each
    subset), for many subsets at once. masks: (D, N) 0/1. Returns (D,) numpy."""
    A_t = torch.as_tensor(np.asarray(A), dtype=torch.float32)
    u = probit(torch.as_tensor(np.asarray(y), dtype=torch.float32), eps)
    mask_array = np.asarray(masks)
    out = []
    for i in range(0, len(mask_array), chunk):
        m = torch.as_tensor(mask_array[i:i + chunk], dtype=torch.float32)
        acc = (m @ A_t.T) / m.sum(1, keepdim=True).clamp(min=1)
        out.append(pearson(probit(acc, eps), u).double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def random_subsets(n_examples: int, n: int, draws: int = 100, seed: int = 0) -> np.ndarray:
    """`draws` uniform random subsets of size n, as a (draws, N) uint8 mask."""
    if not 1 <= n <= n_examples:
        raise UserError(f"subset size {n} outside 1..{n_examples}")
    rng = np.random.default_rng(seed)
    masks = np.zeros((draws, n_examples), dtype=np.uint8)
    for d in range(draws):
        masks[d, rng.choice(n_examples, n, replace=False)] = 1
    return masks


def random_baseline(A_eval: ArrayLike, y_eval: ArrayLike, n: int, draws: int = 100, seed: int = 0,
                    eps: float = PROBIT_EPS) -> dict[str, Any]:
    """Correlations of `draws` random subsets of size n on the given models:
    dict with mean, sd, q025, q975 and the per-draw values."""
    masks = random_subsets(np.shape(A_eval)[1], n, draws, seed)
    r = masks_correlation(A_eval, y_eval, masks, eps)
    return {"mean": float(r.mean()), "sd": float(r.std(ddof=1)) if len(r) > 1 else 0.0,
            "q025": float(np.quantile(r, 0.025)), "q975": float(np.quantile(r, 0.975)),
            "values": r, "masks": masks}


def hardest(A_ref: ArrayLike, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The examples the reference models get wrong most often (score 1 - mean accuracy),
    best first; ties go to the lower index. Returns (order[:n], scores)."""
    scores = 1.0 - np.asarray(A_ref, dtype=np.float64).mean(axis=0)
    order = np.lexsort((np.arange(scores.size), -scores))
    return (order if n is None else order[:int(n)]), scores


def greedy_cost(n_models: int, n_examples: int, n: int) -> float:
    """Number of cell updates a forward greedy run to size n performs."""
    return float(n_models) * n_examples * n


def greedy(A: ArrayLike, y: ArrayLike, n: int, eps: float = PROBIT_EPS,
           device: str | torch.device | None = None, chunk: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Forward greedy: start empty, add the example that most lowers r on the given
    models, up to size n. The objective is not submodular (Proposition 1), so this
    carries no guarantee. Returns the order of addition (its first k = the greedy subset
    of size k) and the r after each addition."""
    with _torch_threads(np.shape(A)[0] * np.shape(A)[1]):
        return _greedy(A, y, n, eps, device, chunk)


def _greedy(A: ArrayLike, y: ArrayLike, n: int, eps: float, device: str | torch.device | None,
            chunk: int | None) -> tuple[np.ndarray, np.ndarray]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    A_t = torch.as_tensor(np.asarray(A), dtype=torch.uint8, device=dev)
    M, N = A_t.shape
    if not 1 <= n <= N:
        raise UserError(f"subset size {n} outside 1..{N}")
    u = probit(torch.as_tensor(np.asarray(y), dtype=torch.float32, device=dev), eps)
    uc = u - u.mean()
    u_var = (uc * uc).mean() + 1e-6
    counts = torch.zeros(M, dtype=torch.long, device=dev)
    chosen = torch.zeros(N, dtype=torch.bool, device=dev)
    chunk = chunk or max(1, int(2e7 // max(M, 1)))
    order: list[int] = []
    trace: list[float] = []
    for k in range(1, int(n) + 1):
        table = probit(torch.arange(k + 1, device=dev, dtype=torch.float32) / k, eps)
        best_r, best_j = math.inf, -1
        for lo in range(0, N, chunk):
            cols = A_t[:, lo:lo + chunk].long()
            v = table[counts[:, None] + cols]                      # (M, chunk)
            vc = v - v.mean(0, keepdim=True)
            r = (vc * uc[:, None]).mean(0) / torch.sqrt(((vc * vc).mean(0) + 1e-6) * u_var)
            r = torch.where(chosen[lo:lo + chunk], torch.full_like(r, math.inf), r)
            j = int(torch.argmin(r))
            if float(r[j]) < best_r:
                best_r, best_j = float(r[j]), lo + j
        order.append(best_j)
        trace.append(best_r)
        chosen[best_j] = True
        counts += A_t[:, best_j].long()
    return np.asarray(order), np.asarray(trace)


def exhaustive(A: ArrayLike, y: ArrayLike, n: int, eps: float = PROBIT_EPS,
               max_subsets: int = 5_000_000, chunk: int = 65536
               ) -> tuple[np.ndarray, float]:
    """The exact minimiser of r over all subsets of size n, by enumeration.
    Returns (best subset indices sorted, its r). Refuses when C(N, n) > max_subsets."""
    A_np = np.asarray(A)
    N = A_np.shape[1]
    if not 1 <= n <= N:
        raise UserError(f"subset size {n} outside 1..{N}")
    total = math.comb(N, n)
    if total > max_subsets:
        raise UserError(f"exhaustive search over C({N}, {n}) = {total:,} subsets exceeds "
                        f"the limit of {max_subsets:,}; use it on tiny problems only")
    A_t = torch.as_tensor(A_np, dtype=torch.float32)
    u = probit(torch.as_tensor(np.asarray(y), dtype=torch.float32), eps)
    combos = itertools.combinations(range(N), n)
    best_r: float = math.inf
    best: np.ndarray | None = None
    while True:
        block = np.fromiter(itertools.chain.from_iterable(itertools.islice(combos, chunk)),
                            dtype=np.int64)
        if block.size == 0:
            break
        idx = torch.as_tensor(block.reshape(-1, n))
        acc = A_t[:, idx].sum(-1) / n                                # (M, chunk)
        r = pearson(probit(acc.T, eps), u)
        j = int(torch.argmin(r))
        if float(r[j]) < best_r:
            best_r, best = float(r[j]), idx[j].numpy().copy()
    assert best is not None   # 1 <= n <= N: there was at least one subset
    return best, best_r
