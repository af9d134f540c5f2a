"""Accuracies: the one probit transform (with its clipping named) and the one check that
accuracies are finite fractions in [0, 1].

The probit scale is where accuracy on the line is linear (Miller et al. 2021). Accuracies
of exactly 0 or 1 have infinite probits, so every caller clips to [clip, 1 - clip] first;
how much differs by use, and each use has its constant:

- :data:`AOTL_CLIP` (0.01): accuracy-on-the-line fits and plots, as Miller et al.;
- :data:`OODSELECT_CLIP` (1e-6): OODSelect's correlations, as the authors' code
  (``clamp(x, eps, 1 - eps)``);
- :data:`THEORY_CLIP` (1e-6): the theory simulations, whose reference notebook fits
  unclipped probits (the clip only keeps accuracies of 0 or 1 finite).
"""
from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from oodutils.errors import UserError

AOTL_CLIP = 0.01
OODSELECT_CLIP = 1e-6
THEORY_CLIP = 1e-6


def check_clip(clip: float) -> float:
    """``clip`` when it lies in [0, 0.5), else a UserError."""
    if not (0 <= clip < 0.5):
        raise UserError(f"--clip must lie in [0, 0.5), got {clip}")
    return clip


def _torch_if_tensor(x: object) -> Any:
    """The torch module when ``x`` is a tensor, else None (a tensor can only exist once
    torch is imported, so this never imports it)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.is_tensor(x) else None


def probit(acc: Any, clip: float = AOTL_CLIP) -> Any:
    """Phi^-1 of the accuracies clipped to [clip, 1 - clip] (``clip=0``: no clipping, so
    0 and 1 give -inf and inf). A torch tensor stays a tensor on its device and dtype
    (sqrt(2) erfinv(2a - 1), differentiable); anything else becomes a float64 numpy
    array."""
    check_clip(clip)
    torch = _torch_if_tensor(acc)
    if torch is not None:
        if clip > 0:
            acc = acc.clamp(clip, 1 - clip)
        return math.sqrt(2.0) * torch.erfinv(2 * acc - 1)
    from scipy.special import ndtri
    a = np.asarray(acc, dtype=np.float64)
    if clip > 0:
        a = np.clip(a, clip, 1 - clip)
    return ndtri(a)


def check_accuracies(values: Any, what: str = "accuracies", *, allow_nan: bool = False,
                     allow_empty: bool = False) -> np.ndarray:
    """``values`` as a float64 array, or one UserError saying what is wrong: not numbers,
    empty (unless ``allow_empty``), missing values (NaN; with ``allow_nan`` they may be
    missing, but not all of them), or values outside [0, 1] (with a hint when they look
    like percentages)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise UserError(f"{what}: accuracies must be numbers") from None
    if arr.size == 0:
        if allow_empty:
            return arr
        raise UserError(f"no {what} given (empty input)")
    missing = np.isnan(arr)
    if missing.any() and not allow_nan:
        raise UserError(f"{what}: {int(missing.sum())} accuracies are missing or not numbers")
    finite = arr[~missing]
    if finite.size == 0:
        raise UserError(f"{what}: all accuracies are missing")
    lo, hi = float(finite.min()), float(finite.max())
    if lo < 0 or hi > 1:     # infinities included
        hint = " (they look like percentages: divide by 100)" if lo >= 0 and hi <= 100 else ""
        raise UserError(f"{what}: accuracies must be fractions in [0, 1], found values in "
                        f"[{lo:.4g}, {hi:.4g}]{hint}")
    return arr
