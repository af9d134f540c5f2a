"""Plotting helpers of the analyses (matplotlib). No backend is chosen here: figures are
the caller's axes or backend-less Figures (:mod:`oodutils.plotting`), so they work in a
notebook and headless alike.

- :func:`figure` / :func:`save`: a figure (or the caller's axes) and an atomic PNG write.
- :func:`accuracy_axes`: put accuracy tick labels on probit (or logit) axes.
- :func:`identity_line`, :func:`fit_line`: the y = x reference and a fitted line.
- :func:`aotl_scatter`: the accuracy-on-the-line scatter of one split.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from analysis.aotl.stats import transform as stats_transform
from oodutils.accuracy import AOTL_CLIP
from oodutils.plotting import figure_and_axes, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ACC_TICKS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)

Transform = Callable[..., np.ndarray]   # (accuracies, scale, clip) -> the fitting scale
Fit = Mapping[str, float]               # slope, intercept and r of a line
Series = tuple[str, ArrayLike, ArrayLike, Fit]   # (label, x accuracies, y accuracies, fit)


def figure(width: float = 6.0, height: float = 5.0, ax: Axes | None = None
           ) -> tuple[Figure, Axes]:
    """``(fig, ax)``: the caller's axes, or a new backend-less Figure of this size."""
    return figure_and_axes(ax, (width, height))


def save(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically (tight bounding box); returns the path."""
    return save_figure(fig, path, dpi=dpi, bbox_inches="tight")


def accuracy_axes(ax: Axes, transform: Transform, scale: str = "probit", clip: float = AOTL_CLIP,
                  ticks: Sequence[float] = ACC_TICKS, axis: str = "both") -> None:
    """Ticks at transform(acc) labelled as accuracies (percent), inside the current view
    limits (which stay as they are)."""
    shown = (np.linspace(0, 1, 11).tolist() if scale == "identity"
             else [t for t in ticks if clip <= t <= 1 - clip])
    pos = transform(np.asarray(shown), scale, clip)
    labels = np.array([f"{100 * t:g}%" for t in shown])
    for which, get_lim, set_ticks, set_lim in (
            ("x", ax.get_xlim, ax.set_xticks, ax.set_xlim),
            ("y", ax.get_ylim, ax.set_yticks, ax.set_ylim)):
        if axis not in ("both", which):
            continue
        lo, hi = get_lim()
        keep = (pos >= lo) & (pos <= hi)
        set_ticks(pos[keep], labels[keep])
        set_lim(lo, hi)


def identity_line(ax: Axes, lo: float, hi: float, **kw: Any) -> None:
    """The y = x reference line from lo to hi."""
    kw = {"color": "gray", "linestyle": "--", "linewidth": 1, "label": "y = x", **kw}
    ax.plot([lo, hi], [lo, hi], **kw)


def fit_line(ax: Axes, slope: float, intercept: float, lo: float, hi: float, **kw: Any
             ) -> None:
    """The line slope * x + intercept from x = lo to x = hi."""
    xs = np.array([lo, hi])
    ax.plot(xs, slope * xs + intercept, **kw)


def aotl_scatter(series: Sequence[Series], overall: Series, path: str | Path | None = None,
                 scale: str = "probit", clip: float = AOTL_CLIP, title: str | None = None,
                 transform: Transform | None = None, max_points: int = 5000, seed: int = 0,
                 ax: Axes | None = None) -> Figure:
    """Scatter of one split on the fitting scale, with accuracy tick labels; drawn on
    ``ax`` if given, saved as PNG to ``path`` if given; returns the Figure.

    ``series``: list of (label, x_acc, y_acc, fit) with ``fit`` a dict holding slope,
    intercept and r (one per ID environment); ``overall``: the same for the overall fit
    (its points are not drawn). At most ``max_points`` points per series are drawn (a
    random subset), fits use all of them.
    """
    transform = transform or stats_transform
    fig, ax = figure(ax=ax)
    rng = np.random.default_rng(seed)
    everything = []
    for i, (label, x, y, fit) in enumerate(series):
        tx, ty = transform(x, scale, clip), transform(y, scale, clip)
        everything += [tx, ty]
        keep = (rng.choice(len(tx), max_points, replace=False) if len(tx) > max_points
                else slice(None))
        color = f"C{i % 10}"   # the style's colour cycle
        ax.scatter(tx[keep], ty[keep], s=6, alpha=0.35, color=color, linewidths=0,
                   rasterized=True)
        lo, hi = tx.min(), tx.max()
        fit_line(ax, fit["slope"], fit["intercept"], lo, hi, color=color, linewidth=1.5,
                 label=f"{label}: slope {fit['slope']:.2f}, R {fit['r']:.2f}")
    label, x, y, fit = overall
    tx = transform(x, scale, clip)
    everything += [tx, transform(y, scale, clip)]
    fit_line(ax, fit["slope"], fit["intercept"], tx.min(), tx.max(), color="black",
             linewidth=2.5, label=f"{label}: slope {fit['slope']:.2f}, R {fit['r']:.2f}")
    allv = np.concatenate(everything)
    lo, hi = float(allv.min()), float(allv.max())
    pad = 0.05 * (hi - lo or 1.0)
    identity_line(ax, lo - pad, hi + pad)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    accuracy_axes(ax, transform, scale, clip)
    ax.set_xlabel(f"ID accuracy ({scale} scale)")
    ax.set_ylabel(f"OOD accuracy ({scale} scale)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    if path is not None:
        save(fig, path)
    return fig
