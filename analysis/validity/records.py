"""The validity analysis of Bell et al. 2024 on run directories: the records adapter (the
command line is :mod:`analysis.validity.cli`).

Reads group-annotated records (``env{i}_{in,out}_acc_g{g}``, ``env{i}_{in,out}_wga``,
``args.group_names``) through ``domainbed.results.records`` and hands arrays to
``analysis.validity``.

A *benchmark* is a dataset (one label per data variant, as collect_results labels them) and,
where a dataset was run with several test environments, a test environment (``name/env1``).
A *method* is an algorithm. Per (benchmark, method, trial seed) the model is chosen as
collect_results' worst-group selection does: the checkpoint and hyperparameters with the best
mean worst-group accuracy on the training environments' ``out`` splits; its test numbers are
the test environment's ``in`` split. Datasets whose environments are official splits
(train/val/test, SubpopBench framing) use SubpopBench's selection instead (best worst-group
accuracy on ``val``) and are one benchmark each (their ``test`` environment). A method's
accuracy is the mean over trial seeds.

K comes from two reference runs per benchmark (ERM and a group-reweighted ERM, or GroupDRO),
trained with ``--save_logits`` by ``scripts/train_k_reference.py`` into their own directory
(``--k_dir``); each run's checkpoint is the one with the lowest validation NLL (training
environments, ``out`` split: "until validation loss convergence"), and K is computed on the
test environments' examples. Or pass K values as a CSV (``--k_csv``, columns benchmark,K).

    python -m analysis.validity report --input_dir sweep/ --k_dir kref/ --format markdown
    python -m analysis.validity compute-k --erm_run kref/Waterbirds/ERM_s0 \\
        --reference_run kref/Waterbirds/ReweightedERM_s0
    python -m analysis.validity recommend --input_dir sweep/ --k_dir kref/ \\
        --strategy closest --query_k 0.7
"""
from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.validity import stats as V
from analysis.validity.config import SPLIT_CODES
from domainbed.predictions import list_prediction_steps, load_predictions
from domainbed.results import grouping
from domainbed.results import model_selection as ms
from domainbed.results.records import Record, Records, load_records
from oodutils.csv_out import csv_value
from oodutils.errors import UserError

REFERENCE_ALGORITHMS = ("ReweightedERM", "GroupDRO")
_GROUP_KEY = re.compile(r"^env(\d+)_(in|out)_acc_g(\d+)$")

RecordsLike = Records | Iterable[Record]   # loaded records, or their list
Step = int | str                           # a step number, or "val_nll" / "last"


# ---------------------------------------------------------------------------------------------
# benchmarks and selected models
# ---------------------------------------------------------------------------------------------

def _records(records: RecordsLike) -> list[Record]:
    return list(getattr(records, "records", records))


def benchmark_names(records: RecordsLike) -> tuple[dict[tuple, str], dict]:
    """({(dataset label, test_env): benchmark name}, dataset labels) over every record
    given."""
    records = _records(records)
    labels = grouping.dataset_labels(records)
    envs = collections.defaultdict(set)
    for r in records:
        official = ms.official_split_envs(r)  # train/val/test datasets: the test env only
        for t in [official[1]] if official else r["args"].get("test_envs") or []:
            envs[grouping.dataset_label(r, labels)].add(t)
    return {(label, t): (label if len(ts) == 1 else f"{label}/env{t}")
            for label, ts in envs.items() for t in ts}, labels


def _has_groups(record: Record) -> bool:
    return any(_GROUP_KEY.match(k) for k in record)


def group_results(records: RecordsLike, names: Mapping[tuple, str] | None = None,
                  labels: dict | None = None) -> pd.DataFrame:
    """One row per (benchmark, method, trial seed, group) of the selected models.

    Columns: benchmark, method, trial_seed, test_env, run_dir, step, val_wga, test_wga, group,
    group_name, acc (the group's test accuracy, a fraction).
    """
    records = [r for r in _records(records) if _has_groups(r)]
    if not records:
        raise UserError("no group-annotated records (keys env{i}_{in,out}_acc_g{g}); the "
                        "validity analysis needs a dataset with groups")
    if names is None:
        names, labels = benchmark_names(records)
    by_step = {(r["run_dir"], r.get("step")): r for r in records}
    selected = pd.concat([ms.select(records, method, labels) for method in
                          (ms.WorstGroupSelectionMethod, ms.ValWorstGroupSelectionMethod)])
    if selected.empty:
        raise UserError("no model could be selected: records need single-test-env runs with "
                        "worst-group accuracies on the training environments' out splits")
    rows = []
    for sel in selected.itertuples(index=False):
        record = by_step[(sel.run_dir, sel.step)]
        t = sel.test_env
        group_names = record["args"].get("group_names") or []
        accs = {int(m.group(3)): v for k, v in record.items()
                if (m := _GROUP_KEY.match(k)) and int(m.group(1)) == t and m.group(2) == "in"}
        if not accs:
            raise UserError(f"run {sel.run_dir} has no per-group accuracies for its test "
                            f"environment {t} (env{t}_in_acc_g*)")
        V.check_accuracies(list(accs.values()), f"group accuracies in {sel.run_dir}")
        for g, acc in sorted(accs.items()):
            rows.append({"benchmark": names[(sel.dataset, t)], "method": sel.algorithm,
                         "trial_seed": sel.trial_seed, "test_env": t,
                         "run_dir": sel.run_dir, "step": sel.step, "val_wga": sel.val_acc,
                         "test_wga": sel.test_acc, "group": g,
                         "group_name": group_names[g] if g < len(group_names) else f"g{g}",
                         "acc": float(acc)})
    return pd.DataFrame(rows)


def wga_matrix(results: pd.DataFrame) -> pd.DataFrame:
    """methods x benchmarks: worst-group test accuracy, mean over trial seeds."""
    V._require_columns(results, ["benchmark", "method", "trial_seed", "test_wga"],
                       "the results table")
    per_seed = results.drop_duplicates(["benchmark", "method", "trial_seed"])
    return per_seed.pivot_table(index="method", columns="benchmark", values="test_wga",
                                aggfunc="mean")


def erm_group_accuracies(results: pd.DataFrame, benchmark: str, erm: str = "ERM"
                         ) -> pd.DataFrame:
    """seeds x groups of ERM's per-group test accuracy on one benchmark."""
    sub = results[(results["benchmark"] == benchmark) & (results["method"] == erm)]
    if sub.empty:
        found = sorted(results.loc[results["benchmark"] == benchmark, "method"].unique())
        raise UserError(f"ERM Failure needs {erm} runs on {benchmark}; methods found: "
                        f"{', '.join(found)} (choose with --erm_algorithm)")
    return sub.pivot_table(index="trial_seed", columns="group", values="acc")


# ---------------------------------------------------------------------------------------------
# K from saved logits
# ---------------------------------------------------------------------------------------------

def _run_args(run_dir: str, records: Sequence[Record] | None = None) -> dict[str, Any]:
    if records:
        for r in records:
            if r["run_dir"] == run_dir:
                return r["args"]
    recs = load_records(run_dir, require_done=False, quiet=True).records
    if not recs:
        raise UserError(f"{run_dir} holds no run records (results.jsonl)")
    return recs[0]["args"]


def _with_logits(run_dir: str, step: int) -> dict[str, np.ndarray]:
    pred = load_predictions(run_dir, step)
    if "logits" not in pred:
        raise UserError(f"predictions of {run_dir} step {step} have no logits; train with "
                        "--save_logits (scripts/train_k_reference.py does)")
    return pred


def choose_step(run_dir: str, test_envs: Iterable[int], how: Step = "val_nll") -> int:
    """The checkpoint of a K reference run: 'val_nll' (lowest NLL on the training
    environments' out split), 'last', or an int step."""
    steps = list_prediction_steps(run_dir)
    if not steps:
        raise UserError(f"{run_dir} has no saved predictions (predictions/step_*.npz)")
    if how == "last":
        return steps[-1]
    if not isinstance(how, str):
        if int(how) not in steps:
            raise UserError(f"{run_dir} has no predictions for step {how}; steps: "
                            f"{', '.join(map(str, steps))}")
        return int(how)
    if how != "val_nll":
        raise UserError(f"unknown step choice {how!r}; use val_nll, last or a step number")
    best: tuple[float, int] | None = None
    for step in steps:
        pred = _with_logits(run_dir, step)
        val = ~np.isin(pred["env"], list(test_envs)) & (pred["split"] == SPLIT_CODES["out"])
        if not val.any():
            raise UserError(f"{run_dir} has no validation examples (training environments' "
                            "out split) to pick a checkpoint by; use --k_step last")
        nll = -V.log_likelihood(pred["logits"][val], pred["label"][val]).mean()
        if best is None or nll < best[0]:
            best = (nll, step)
    assert best is not None   # steps is not empty
    return best[1]


def compute_k(erm_run: str, reference_run: str, step: Step = "val_nll",
              worst_group: int | str = "erm_lowest_acc", reduction: str = "mean",
              test_splits: Sequence[str] = ("in", "out"),
              records: Sequence[Record] | None = None) -> dict[str, Any]:
    """K between two runs on their test environments' examples (aligned by example id).
    Returns a dict: k, worst_group, worst_group_name, n, erm_step, reference_step."""
    args_erm, args_ref = _run_args(erm_run, records), _run_args(reference_run, records)
    for key in ("dataset", "test_envs", "data_fingerprint"):
        if args_erm.get(key) != args_ref.get(key):
            raise UserError(f"the two K runs differ in {key}: {args_erm.get(key)!r} vs "
                            f"{args_ref.get(key)!r}")
    test_envs = list(args_erm.get("test_envs") or [])
    codes = [SPLIT_CODES[s] for s in test_splits]
    preds = []
    for run in (erm_run, reference_run):
        chosen = choose_step(run, test_envs, step)
        p = _with_logits(run, chosen)
        keep = np.isin(p["env"], test_envs) & np.isin(p["split"], codes)
        if not keep.any():
            raise UserError(f"{run} has no test examples (environments {test_envs}, "
                            f"splits {', '.join(test_splits)})")
        order = np.argsort(p["id"][keep], kind="stable")
        preds.append(({k: v[keep][order] for k, v in p.items()}, chosen))
    (erm, erm_step), (ref, ref_step) = preds
    if not np.array_equal(erm["id"], ref["id"]):
        common, ie, ir = np.intersect1d(erm["id"], ref["id"], return_indices=True)
        if common.size == 0:
            raise UserError("the two K runs share no test examples (different data?)")
        erm = {k: v[ie] for k, v in erm.items()}
        ref = {k: v[ir] for k, v in ref.items()}
    res = V.bayes_factor_k(ref["logits"], erm["logits"], erm["label"], erm["group"],
                           worst_group=worst_group, reduction=reduction)
    group_names = args_erm.get("group_names") or []
    g = res.worst_group
    return {"k": res.k, "worst_group": g,
            "worst_group_name": group_names[g] if g < len(group_names) else f"g{g}",
            "n": res.n, "erm_group_acc": res.erm_group_accuracy[g],
            "erm_step": erm_step, "reference_step": ref_step}


def k_from_records(k_records: RecordsLike, names: Mapping[tuple, str], labels: dict,
                   reference: str | None = None, erm: str = "ERM", **kwargs: Any
                   ) -> pd.DataFrame:
    """One row per (benchmark, trial seed) of the K reference runs: benchmark, trial_seed,
    reference, k, worst_group, worst_group_name, n, erm_step, reference_step."""
    k_list = _records(k_records)
    # (benchmark, trial_seed) -> {algorithm: run_dir}
    runs: dict[tuple, dict[str, str]] = collections.defaultdict(dict)
    for r in k_list:
        args = r["args"]
        t = (args.get("test_envs") or [None])[0]
        key = (names.get((grouping.dataset_label(r, labels), t)), args.get("trial_seed"))
        known = runs[key].get(args.get("algorithm"))
        if known is not None and known != r["run_dir"]:
            raise UserError(f"two {args.get('algorithm')} runs for {key[0]} trial seed "
                            f"{key[1]} in the K directory: {known} and {r['run_dir']}")
        runs[key][args.get("algorithm")] = r["run_dir"]
    if not runs:
        raise UserError("no K reference runs found")
    algos = {a for v in runs.values() for a in v}
    if reference is None:
        reference = next((a for a in REFERENCE_ALGORITHMS if a in algos), None)
        if reference is None:
            raise UserError("no reference runs for K (algorithms found: "
                            f"{', '.join(sorted(map(str, algos)))}; expected one of "
                            f"{', '.join(REFERENCE_ALGORITHMS)} or pass --reference)")
    rows = []
    for (bench, seed), algs in sorted(runs.items(), key=lambda kv: str(kv[0])):
        if erm not in algs or reference not in algs:
            continue
        out = compute_k(algs[erm], algs[reference], records=k_list, **kwargs)
        rows.append({"benchmark": bench, "trial_seed": seed, "reference": reference, **out})
    if not rows:
        raise UserError(f"no benchmark has both {erm} and {reference} K reference runs")
    return pd.DataFrame(rows)


def read_k_csv(path: str | os.PathLike[str]) -> pd.Series:
    """K per benchmark from a CSV with the columns benchmark and K."""
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read K table {path}: {e}") from None
    V._require_columns(df, ["benchmark", "K"], f"K table {path}")
    df["benchmark"] = df["benchmark"].map(csv_value)   # as `compute-k --format csv` wrote
    if df["K"].isna().any() or not np.isfinite(df["K"].astype(float)).all():
        raise UserError(f"K table {path} has missing or non-finite K values")
    return df.set_index("benchmark")["K"].astype(float)


# ---------------------------------------------------------------------------------------------
# mutual information, report
# ---------------------------------------------------------------------------------------------

def mutual_information_of(results: pd.DataFrame, benchmark: str
                          ) -> tuple[float | None, str]:
    """I(Y; A) on the training environments of a benchmark, from a selected run's saved
    predictions (group = y * |A| + a); None when it cannot be computed (reason in the note)."""
    run = results.loc[results["benchmark"] == benchmark, "run_dir"].iloc[0]
    steps = list_prediction_steps(run)
    if not steps:
        return None, "no saved predictions"
    args = _run_args(run)
    p = load_predictions(run, steps[-1])
    train = ~np.isin(p["env"], args.get("test_envs") or []) & (p["group"] >= 0)
    try:
        a = V.attributes_from_groups(p["group"][train], p["label"][train],
                                     len(args.get("group_names") or []),
                                     args.get("num_classes") or 0)
    except UserError as e:
        return None, str(e)
    return V.mutual_information(p["label"][train], a), ""


def validity_report(results: pd.DataFrame, K: Mapping[str, float] | pd.Series | None = None,
                    thresholds: Mapping[str, float] | None = None, erm: str = "ERM",
                    ddof: int = 1, with_mi: bool = True, min_pairs: int = 3
                    ) -> pd.DataFrame:
    """Table 1: per benchmark K, I(Y;A), ERM Failure, Discriminative Power, Convergent
    Validity (with its R^2), best method and its WG test accuracy, pass flags, valid.
    ``K``: benchmark -> K (or None). Notes on what could not be computed in ``.attrs``."""
    wga = wga_matrix(results)
    k_of = pd.Series(dtype=float) if K is None else pd.Series(K, dtype=float)
    notes, rows = [], []
    thr = {**V.DEFAULT_THRESHOLDS, **(thresholds or {})}
    for b in wga.columns:
        methods = wga[b].dropna()
        best = V.best_methods(wga[[b]])[b]
        row = {"benchmark": b, "K": k_of.get(b, np.nan), "mi": np.nan,
               "erm_failure": V.erm_failure(erm_group_accuracies(results, b, erm), ddof),
               "disc_power": np.nan, "n_methods": len(methods),
               "best_method": " = ".join(best), "best_wga": 100 * float(methods.max())}
        if len(methods) < 2:
            raise UserError(f"Discriminative Power needs at least 2 methods on {b}; found "
                            f"only {', '.join(methods.index)}")
        row["disc_power"] = V.discriminative_power(methods.to_numpy(), ddof)
        if with_mi:
            mi, why = mutual_information_of(results, b)
            if mi is None:
                notes.append(f"I(Y;A) of {b}: {why}")
            else:
                row["mi"] = mi
        rows.append(row)
    table = pd.DataFrame(rows).set_index("benchmark")
    passing = [b for b in table.index if table.loc[b, "erm_failure"] >= thr["erm_failure"]
               and table.loc[b, "disc_power"] >= thr["disc_power"]]
    with_k = [b for b in table.index if b in k_of.index and not np.isnan(k_of[b])]
    table["conv_validity"], table["cv_r2"], table["cv_pairs"] = np.nan, np.nan, 0
    if with_k:
        cv = V.convergent_validity(wga, k_of[with_k], benchmarks=with_k,
                                   pool=[b for b in passing if b in with_k],
                                   min_pairs=min_pairs)
        table.loc[cv.index, "conv_validity"] = cv["conv_validity"]
        table.loc[cv.index, "cv_r2"] = cv["r2"]
        table.loc[cv.index, "cv_pairs"] = cv["n_pairs"]
    missing_k = [b for b in table.index if b not in with_k]
    if missing_k:
        notes.append(f"no K for {', '.join(missing_k)}: Convergent Validity not computed")
    short = [b for b in with_k if np.isnan(table.loc[b, "conv_validity"])]
    if short:
        notes.append(f"Convergent Validity needs >= {min_pairs} comparison benchmarks "
                     f"(passing ERM Failure and Discriminative Power, with K and enough "
                     f"shared methods; see --cv_min_pairs): too few for {', '.join(short)}")
    out = V.validity_table(table, thr)
    out.attrs["notes"] = notes
    return out
