"""Shared plotting helpers (matplotlib, Agg backend: no display needed).

- :func:`figure` / :func:`save`: a figure and an atomic PNG write.
- :func:`accuracy_axes`: put accuracy tick labels on probit (or logit) axes.
- :func:`identity_line`, :func:`fit_line`: the y = x reference and a fitted line.
- :func:`aotl_scatter`: the accuracy-on-the-line scatter of one split.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from oodutils.accuracy import AOTL_CLIP

ACC_TICKS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def figure(width=6.0, height=5.0):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def save(fig, path, dpi=120):
    """Write ``fig`` as PNG to ``path`` atomically and close it; returns the path."""
    from oodutils.fileio import atomic_write_bytes
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    _plt().close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def accuracy_axes(ax, transform, scale="probit", clip=AOTL_CLIP, ticks=ACC_TICKS, axis="both"):
    """Ticks at transform(acc) labelled as accuracies (percent), inside the current view
    limits (which stay as they are)."""
    if scale == "identity":
        ticks = np.linspace(0, 1, 11)
    else:
        ticks = [t for t in ticks if clip <= t <= 1 - clip]
    pos = transform(np.asarray(ticks), scale, clip)
    labels = np.array([f"{100 * t:g}%" for t in ticks])
    for which, get_lim, set_ticks, set_lim in (
            ("x", ax.get_xlim, ax.set_xticks, ax.set_xlim),
            ("y", ax.get_ylim, ax.set_yticks, ax.set_ylim)):
        if axis not in ("both", which):
            continue
        lo, hi = get_lim()
        keep = (pos >= lo) & (pos <= hi)
        set_ticks(pos[keep], labels[keep])
        set_lim(lo, hi)


def identity_line(ax, lo, hi, **kw):
    kw = {"color": "gray", "linestyle": "--", "linewidth": 1, "label": "y = x", **kw}
    ax.plot([lo, hi], [lo, hi], **kw)


def fit_line(ax, slope, intercept, lo, hi, **kw):
    xs = np.array([lo, hi])
    ax.plot(xs, slope * xs + intercept, **kw)


def aotl_scatter(series, overall, path, scale="probit", clip=AOTL_CLIP, title=None,
                 transform=None, max_points=5000, seed=0):
    """Scatter of one split on the fitting scale, with accuracy tick labels.

    ``series``: list of (label, x_acc, y_acc, fit) with ``fit`` a dict holding slope,
    intercept and r (one per ID environment); ``overall``: the same for the overall fit
    (its points are not drawn). At most ``max_points`` points per series are drawn (a
    random subset), fits use all of them.
    """
    if transform is None:
        from .aotl import transform
    plt = _plt()
    fig, ax = figure()
    rng = np.random.default_rng(seed)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    everything = []
    for i, (label, x, y, fit) in enumerate(series):
        tx, ty = transform(x, scale, clip), transform(y, scale, clip)
        everything += [tx, ty]
        keep = (rng.choice(len(tx), max_points, replace=False) if len(tx) > max_points
                else slice(None))
        color = colors[i % len(colors)]
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
    return save(fig, path)
