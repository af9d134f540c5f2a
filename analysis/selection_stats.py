"""How sure a leaderboard is: statistics over a sweep's model selection.

Four questions a reader of DomainBed-style tables asks (DomainBed issues #37, #89, #171:
reproduction gaps and variance), each answered from the records alone:

- **Rank stability**: resample the sweep (trials, and the hyperparameter draws inside each
  trial) with replacement, redo the selection, rank the algorithms by their average over
  datasets; report the probability of each rank and Kendall's tau between the resampled
  rankings and the ranking of the whole sweep.
- **Paired comparison with ERM**: per dataset, the differences between an algorithm and
  ERM on the same (trial, test environment) cells; Wilcoxon's signed-rank test, with the
  Benjamini-Hochberg correction over every (algorithm, dataset) comparison.
- **Selection regret**: the test-domain oracle's accuracy minus the method's, per algorithm
  and dataset (how much the method's validation costs).
- **Expected best accuracy** after k hyperparameter draws (Dodge et al. 2019, "Show Your
  Work: Improved Reporting of Experimental Results"): the expected test accuracy of the
  validation-best of k draws from the sweep's draws, with replacement, per algorithm.

Each function returns a pandas DataFrame; `stats_sections` gives them titled for
collect_results' ``--stats``.
"""
from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
from scipy.stats import false_discovery_control, kendalltau, wilcoxon

from domainbed.results import model_selection as ms
from oodutils.tables import render

Record = dict[str, Any]
BASELINE = "ERM"
TITLES = ("Rank stability", "Paired comparison with ERM", "Selection regret",
          "Expected best accuracy")


def candidate_table(records: list[Record], method: type[ms.SelectionMethod],
                    labels: dict | None = None) -> pd.DataFrame:
    """One row per (trial_seed, dataset, algorithm, test_env, hyperparameter setting)
    with the validation and test accuracy `method` gives that candidate (percent)."""
    table = ms.candidates(records, method, labels).with_columns(
        candidate=pl.int_range(pl.len()).over(ms.GROUP),
        val_acc=pl.col("val_acc") * 100, test_acc=pl.col("test_acc") * 100)
    columns = list(ms.GroupKey._fields) + ["candidate", "hparams_seed", "val_acc", "test_acc"]
    return pd.DataFrame(table.select(columns).to_dict(as_series=False), columns=columns)


def _best_test(val: np.ndarray, test: np.ndarray) -> float:
    """Test accuracy of the validation-best candidate (the first among equals)."""
    return float(test[int(np.argmax(val))])


def _cells(candidates: pd.DataFrame
           ) -> dict[tuple, dict[tuple, tuple[np.ndarray, np.ndarray]]]:
    """{(dataset, algorithm): [(val, test) arrays of one (trial, test_env) cell]} with the
    trial seed kept for pairing."""
    cells: dict[tuple, dict] = collections.defaultdict(dict)
    for (trial, dataset, algorithm, test_env), group in candidates.groupby(
            ["trial_seed", "dataset", "algorithm", "test_env"], sort=True):
        cells[(dataset, algorithm)][(trial, test_env)] = (
            group["val_acc"].to_numpy(), group["test_acc"].to_numpy())
    return cells


def _overall_scores(cells: dict, algorithms: list[str], datasets: list[str],
                    rng: np.random.Generator | None) -> np.ndarray:
    """Each algorithm's average over datasets of its mean selected test accuracy; with
    `rng`, over a bootstrap resample of trials (shared by the algorithms of a dataset)
    and of the candidates inside each cell."""
    scores = np.zeros(len(algorithms))
    for d in datasets:
        trials = sorted({t for a in algorithms for (t, _) in cells.get((d, a), {})})
        if rng is not None and trials:
            trials = list(rng.choice(trials, size=len(trials), replace=True))
        for i, a in enumerate(algorithms):
            accs = []
            for trial in trials:
                for (t, _env), (val, test) in cells.get((d, a), {}).items():
                    if t != trial:
                        continue
                    if rng is not None:
                        pick = rng.integers(0, len(val), size=len(val))
                        val, test = val[pick], test[pick]
                    accs.append(_best_test(val, test))
            scores[i] += np.mean(accs) if accs else np.nan
    return scores / max(len(datasets), 1)


def _ranking(scores: np.ndarray) -> np.ndarray:
    """Rank 1 = best; an algorithm without a score ranks last."""
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
    ranks = np.empty(len(scores), dtype=int)
    ranks[order] = np.arange(1, len(scores) + 1)
    return ranks


def rank_stability(candidates: pd.DataFrame, n_boot: int = 1000,
                   seed: int = 0) -> tuple[pd.DataFrame, dict[str, float]]:
    """(P(rank = r) per algorithm, one column per rank, plus the whole sweep's rank;
    Kendall's tau between resampled and whole-sweep rankings: mean and 2.5/97.5 %)."""
    cells = _cells(candidates)
    datasets = sorted({d for d, _ in cells})
    algorithms = sorted({a for _, a in cells})
    full = _ranking(_overall_scores(cells, algorithms, datasets, None))
    rng = np.random.default_rng(seed)
    counts = np.zeros((len(algorithms), len(algorithms)))
    taus = []
    for _ in range(n_boot):
        ranks = _ranking(_overall_scores(cells, algorithms, datasets, rng))
        counts[np.arange(len(algorithms)), ranks - 1] += 1
        if len(algorithms) > 1:
            tau = kendalltau(full, ranks).statistic
            taus.append(1.0 if np.isnan(tau) else float(tau))
    frame = pd.DataFrame(counts / n_boot, index=pd.Index(algorithms, name="algorithm"),
                         columns=[f"P(rank {r})" for r in range(1, len(algorithms) + 1)])
    frame.insert(0, "rank", full)
    frame = frame.sort_values("rank")
    tau = {"mean": float(np.mean(taus)) if taus else float("nan"),
           "low": float(np.percentile(taus, 2.5)) if taus else float("nan"),
           "high": float(np.percentile(taus, 97.5)) if taus else float("nan")}
    return frame, tau


def paired_comparison(selected: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per (algorithm, dataset): mean difference to `baseline` (points) on the
    (trial_seed, test_env) cells both have, the number of pairs, Wilcoxon's signed-rank
    p-value and the Benjamini-Hochberg adjusted p-value over all comparisons."""
    columns = ["algorithm", "dataset", "n_pairs", "mean_diff", "p_value", "p_adjusted"]
    cells = selected.set_index(["dataset", "algorithm", "trial_seed", "test_env"])["test_acc"]
    cells = cells.sort_index()  # sorted, so partial-key lookups need no lexsort warning
    rows = []
    for (dataset, algorithm), _ in selected.groupby(["dataset", "algorithm"], sort=True):
        if algorithm == baseline or (dataset, baseline) not in \
                selected.set_index(["dataset", "algorithm"]).index:
            continue
        mine, theirs = cells.loc[(dataset, algorithm)], cells.loc[(dataset, baseline)]
        common = mine.index.intersection(theirs.index)
        diff = 100 * (mine.loc[common].to_numpy() - theirs.loc[common].to_numpy())
        p = float("nan")
        if len(diff) and np.any(diff != 0):
            p = float(wilcoxon(diff).pvalue)
        elif len(diff):
            p = 1.0
        rows.append({"algorithm": algorithm, "dataset": dataset, "n_pairs": len(diff),
                     "mean_diff": float(np.mean(diff)) if len(diff) else float("nan"),
                     "p_value": p})
    frame = pd.DataFrame(rows, columns=columns[:-1])
    tested = frame["p_value"].notna()
    frame["p_adjusted"] = np.nan
    if tested.any():
        frame.loc[tested, "p_adjusted"] = false_discovery_control(
            frame.loc[tested, "p_value"].to_numpy())
    return frame[columns]


def selection_regret(records: list[Record], method: type[ms.SelectionMethod],
                     labels: dict | None = None) -> pd.DataFrame:
    """Oracle minus `method`, in points of test accuracy: rows algorithms, columns
    datasets (mean over trials and test environments) and their average."""
    mine = ms.select(records, method, labels)
    oracle = ms.select(records, ms.OracleSelectionMethod, labels)
    keys = list(ms.GroupKey._fields)
    both = mine.merge(oracle, on=keys, suffixes=("", "_oracle"))
    both["regret"] = 100 * (both["test_acc_oracle"] - both["test_acc"])
    table = both.pivot_table(index="algorithm", columns="dataset", values="regret",
                             aggfunc="mean")
    table["Avg"] = table.mean(axis=1)
    return table


def expected_best(val: Sequence[float], test: Sequence[float], k: int) -> float:
    """Expected test accuracy of the validation-best of k draws (with replacement) from
    the candidates (Dodge et al. 2019's expected validation performance, carried to the
    test accuracy of the chosen model): sum_i test_(i) [(i/N)^k - ((i-1)/N)^k], the
    candidates ordered by validation accuracy."""
    order = np.argsort(np.asarray(val, dtype=float), kind="stable")
    ranked_test = np.asarray(test, dtype=float)[order]
    n = len(ranked_test)
    i = np.arange(1, n + 1)
    weights = (i / n) ** k - ((i - 1) / n) ** k
    return float(np.dot(weights, ranked_test))


def expected_best_table(candidates: pd.DataFrame, ks: Sequence[int] | None = None
                        ) -> pd.DataFrame:
    """Rows (dataset, algorithm), one column per number of draws k (1, 2, 4, ... up to
    the most draws any cell has): the mean over trials and test environments."""
    most = int(candidates.groupby(list(ms.GroupKey._fields)).size().max()) \
        if len(candidates) else 1
    ks = list(ks or sorted({1, *[2 ** j for j in range(1, 12) if 2 ** j <= most], most}))
    rows = []
    for (dataset, algorithm), group in candidates.groupby(["dataset", "algorithm"],
                                                          sort=True):
        cells = [g for _, g in group.groupby(["trial_seed", "test_env"])]
        row = {"dataset": dataset, "algorithm": algorithm}
        for k in ks:
            row[f"k={k}"] = float(np.mean([expected_best(c["val_acc"], c["test_acc"], k)
                                           for c in cells]))
        rows.append(row)
    return pd.DataFrame(rows, columns=["dataset", "algorithm"] + [f"k={k}" for k in ks])


def applies_to(method: type[ms.SelectionMethod]) -> bool:
    """Whether the statistics apply: SubpopBench's selections have one row per run of the
    official splits, no trials or test environments to resample."""
    return not issubclass(method, ms.ValWorstGroupSelectionMethod)


def stats_tables(records: list[Record], method: type[ms.SelectionMethod], n_boot: int = 1000,
                 seed: int = 0) -> dict[str, Any]:
    """The four statistics under `method`: "rank_stability" (frame indexed by algorithm),
    "kendall_tau" (mean/low/high), "paired" (vs ERM), "regret" (frame indexed by algorithm),
    "expected_best" (frame), "n_boot"."""
    labels = ms.dataset_labels(records)
    candidates = candidate_table(records, method, labels)
    ranks, tau = rank_stability(candidates, n_boot=n_boot, seed=seed)
    return {"rank_stability": ranks, "kendall_tau": tau, "n_boot": n_boot,
            "paired": paired_comparison(ms.select(records, method, labels)),
            "regret": selection_regret(records, method, labels),
            "expected_best": expected_best_table(candidates)}


def stats_sections(records: list[Record], method: type[ms.SelectionMethod], n_boot: int = 1000,
                   seed: int = 0) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, table, note) for each of the four statistics under `method`."""
    tables = stats_tables(records, method, n_boot, seed)
    tau = tables["kendall_tau"]
    agreement = ("n/a (one algorithm)" if np.isnan(tau["mean"]) else
                 f"{tau['mean']:.2f} [{tau['low']:.2f}, {tau['high']:.2f}]")
    return [
        (f"Rank stability, model selection method: {method.name}",
         tables["rank_stability"].reset_index(),
         f"{n_boot} bootstrap resamples of trials and hyperparameter draws; Kendall's tau "
         f"with the whole-sweep ranking: {agreement}"),
        (f"Paired comparison with ERM, model selection method: {method.name}",
         tables["paired"],
         "mean difference in points on shared (trial, test environment) cells; Wilcoxon "
         "signed-rank p-value, Benjamini-Hochberg adjusted over all comparisons"),
        (f"Selection regret, model selection method: {method.name}",
         tables["regret"].reset_index(),
         "test-domain oracle minus this method, points of test accuracy"),
        (f"Expected best accuracy, model selection method: {method.name}",
         tables["expected_best"],
         "expected test accuracy of the validation-best of k hyperparameter draws "
         "(Dodge et al. 2019)"),
    ]


def render_stats(records: list[Record], methods: Sequence[type[ms.SelectionMethod]],
                 fmt: str = "text",
                 n_boot: int = 1000, seed: int = 0) -> str:
    """The four statistics for every method, each a titled table and its note, in `fmt`
    (text, markdown, latex, csv, html)."""
    parts = []
    for method in methods:
        if not applies_to(method):
            continue
        for title, table, note in stats_sections(records, method, n_boot, seed):
            if fmt == "csv":
                parts.append(f"# {title}\n" + render(table, "csv"))
            else:
                parts.append(render(table, fmt, digits=3 if "Paired" in title else 2,
                                    title=title) + f"({note})\n")
    return "\n".join(parts)
