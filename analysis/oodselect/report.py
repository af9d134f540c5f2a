"""OODSelect reporting: Fisher intervals, subset overlap, composition and enrichment,
subset files, and plots.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.stats import hypergeom, norm

from oodutils.accuracy import OODSELECT_CLIP, probit
from oodutils.csv_out import frame_csv
from oodutils.fileio import atomic_write_text, finite_json
from oodutils.plotting import figure_and_axes, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PathLike = str | os.PathLike[str]

Z95 = 1.959963984540054
PAPER_FISHER_M = 100      # Table A.3's parentheticals use m_b = 100 "trials" (notes_001 3.3)


def fisher_interval(r: float | None, m: int | None, level: float = 0.95
                    ) -> tuple[float, float]:
    """Fisher-z confidence interval (lo, hi) of a Pearson r measured on m models."""
    if m is None or m <= 3 or r is None or not np.isfinite(r):
        return (float("nan"), float("nan"))
    z = math.atanh(float(np.clip(r, -0.999999, 0.999999)))
    half = norm.ppf(0.5 + level / 2) / math.sqrt(m - 3)
    return (math.tanh(z - half), math.tanh(z + half))


# Below these an OODSelect estimate is reported with a warning: a Pearson r over fewer
# than 10 models has a 95% Fisher interval wider than +/-0.63 even at r = 0; a model
# part drawn from fewer than 3 runs holds checkpoints that are not independent; a subset
# of fewer than 10 examples moves its accuracy in steps of 10 points or more.
MIN_MODELS = 10
MIN_RUNS = 3
MIN_SUBSET = 10


def small_input_warnings(model_runs: ArrayLike, parts: Sequence[ArrayLike],
                         sizes: Sequence[int]) -> list[str]:
    """Why the estimates of this split mean little (one sentence each), or [].
    `model_runs`: each model's run; `parts`: (train, val, test) model indices."""
    warnings = []
    for name, idx in zip(("train", "val", "test"), parts):
        idx = np.asarray(idx)
        m, runs = len(idx), len(set(np.asarray(model_runs)[idx].tolist()))
        if m < MIN_MODELS:
            lo, hi = fisher_interval(0.0, m)
            spread = (f"a correlation of 0 would have the 95% interval [{lo:.2f}, {hi:.2f}]"
                      if np.isfinite(lo) else "no confidence interval exists (needs > 3)")
            warnings.append(f"only {m} {name} model(s) (fewer than {MIN_MODELS}): "
                            f"r_{name} means little; {spread}")
        if runs < MIN_RUNS:
            warnings.append(f"the {name} models come from {runs} run(s) (fewer than "
                            f"{MIN_RUNS}): their checkpoints are not independent, so r_{name} "
                            f"and its interval overstate what is known; train more runs")
    small = [int(n) for n in sizes if n < MIN_SUBSET]
    if small:
        warnings.append(f"subset size(s) {small} have fewer than {MIN_SUBSET} examples: "
                        f"accuracy on them moves in steps of 10 points or more")
    return warnings


def fisher_halfwidth(r: float, m: int | None) -> float:
    """r - lower end of the 95% Fisher interval: the number Table A.3 prints in
    parentheses, with m = 100 in the paper (i.e. a 1.96 / sqrt(97) z half-width)."""
    lo, _ = fisher_interval(r, m)
    return float(r) - lo


def paper_fisher_halfwidth(r: float) -> float:
    """Table A.3's parenthetical for a value r (paper-compatible mode, m = 100)."""
    return fisher_halfwidth(r, PAPER_FISHER_M)


# ---------------------------------------------------------------------------- overlap

def jaccard(a: ArrayLike, b: ArrayLike) -> float:
    """|A & B| / |A | B| of two index sets (NaN when both are empty)."""
    set_a, set_b = set(np.asarray(a).astype(int).tolist()), set(np.asarray(b).astype(int).tolist())
    union = len(set_a | set_b)
    return len(set_a & set_b) / union if union else float("nan")


def expected_random_jaccard(N: int, a: int, b: int) -> float:
    """E[J] of two independent uniform random subsets of sizes a and b out of N
    (their intersection is hypergeometric), exactly."""
    lo, hi = max(0, a + b - N), min(a, b)
    k = np.arange(lo, hi + 1)
    pmf = hypergeom(N, a, b).pmf(k)
    return float(np.sum(pmf * k / (a + b - k)))


def normalized_jaccard(subsets: Mapping[int, ArrayLike], N: int) -> pd.DataFrame:
    """J(S_i, S_j) / E[J] of random subsets of the same sizes (Eq. 6), for every pair of
    sizes. subsets: {n: indices}. Returns a DataFrame indexed and columned by n."""
    sizes = sorted(subsets)
    out = pd.DataFrame(index=sizes, columns=sizes, dtype=float)
    for a in sizes:
        for b in sizes:
            jr = expected_random_jaccard(N, a, b)
            out.loc[a, b] = jaccard(subsets[a], subsets[b]) / jr if jr > 0 else float("nan")
    out.index.name = "n"
    return out


# ------------------------------------------------------------------------ composition

def composition(examples: pd.DataFrame, subset: ArrayLike, columns: Sequence[str] | None = None,
                n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Prevalence of each category in the subset vs the whole OOD set, with bootstrap
    (examples of the subset resampled with replacement, n_boot times) 95% intervals of
    the enrichment ratio = subset prevalence / pool prevalence, and the share of
    resamples on the other side of 1 (a one-sided bootstrap p-value).

    columns: the example attributes to tabulate (default: label, group, env, split and
    any other low-cardinality column present). Returns a long DataFrame.
    """
    examples = examples.reset_index(drop=True)
    subset = np.asarray(subset, dtype=np.int64)
    if columns is None:
        columns = [c for c in examples.columns if c not in ("id", "path")
                   and examples[c].nunique(dropna=True) <= 50]
    rng = np.random.default_rng(seed)
    boot = rng.integers(0, len(subset), size=(n_boot, len(subset)))
    rows = []
    for col in columns:
        values = examples[col].to_numpy()
        if pd.Series(values).nunique(dropna=True) < 2:
            continue
        sub_vals = values[subset]
        for cat in pd.unique(values):
            pool = float(np.mean(values == cat))
            hit = (sub_vals == cat)
            prev = float(hit.mean())
            boot_prev = hit[boot].mean(axis=1)
            ratio = boot_prev / pool
            enr = prev / pool
            p = float(np.mean(ratio <= 1.0)) if enr > 1 else float(np.mean(ratio >= 1.0))
            rows.append({"attribute": col, "value": cat, "subset_count": int(hit.sum()),
                         "subset_prevalence": prev, "pool_prevalence": pool,
                         "enrichment": enr, "enrichment_lo": float(np.quantile(ratio, .025)),
                         "enrichment_hi": float(np.quantile(ratio, .975)),
                         "bootstrap_p": p})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------- subset files

def subset_table(examples: pd.DataFrame, subset: ArrayLike, scores: ArrayLike | None = None
                 ) -> pd.DataFrame:
    """The selected examples in rank order: rank, index (column of A), id, path, label,
    env, split, group (those known) and selection_score."""
    subset = np.asarray(subset, dtype=np.int64)
    ex = examples.reset_index(drop=True)
    table = pd.DataFrame({"rank": np.arange(1, len(subset) + 1), "index": subset})
    for col in ("id", "path", "label", "env", "split", "group"):
        if col in ex:
            table[col] = ex[col].to_numpy()[subset]
    table["selection_score"] = (np.asarray(scores, dtype=float)[subset]
                                if scores is not None else np.nan)
    return table


def write_csv(path: PathLike, frame: pd.DataFrame) -> None:
    """`frame` as CSV (cells escaped for spreadsheets), written atomically."""
    atomic_write_text(path, frame_csv(frame))


def write_json(path: PathLike, obj: Any) -> None:
    """`obj` as JSON (numpy values and frames as plain JSON, non-finite as null), written
    atomically."""
    def default(o: Any) -> Any:
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (np.floating,)):
            return None if not np.isfinite(o) else float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, (pd.DataFrame,)):
            return o.to_dict(orient="records")
        return str(o)
    atomic_write_text(path, json.dumps(finite_json(obj), indent=1, default=default) + "\n")



# ------------------------------------------------------------------------------ plots

def _finish(fig: Figure, own: bool, path: PathLike | None) -> Figure:
    """Lay out a figure we made (never the caller's), save it if asked; the Figure."""
    if own:
        fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi=120, bbox_inches="tight")
    return fig


def plot_correlation_vs_size(summary: pd.DataFrame, path: PathLike | None = None,
                             full_r: float | None = None, title: str | None = None,
                             ax: Axes | None = None) -> Figure:
    """r on the test models against subset size (log x), one line per method, with the
    Fisher 95% band (random: its 2.5-97.5% spread over draws). Drawn on ``ax`` if given,
    saved as PNG to ``path`` if given; returns the Figure."""
    own = ax is None
    fig, ax = figure_and_axes(ax, (6, 4))
    for method, part in summary.groupby("method", sort=False):
        part = part.sort_values("n")
        line, = ax.plot(part["n"], part["r_test"], marker="o", ms=3, label=method)
        if {"r_test_lo", "r_test_hi"} <= set(part) and part["r_test_lo"].notna().any():
            ax.fill_between(part["n"], part["r_test_lo"], part["r_test_hi"],
                            color=line.get_color(), alpha=0.15, lw=0)
    if full_r is not None:
        ax.axhline(full_r, color="grey", ls="--", lw=1, label="all OOD examples")
    ax.axhline(0, color="black", lw=0.5)
    ax.axhline(-0.3, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("subset size n")
    ax.set_ylabel("Pearson r (probit), test models")
    ax.set_title(title or "ID vs OOD-subset accuracy correlation")
    ax.legend(fontsize=8)
    return _finish(fig, own, path)


def plot_probit_scatter(y: ArrayLike, acc_all: ArrayLike, acc_subset: ArrayLike,
                        path: PathLike | None = None, n: int | None = None,
                        eps: float = OODSELECT_CLIP, title: str | None = None,
                        ax: Axes | None = None) -> Figure:
    """Probit ID accuracy against probit OOD accuracy on all examples and on the
    selected subset (test models), each with its least-squares line. Drawn on ``ax`` if
    given, saved as PNG to ``path`` if given; returns the Figure."""
    pr = lambda a: probit(a, eps)  # noqa: E731
    x = pr(y)
    own = ax is None
    fig, ax = figure_and_axes(ax, (5, 4))
    for acc, label, color in ((acc_all, "all OOD examples", "tab:blue"),
                              (acc_subset, f"selected subset (n={n})", "tab:red")):
        v = pr(acc)
        ax.scatter(x, v, s=10, alpha=0.6, color=color, label=label)
        if np.ptp(x) > 0:
            slope, icpt = np.polyfit(x, v, 1)
            xs = np.linspace(x.min(), x.max(), 20)
            ax.plot(xs, slope * xs + icpt, color=color, lw=1)
    ax.set_xlabel("probit(ID accuracy)")
    ax.set_ylabel("probit(OOD accuracy)")
    ax.set_title(title or "Test models")
    ax.legend(fontsize=8)
    return _finish(fig, own, path)

