"""Figures of OoD-Bench: the diversity/correlation plane (Fig. 3) and the Colored MNIST
heatmaps (Fig. 4): Figures (on the caller's axes if given), saved as PNG on request.

Fig. 4 grids (one trial per cell, as the paper):
  'rho'    (a) correlation shift over (rho_tr, rho_te), no blue;
  'mu-div' (b) diversity shift over (mu_tr, mu_te), rho_tr = 0.1, rho_te = 0.9, sigma 0.1;
  'mu-cor' (c) correlation shift over (mu_tr, mu_te), rho_tr = 0.1, rho_te = 0.9, sigma 0.25.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ood_bench.trials import TrialConfig, run_trials
from oodutils.errors import UserError
from oodutils.log import get_logger
from oodutils.plotting import figure_and_axes, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: one dataset on the plane: ((diversity, its SE), (correlation, its SE))
Point = tuple[tuple[float, float], tuple[float, float]]
Points = Mapping[str, Point]

logger = get_logger(__name__)

#: Table 8 (mean, standard error over 5 runs), the points of Fig. 3
PAPER_TABLE8: Points = {
    "i.i.d.": ((0.00, 0.00), (0.00, 0.00)),
    "PACS": ((0.81, 0.05), (0.00, 0.00)),
    "OfficeHome": ((0.17, 0.02), (0.00, 0.00)),
    "TerraIncognita": ((0.92, 0.06), (0.00, 0.00)),
    "Camelyon17": ((1.07, 0.80), (0.00, 0.00)),
    "DomainNet": ((0.43, 0.03), (0.08, 0.00)),
    "ColoredMNIST": ((0.00, 0.00), (0.55, 0.13)),
    "CelebA": ((0.02, 0.02), (0.29, 0.04)),
    "NICO": ((0.11, 0.06), (0.24, 0.08)),
    "ImageNet-A": ((0.02, 0.00), (0.06, 0.05)),
    "ImageNet-R": ((0.06, 0.01), (0.21, 0.01)),
    "ImageNet-V2": ((0.01, 0.01), (0.49, 0.10)),
}

HEATMAPS: dict[str, dict[str, Any]] = {
    "rho": {"axes": ("cmnist_rho_tr", "cmnist_rho_te"), "metric": "correlation",
            "fixed": {"cmnist_blue": False},
            "labels": (r"$\rho_{tr}$", r"$\rho_{te}$")},
    "mu-div": {"axes": ("cmnist_mu_tr", "cmnist_mu_te"), "metric": "diversity",
               "fixed": {"cmnist_blue": True, "cmnist_rho_tr": 0.1, "cmnist_rho_te": 0.9,
                         "cmnist_sigma_tr": 0.1, "cmnist_sigma_te": 0.1},
               "labels": (r"$\mu_{tr}$", r"$\mu_{te}$")},
    "mu-cor": {"axes": ("cmnist_mu_tr", "cmnist_mu_te"), "metric": "correlation",
               "fixed": {"cmnist_blue": True, "cmnist_rho_tr": 0.1, "cmnist_rho_te": 0.9,
                         "cmnist_sigma_tr": 0.25, "cmnist_sigma_te": 0.25},
               "labels": (r"$\mu_{tr}$", r"$\mu_{te}$")},
}


def plane_points_from_summaries(named_paths: Mapping[str, str]) -> dict[str, Point]:
    """{name: ((div mean, se), (cor mean, se))} from summary.json files."""
    points = {}
    for name, path in named_paths.items():
        try:
            with open(path) as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read summary {path!r}: {e}") from None
        if "diversity" not in s or "correlation" not in s:
            raise UserError(f"{path}: not a summary (no diversity / correlation)")
        get = (lambda v: (v["mean"], v.get("se") or 0.0)) if isinstance(
            s["diversity"], dict) else (lambda v: (v, 0.0))
        points[name] = (get(s["diversity"]), get(s["correlation"]))
    return points


def plot_plane(points: Points, out: str | os.PathLike[str] | None = None,
               paper: bool = False, title: str = "Diversity and correlation shift",
               ax: Axes | None = None) -> Figure:
    """Fig. 3: every dataset a point (x = diversity, y = correlation) with SE bars; drawn
    on `ax` if given, saved as PNG to `out` if given; returns the Figure."""
    fig, ax = figure_and_axes(ax, (5.5, 4.5))
    series: list[tuple[str, Points, str, str]] = [("ours", points, "o", "C0")]
    if paper:
        series.append(("paper (Table 8)", PAPER_TABLE8, "s", "C7"))
    for label, pts, marker, color in series:
        if not pts:
            continue
        names = list(pts)
        x = np.array([pts[n][0][0] for n in names])
        xe = np.array([pts[n][0][1] for n in names])
        y = np.array([pts[n][1][0] for n in names])
        ye = np.array([pts[n][1][1] for n in names])
        ax.errorbar(x, y, xerr=xe, yerr=ye, fmt=marker, color=color, label=label,
                    capsize=2, alpha=0.85)
        for n, xi, yi in zip(names, x, y):
            ax.annotate(n, (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7,
                        color=color)
    ax.set_xlabel("diversity shift")
    ax.set_ylabel("correlation shift")
    ax.set_xlim(left=-0.05)
    ax.set_ylim(bottom=-0.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if out is not None:
        _save(fig, out)
    return fig


def _save(fig: Figure, out: str | os.PathLike[str]) -> None:
    save_figure(fig, out, dpi=150)


def run_heatmap(kind: str, values: Sequence[float], data_dir: str, seed: int = 0,
                verbose: bool = False, **overrides: Any) -> dict[str, Any]:
    """One trial per (tr, te) cell of a Fig. 4 grid. Returns the grid dict."""
    if kind not in HEATMAPS:
        raise UserError(f"unknown heatmap {kind!r}; valid: {', '.join(HEATMAPS)}")
    spec = HEATMAPS[kind]
    values = [float(v) for v in values]
    grid = np.full((len(values), len(values)), np.nan)
    for i, v_tr in enumerate(values):
        for j, v_te in enumerate(values):
            settings = dict(spec["fixed"], **{spec["axes"][0]: v_tr, spec["axes"][1]: v_te})
            cfg = TrialConfig(dataset="OoDBenchColoredMNIST", data_dir=data_dir, envs_p=[0],
                              envs_q=[1], dataset_settings=settings, **overrides)
            s = run_trials(cfg, 1, seed, None, verbose=verbose)
            grid[i, j] = s[spec["metric"]]["mean"]
            if verbose:
                logger.info(f"{kind}: {spec['axes'][0]}={v_tr}, {spec['axes'][1]}={v_te}: "
                            f"{spec['metric']} {grid[i, j]:.4f}")
    return {"kind": kind, "metric": spec["metric"], "axes": list(spec["axes"]),
            "fixed": spec["fixed"], "values": values, "grid": grid.tolist(), "seed": seed}


def plot_heatmap(grid: Mapping[str, Any], out: str | os.PathLike[str] | None = None,
                 ax: Axes | None = None) -> Figure:
    """Fig. 4 style: rows = training value, columns = test value, cells annotated; drawn
    on `ax` if given, saved as PNG to `out` if given; returns the Figure."""
    kind = grid.get("kind", "rho")
    labels = HEATMAPS.get(kind, HEATMAPS["rho"])["labels"]
    values = grid["values"]
    g = np.array(grid["grid"], dtype=float)
    fig, ax = figure_and_axes(ax, (4.8, 4.2))
    im = ax.imshow(g, cmap="viridis", origin="lower", vmin=0.0,
                   vmax=max(1.0, float(np.nanmax(g)) if np.isfinite(g).any() else 1.0))
    ticks = [f"{v:g}" for v in values]
    ax.set_xticks(range(len(values)), ticks)
    ax.set_yticks(range(len(values)), ticks)
    ax.set_xlabel(labels[1])
    ax.set_ylabel(labels[0])
    for i in range(g.shape[0]):
        for j in range(g.shape[1]):
            if np.isfinite(g[i, j]):
                ax.text(j, i, f"{g[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if g[i, j] < 0.6 else "black")
    ax.set_title(f"{grid.get('metric', 'shift')} shift ({kind})")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    if out is not None:
        _save(fig, out)
    return fig
