"""Validity desiderata for spurious-correlation benchmarks, and method recommendation.

Bell et al. 2024, "Reassessing the Validity of Spurious Correlations Benchmarks": a benchmark
(dataset + worst-group test accuracy) is valid when it shows
  * ERM Failure: ERM's per-group test accuracies differ (SD over groups),
  * Discriminative Power: methods' worst-group (WG) test accuracies differ (SD over methods),
  * Convergent Validity: it agrees (Pearson r over methods) with benchmarks of similar task
    difficulty K and disagrees with dissimilar ones: -slope of r(b, b') on |K_b - K_b'|.
K is a Bayes factor: the per-sample mean log-likelihood ratio, on ERM's worst test group,
between a group-reweighted model and ERM (natural log).

The core below is array / DataFrame in, numbers / DataFrame out, so it is testable without
training. Accuracies are fractions in [0, 1]; spreads and accuracies in tables are reported in
percentage points (``scale=100``) as in the paper. ``analysis.validity.records`` turns run
directories into these inputs; ``python -m analysis.validity`` is the command line.

Defaults where the paper is silent (each a parameter):
  * sample standard deviations (ddof=1);
  * thresholds (the paper gives none): ERM Failure >= 5 pp, Discriminative Power >= 2.5 pp,
    Convergent Validity >= 0.1, each inside the interval Table 1 implies
    ((0.65, 6.47], (2.16, 2.95], (0.03, 0.15]);
  * the worst group for K is the group where ERM's accuracy is lowest, K is a per-sample mean;
  * ties (equal |Delta K|, equal accuracies) are reported, not silently broken.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import special, stats

from analysis.validity.config import DEFAULT_THRESHOLDS, STRATEGIES
from oodutils.accuracy import check_accuracies
from oodutils.errors import UserError

_TIE_ATOL = 1e-9
# methods x benchmarks worst-group test accuracies (a Series: one benchmark)
AccuracyTable = Union[pd.DataFrame, pd.Series]
ByBenchmark = Union[Mapping[str, Any], pd.Series]     # benchmark -> K, or -> architecture

__all__ = [
    "DEFAULT_THRESHOLDS", "STRATEGIES", "check_accuracies", "per_group_accuracy",
    "worst_group_accuracy", "erm_failure", "discriminative_power", "log_likelihood",
    "group_inverse_weights", "KResult", "bayes_factor_k", "mutual_information",
    "attributes_from_groups", "agreement_matrix", "convergent_validity", "method_robustness",
    "best_methods", "validity_table", "closest_benchmarks", "Recommendation",
    "recommend_method", "leave_one_out", "strategy_win_counts",
]


# ---------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------

def _require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"{what} is missing column(s) {', '.join(map(repr, missing))}; "
                        f"has {', '.join(map(str, df.columns)) or 'none'}")


def _wga_frame(wga: AccuracyTable, what: str = "worst-group accuracies") -> pd.DataFrame:
    """A methods x benchmarks DataFrame of fractions (NaN = not run)."""
    if isinstance(wga, pd.Series):
        wga = wga.to_frame()
    if not isinstance(wga, pd.DataFrame):
        raise UserError(f"{what} must be a DataFrame (methods x benchmarks)")
    if wga.empty:
        raise UserError(f"no {what} given (empty input)")
    check_accuracies(wga.to_numpy(dtype=float), what, allow_nan=True)
    return wga.astype(float)


# ---------------------------------------------------------------------------------------------
# groups and accuracies
# ---------------------------------------------------------------------------------------------

def per_group_accuracy(labels: ArrayLike, preds: ArrayLike, groups: ArrayLike) -> pd.Series:
    """Accuracy per group (a Series indexed by group, sorted)."""
    labels, preds, groups = map(np.asarray, (labels, preds, groups))
    if labels.size == 0:
        raise UserError("no examples given (empty input)")
    if not labels.shape == preds.shape == groups.shape:
        raise UserError("labels, predictions and groups must have the same length")
    correct = pd.Series((labels == preds).astype(float))
    return correct.groupby(groups).mean().rename("accuracy").rename_axis("group")


def worst_group_accuracy(labels: ArrayLike, preds: ArrayLike, groups: ArrayLike) -> float:
    return float(per_group_accuracy(labels, preds, groups).min())


def _sd(arr: np.ndarray, ddof: int, scale: float) -> float:
    # equal values give exactly 0 (np.std leaves rounding residue like 1e-14)
    return 0.0 if np.ptp(arr) == 0 else float(np.std(arr, ddof=ddof) * scale)


def erm_failure(group_accuracies: ArrayLike | Mapping[Any, float], ddof: int = 1,
                scale: float = 100.0) -> float:
    """SD over groups of ERM's per-group test accuracy.

    ``group_accuracies``: one value per group, or a seeds x groups array / DataFrame (averaged
    over seeds first; NaN = group absent in that seed). Returned in ``scale`` units (pp).
    """
    arr = check_accuracies(group_accuracies, "ERM group accuracies", allow_nan=True)
    if arr.ndim == 2:
        arr = np.nanmean(arr, axis=0)
    arr = arr[~np.isnan(arr)]
    if arr.size < 2:
        raise UserError(f"ERM Failure needs at least 2 groups; got {arr.size}")
    return _sd(arr, ddof, scale)


def discriminative_power(wga_by_method: ArrayLike | Mapping[Any, float], ddof: int = 1,
                         scale: float = 100.0) -> float:
    """SD over methods of worst-group test accuracy (each method already averaged over seeds).
    Accepts a sequence, dict or Series; returned in ``scale`` units (pp)."""
    if isinstance(wga_by_method, dict):
        wga_by_method = list(wga_by_method.values())
    arr = check_accuracies(wga_by_method, "worst-group accuracies", allow_nan=True)
    arr = arr[~np.isnan(arr)].ravel()
    if arr.size < 2:
        raise UserError("Discriminative Power needs at least 2 methods (models); got "
                        f"{arr.size}")
    return _sd(arr, ddof, scale)


# ---------------------------------------------------------------------------------------------
# K: the Bayes factor
# ---------------------------------------------------------------------------------------------

def log_likelihood(logits: ArrayLike, labels: ArrayLike) -> np.ndarray:
    """log p(label | x) per example, from logits (n, C); (n,) or (n, 1) is DomainBed's binary
    single-logit case (p(y=1) = sigmoid(z)). Computed in float64."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels).astype(np.int64)
    if z.shape[0] != y.shape[0]:
        raise UserError(f"{z.shape[0]} logits rows for {y.shape[0]} labels")
    if z.shape[0] == 0:
        raise UserError("no examples given (empty input)")
    if not np.isfinite(z).all():
        raise UserError("logits contain non-finite values (float16 overflow?)")
    if z.ndim == 1 or z.shape[1] == 1:
        z = z.reshape(-1)
        if not np.isin(y, (0, 1)).all():
            raise UserError("single-logit (binary) outputs need labels in {0, 1}")
        return np.where(y == 1, -np.logaddexp(0.0, -z), -np.logaddexp(0.0, z))
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise UserError(f"labels must lie in [0, {z.shape[1] - 1}] for {z.shape[1]} logits")
    logp = z - special.logsumexp(z, axis=1, keepdims=True)
    return logp[np.arange(len(y)), y]


def _predicted(logits: ArrayLike) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 1 or z.shape[1] == 1:
        return (z.reshape(-1) > 0).astype(np.int64)
    return z.argmax(axis=1)


def group_inverse_weights(groups: ArrayLike) -> np.ndarray:
    """w_i = N / N_{g_i} (inverse group size, Eq. 2): the reweighted model's sample weights."""
    groups = np.asarray(groups)
    if groups.size == 0:
        raise UserError("no examples given (empty input)")
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    return len(groups) / counts[inverse]


@dataclass
class KResult:
    k: float                     # the Bayes factor (natural log)
    worst_group: int             # the group it was computed on
    n: int                       # examples in that group
    reduction: str               # 'mean' (per sample) or 'sum'
    erm_group_accuracy: dict = field(default_factory=dict)  # ERM's accuracy per group

    def __float__(self) -> float:
        return self.k


def bayes_factor_k(logits_ref: ArrayLike, logits_erm: ArrayLike, labels: ArrayLike,
                   groups: ArrayLike, worst_group: str | int = "erm_lowest_acc",
                   reduction: str = "mean") -> KResult:
    """K = log P(Y^WG | X^WG, M_ref) - log P(Y^WG | X^WG, M_ERM) on the worst test group.

    logits_ref: the reference model's test logits (group-reweighted ERM by default in the
        paper; GroupDRO as the alternative), logits_erm: ERM's, on the same examples.
    worst_group: 'erm_lowest_acc' (the group where ERM is least accurate; ties -> lowest
        group index), 'smallest' (fewest test examples), or a group index.
    reduction: 'mean' (per-sample mean log-likelihood ratio, the default) or 'sum'.
    """
    labels, groups = np.asarray(labels), np.asarray(groups)
    ll_ref = log_likelihood(logits_ref, labels)
    ll_erm = log_likelihood(logits_erm, labels)
    if groups.shape != labels.shape:
        raise UserError("groups and labels must have the same length")
    if reduction not in ("mean", "sum"):
        raise UserError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    keep = groups >= 0
    if not keep.any():
        raise UserError("K needs group annotations; every example has group -1")
    acc = per_group_accuracy(labels[keep], _predicted(logits_erm)[keep], groups[keep])
    if isinstance(worst_group, str):
        if worst_group == "erm_lowest_acc":
            g = int(acc.index[np.argmin(acc.to_numpy())])
        elif worst_group == "smallest":
            sizes = pd.Series(groups[keep]).value_counts().sort_index()
            g = int(sizes.idxmin())
        else:
            raise UserError("worst_group must be 'erm_lowest_acc', 'smallest' or a group "
                            f"index; got {worst_group!r}")
    else:
        g = int(worst_group)
        if g not in acc.index:
            raise UserError(f"group {g} has no test examples; groups present: "
                            f"{', '.join(map(str, acc.index))}")
    mask = groups == g
    ratio = ll_ref[mask] - ll_erm[mask]
    k = float(ratio.mean() if reduction == "mean" else ratio.sum())
    return KResult(k, g, int(mask.sum()), reduction,
                   {int(i): float(v) for i, v in acc.items()})


# ---------------------------------------------------------------------------------------------
# mutual information (the baseline the paper argues against)
# ---------------------------------------------------------------------------------------------

def mutual_information(y: ArrayLike, a: ArrayLike, base: float | None = None) -> float:
    """I(Y; A) = sum_{y,a} P(y,a) log(P(y,a) / (P(y) P(a))) of the empirical joint; nats
    unless ``base`` (e.g. 2 for bits)."""
    y, a = np.asarray(y), np.asarray(a)
    if y.size == 0:
        raise UserError("no examples given (empty input)")
    if y.shape != a.shape:
        raise UserError("labels and attributes must have the same length")
    joint = pd.crosstab(y, a).to_numpy(dtype=float, copy=True)
    joint = joint / joint.sum()
    py, pa = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    mi = float(np.sum(joint[nz] * np.log(joint[nz] / (py @ pa)[nz])))
    mi = max(mi, 0.0)
    return mi / math.log(base) if base else mi


def attributes_from_groups(groups: ArrayLike, labels: ArrayLike, n_groups: int,
                           num_classes: int) -> np.ndarray:
    """Attributes under the SubpopBench convention g = y * |A| + a (checked against labels)."""
    groups, labels = np.asarray(groups), np.asarray(labels)
    if not n_groups or not num_classes or n_groups % num_classes:
        raise UserError(f"{n_groups} groups over {num_classes} classes do not follow "
                        "g = y * |A| + a; cannot recover attributes")
    n_attr = n_groups // num_classes
    if ((groups // n_attr) != labels).any():
        raise UserError("groups do not follow g = y * |A| + a (group // |A| != label); "
                        "cannot recover attributes")
    return groups % n_attr


# ---------------------------------------------------------------------------------------------
# agreement between benchmarks, convergent validity, robustness
# ---------------------------------------------------------------------------------------------

def agreement_matrix(wga: AccuracyTable, method: str = "pearson", min_methods: int = 3
                     ) -> pd.DataFrame:
    """Benchmark x benchmark correlation (over methods run on both) of WG test accuracies.
    Pairs with fewer than ``min_methods`` shared methods or a constant column are NaN."""
    wga = _wga_frame(wga)
    names = list(wga.columns)
    out = pd.DataFrame(np.nan, index=names, columns=names)
    for i, b in enumerate(names):
        out.loc[b, b] = 1.0
        for b2 in names[i + 1:]:
            pair = wga[[b, b2]].dropna()
            if len(pair) < min_methods or pair[b].nunique() < 2 or pair[b2].nunique() < 2:
                continue
            r = pair[b].corr(pair[b2], method=method)
            out.loc[b, b2] = out.loc[b2, b] = r
    return out


def convergent_validity(wga: AccuracyTable, K: ByBenchmark,
                        benchmarks: Iterable[str] | None = None,
                        pool: Iterable[str] | None = None, min_pairs: int = 3,
                        min_methods: int = 3, arch: ByBenchmark | None = None,
                        method: str = "pearson") -> pd.DataFrame:
    """-slope of the OLS fit r(b, b') = alpha + beta |K_b - K_b'| over b' in ``pool``.

    wga: methods x benchmarks WG test accuracies; K: benchmark -> K (Series or dict).
    benchmarks: whose validity to compute (default: every benchmark with a K).
    pool: the comparison benchmarks (default: the same; the paper uses those passing ERM
        Failure and Discriminative Power). arch: optional benchmark -> architecture; pairs
        then stay within one architecture (K is model-specific).
    Returns a DataFrame indexed by benchmark: conv_validity, slope, intercept, r2, n_pairs
    (NaN where fewer than ``min_pairs`` usable pairs).
    """
    wga = _wga_frame(wga)
    K = pd.Series(K, dtype=float).dropna()
    if K.empty:
        raise UserError("Convergent Validity needs K for the benchmarks; none given")
    names = [b for b in wga.columns if b in K.index]
    benchmarks = names if benchmarks is None else [b for b in benchmarks if b in names]
    pool = names if pool is None else [b for b in pool if b in names]
    arch = None if arch is None else pd.Series(arch)
    agree = agreement_matrix(wga[sorted(set(benchmarks) | set(pool), key=names.index)],
                             method, min_methods)
    rows = []
    for b in benchmarks:
        others = [o for o in pool if o != b and not np.isnan(agree.loc[b, o])
                  and (arch is None or arch.get(o) == arch.get(b))]
        row = {"benchmark": b, "conv_validity": np.nan, "slope": np.nan,
               "intercept": np.nan, "r2": np.nan, "n_pairs": len(others)}
        if len(others) >= max(min_pairs, 2):
            dk = np.abs(K[others].to_numpy() - K[b])
            r = agree.loc[b, others].to_numpy(dtype=float)
            if np.ptp(dk) > 0:
                fit = stats.linregress(dk, r)
                row.update(conv_validity=-fit.slope, slope=fit.slope,
                           intercept=fit.intercept, r2=fit.rvalue ** 2)
        rows.append(row)
    return pd.DataFrame(rows, columns=["benchmark", "conv_validity", "slope", "intercept",
                                       "r2", "n_pairs"]).set_index("benchmark")


def method_robustness(wga: AccuracyTable, K: ByBenchmark | None = None, scale: float = 100.0
                      ) -> pd.DataFrame:
    """Per method over benchmarks: median and IQR of WG test accuracy (pp), and the OLS fit of
    WG accuracy on K (slope, R^2) where K is given for at least 3 of its benchmarks."""
    wga = _wga_frame(wga)
    K = None if K is None else pd.Series(K, dtype=float)
    rows = []
    for m, accs in wga.iterrows():
        accs = accs.dropna()
        q25, q50, q75 = np.percentile(accs.to_numpy(), [25, 50, 75]) * scale
        row = {"method": m, "median": q50, "iqr": q75 - q25, "n_benchmarks": len(accs),
               "slope_k": np.nan, "r2_k": np.nan}
        if K is not None:
            both = [b for b in accs.index if b in K.index and not np.isnan(K[b])]
            if len(both) >= 3 and np.ptp(K[both].to_numpy()) > 0:
                fit = stats.linregress(K[both].to_numpy(), accs[both].to_numpy() * scale)
                row.update(slope_k=fit.slope, r2_k=fit.rvalue ** 2)
        rows.append(row)
    return pd.DataFrame(rows).set_index("method")


def best_methods(wga: AccuracyTable, as_frame: bool = False) -> dict[str, list[str]] | pd.DataFrame:
    """Per benchmark: the list of methods with the highest WG accuracy (several on a tie).
    ``as_frame=True``: a DataFrame instead, one row per (benchmark, best method) with its
    WG accuracy (columns benchmark, method, wga)."""
    wga = _wga_frame(wga)
    out = {}
    for b in wga.columns:
        col = wga[b].dropna()
        if col.empty:
            continue
        out[b] = [m for m, v in col.items() if abs(v - col.max()) <= _TIE_ATOL]
    if as_frame:
        return pd.DataFrame([{"benchmark": b, "method": m, "wga": float(wga.loc[m, b])}
                             for b, methods in out.items() for m in methods],
                            columns=["benchmark", "method", "wga"])
    return out


# ---------------------------------------------------------------------------------------------
# the Table-1 report
# ---------------------------------------------------------------------------------------------

def validity_table(measures: pd.DataFrame, thresholds: Mapping[str, float] | None = None
                   ) -> pd.DataFrame:
    """Add pass/fail flags to a per-benchmark table of measures (Table 1 style).

    measures: DataFrame indexed by benchmark with columns erm_failure, disc_power (pp) and
    conv_validity (NaN = could not be computed). thresholds: dict overriding
    DEFAULT_THRESHOLDS. A benchmark is valid when all three pass; where Convergent Validity is
    missing, its flag and ``valid`` are missing (pd.NA) unless another flag already fails.
    """
    thr = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    unknown = set(thr) - set(DEFAULT_THRESHOLDS)
    if unknown:
        raise UserError(f"unknown threshold(s) {', '.join(sorted(unknown))}; valid: "
                        f"{', '.join(DEFAULT_THRESHOLDS)}")
    if not isinstance(measures, pd.DataFrame) or measures.empty:
        raise UserError("no benchmarks to report (empty input)")
    _require_columns(measures, list(DEFAULT_THRESHOLDS), "the measures table")
    out = measures.copy()
    for name, cut in thr.items():
        values = out[name].astype(float)
        flag = pd.Series((values >= cut).to_numpy(), index=out.index, dtype="boolean")
        flag[values.isna()] = pd.NA
        out[f"pass_{name}"] = flag
    def combine(flags: Sequence[Any]) -> Any:
        if any(f is False for f in flags):
            return False
        return pd.NA if any(f is pd.NA for f in flags) else True

    flags = out[[f"pass_{n}" for n in DEFAULT_THRESHOLDS]].astype(object)
    flags = flags.where(flags.notna(), pd.NA)
    out["valid"] = pd.Series([combine([bool(f) if f is not pd.NA else f for f in row])
                              for row in flags.itertuples(index=False)],
                             index=out.index, dtype="boolean")
    out.attrs["thresholds"] = thr
    return out


# ---------------------------------------------------------------------------------------------
# choosing a method (section 5)
# ---------------------------------------------------------------------------------------------

def closest_benchmarks(k: float, K: ByBenchmark, candidates: Collection[str] | None = None,
                       exclude: Collection[str] = (), atol: float = _TIE_ATOL) -> list[str]:
    """The benchmarks whose K is closest to ``k`` (several when tied within ``atol``), in the
    order of ``K``. candidates: restrict to these (e.g. the valid ones of the same
    architecture); exclude: drop these (e.g. the test dataset itself)."""
    K = pd.Series(K, dtype=float).dropna()
    names = [b for b in K.index if (candidates is None or b in set(candidates))
             and b not in set(exclude)]
    if not names:
        raise UserError("no candidate benchmark with a K to compare with")
    dist = (K[names] - float(k)).abs()
    return [b for b in names if dist[b] <= dist.min() + atol]


@dataclass
class Recommendation:
    strategy: str
    method: str | None                 # None when a tie leaves it open
    candidates: list                   # [(benchmark or 'mean', method, score)] considered best
    benchmarks: list                   # the benchmarks the choice was made from
    note: str = ""


def _mean_over(wga: pd.DataFrame, benchmarks: list[str]) -> pd.Series:
    sub = wga[benchmarks]
    complete = sub.dropna()
    if complete.empty:
        raise UserError("no method was run on all of " + ", ".join(benchmarks))
    return complete.mean(axis=1)


def recommend_method(wga: AccuracyTable, strategy: str, valid: Collection[str] | None = None,
                     K: ByBenchmark | None = None, query_k: float | None = None,
                     exclude: Collection[str] = (), arch: ByBenchmark | None = None,
                     query_arch: str | None = None) -> Recommendation:
    """Pick a method for a new dataset (section 5).

    wga: methods x benchmarks WG test accuracies. strategy: 'all' (best mean over all
    benchmarks), 'valid' (best mean over ``valid`` benchmarks), 'closest' (the best method of
    the valid benchmark whose K is closest to ``query_k``; with ``arch`` / ``query_arch`` only
    benchmarks of the query's architecture count). exclude: benchmarks to leave out (the
    query dataset itself in a leave-one-out test). Ties are reported in ``candidates`` and
    leave ``method`` None when they disagree.
    """
    wga = _wga_frame(wga)
    if strategy not in STRATEGIES:
        raise UserError(f"unknown strategy {strategy!r}; valid strategies: "
                        f"{', '.join(STRATEGIES)}")
    pool = [b for b in wga.columns if b not in set(exclude)]
    if strategy in ("valid", "closest"):
        if valid is None:
            raise UserError(f"strategy {strategy!r} needs the set of valid benchmarks")
        pool = [b for b in pool if b in set(valid)]
    if strategy == "closest":
        if K is None or query_k is None:
            raise UserError("strategy 'closest' needs K for the benchmarks and the query")
        if arch is not None and query_arch is not None:
            arch = pd.Series(arch)
            pool = [b for b in pool if arch.get(b) == query_arch]
        if not pool:
            return Recommendation(strategy, None, [], [],
                                  "no valid benchmark to compare with"
                                  + (f" for architecture {query_arch!r}" if query_arch else ""))
        closest = closest_benchmarks(query_k, K, candidates=pool)
        best = best_methods(wga[closest])
        cands = [(b, m, float(wga.loc[m, b])) for b in closest for m in best.get(b, [])]
        methods = sorted({m for _, m, _ in cands})
        note = ""
        if len(closest) > 1:
            note = f"K tie between {', '.join(closest)}"
        return Recommendation(strategy, methods[0] if len(methods) == 1 else None, cands,
                              closest, note)
    if not pool:
        raise UserError(f"no benchmark left for strategy {strategy!r}")
    means = _mean_over(wga, pool)
    top = [m for m, v in means.items() if abs(v - means.max()) <= _TIE_ATOL]
    cands = [("mean", m, float(means[m])) for m in top]
    return Recommendation(strategy, top[0] if len(top) == 1 else None, cands, pool,
                          "" if len(top) == 1 else f"tie between {', '.join(top)}")


def leave_one_out(wga: AccuracyTable, K: ByBenchmark, valid: Collection[str],
                  arch: ByBenchmark | None = None, test_datasets: Iterable[str] | None = None,
                  exclude_test: bool = True, scale: float = 100.0) -> pd.DataFrame:
    """Table 2: for each test dataset, the WG accuracy on it of the method each strategy picks
    (All / Valid / Closest), choosing from the other benchmarks (``exclude_test``; the paper
    leaves open whether its averages dropped the test dataset). Closest ties: every tied
    pick is listed and the accuracy is their mean. Accuracies in ``scale`` units.
    """
    wga = _wga_frame(wga)
    K = pd.Series(K, dtype=float)
    arch_s = None if arch is None else pd.Series(arch)
    tests = list(wga.columns) if test_datasets is None else list(test_datasets)
    rows = []
    for d in tests:
        if d not in wga.columns:
            raise UserError(f"test dataset {d!r} has no results")
        exclude = [d] if exclude_test else []
        row = {"dataset": d}
        for strategy in ("all", "valid"):
            try:
                rec = recommend_method(wga, strategy, valid=valid, exclude=exclude)
            except UserError:   # nothing left to average once the test dataset is out
                row[f"{strategy}_method"], row[f"{strategy}_acc"] = "", np.nan
                continue
            picks = [m for _, m, _ in rec.candidates]
            row[f"{strategy}_method"] = " | ".join(picks)
            row[f"{strategy}_acc"] = float(wga.loc[picks, d].mean() * scale)
        row.update(closest_benchmark="", closest_method="", closest_acc=np.nan,
                   closest_tie=False)
        if d in K.index and not np.isnan(K[d]):
            rec = recommend_method(wga, "closest", valid=valid, K=K, query_k=K[d],
                                   exclude=[d], arch=arch_s,
                                   query_arch=None if arch_s is None else arch_s.get(d))
            if rec.candidates:
                row["closest_benchmark"] = " | ".join(rec.benchmarks)
                row["closest_method"] = " | ".join(dict.fromkeys(m for _, m, _ in
                                                                 rec.candidates))
                row["closest_acc"] = float(np.mean([wga.loc[m, d] for _, m, _ in
                                                    rec.candidates]) * scale)
                row["closest_tie"] = len(rec.candidates) > 1
        rows.append(row)
    return pd.DataFrame(rows).set_index("dataset")


def strategy_win_counts(all_acc: ArrayLike, valid_acc: ArrayLike,
                        closest_acc: ArrayLike | None = None) -> dict[str, int]:
    """Table 2's claims: on how many test datasets Valid beats All, and on how many Closest is
    the best of the three (with ties counted as wins, and strictly). NaN Closest rows (no
    comparable benchmark) are left out of the Closest counts."""
    a = np.asarray(all_acc, dtype=float)
    v = np.asarray(valid_acc, dtype=float)
    if a.size == 0 or a.shape != v.shape:
        raise UserError("need equal-length, non-empty All and Valid accuracies")
    out = {"n": int(a.size), "valid_beats_all": int(np.sum(v > a)),
           "valid_ties_all": int(np.sum(v == a))}
    if closest_acc is not None:
        c = np.asarray(closest_acc, dtype=float)
        if c.shape != a.shape:
            raise UserError("Closest accuracies must have the same length as All")
        has = ~np.isnan(c)
        best_other = np.maximum(a, v)
        out.update(n_closest=int(has.sum()),
                   closest_best_with_ties=int(np.sum(has & (c >= best_other))),
                   closest_best_strict=int(np.sum(has & (c > best_other))))
    return out

