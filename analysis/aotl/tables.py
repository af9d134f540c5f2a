"""Accuracy on the line (Salaudeen et al. 2025, "Are Domain Generalization Benchmarks with
Accuracy on the Line Misspecified?").

For each leave-one-domain-out split, fit a line between the ID and the OOD accuracies of
many classifiers on a probit scale, ``scipy.stats.linregress(probit(ID), probit(OOD))``
with ``probit(a) = Phi^-1(clip(a, 0.01, 0.99))``, and call the split well-specified when
the correlation is weak or negative (R < 0.3). Tables:

- ``per-ood``: x = mean accuracy over the ID environments (all by default; ``--id_envs``
  chooses the set, always without the OOD environment; the paper's 4+-environment tables
  use ``--id_envs 0 1 2``), y = OOD accuracy.
- ``pairwise``: x = accuracy on one ID environment, for each ID environment.
- ``group-average`` / ``group-pairwise``: OOD group accuracy against the mean ID accuracy or
  an ID group's accuracy (datasets with groups; the paper's Waterbirds tables).
- ``regime``: separate fits below / above an ID-accuracy threshold.
- ``changepoints``: PELT change points of a piecewise-linear fit on the sorted scatter.
- ``n-classifiers``: the paper's Table 3 heuristic (how many classifiers until R is stable).

Command line::

    python -m analysis.aotl PATH [PATH ...] --table pairwise|per-ood [--id_envs 0 1 2]
        [--clip 0.01] [--format text|markdown|latex|csv|html] [--plot DIR] ...

PATH: a sweep directory (read with ``domainbed.results.records``) or accuracy CSV files (plain or
.gz; or directories of them) in the schema of ``tests/data/aotl_reference``.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis import plots
from analysis.aotl.inputs import (
    Accuracies,
    acc_col,
    export_csv,
    load_accuracies,
    read_accuracy_csvs,
    warn,
)
from analysis.aotl.options import RESAMPLE
from analysis.aotl.stats import (
    SCALES,
    VERDICTS,
    bootstrap_r,
    changepoints,
    classifier_count,
    classify,
    fit_line,
    fit_warning,
    inverse_transform,
    logit,
    probit,
    transform,
)
from oodutils import tables as report
from oodutils.accuracy import AOTL_CLIP
from oodutils.cli import check_outputs, configure_logging, echo
from oodutils.errors import UnknownNameError, UserError
from oodutils.fileio import file_name_part
from oodutils.log import get_logger

if TYPE_CHECKING:
    import argparse

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

logger = get_logger(__name__)

FIT_COLUMNS = ["n", "slope", "intercept", "r", "r2", "p", "stderr", "intercept_stderr",
               "spearman"]

__all__ = ["SCALES", "VERDICTS", "transform", "inverse_transform", "probit", "logit",
           "fit_line", "bootstrap_r", "classify", "per_ood_table", "effective_robustness_table",
           "pairwise_table",
           "group_table", "regime_table", "changepoint_table", "changepoints",
           "classifier_count", "classifier_count_table", "plot_split", "load_accuracies",
           "read_accuracy_csvs", "run"]


# ---------------------------------------------------------------------------- tables

def _ordered_splits(acc: Accuracies) -> list[tuple[str, int]]:
    order = {d: i for i, d in enumerate(acc.datasets())}
    return sorted(acc.splits(), key=lambda de: (order[de[0]], de[1]))


def _id_envs_for(acc: Accuracies, dataset: str, ood: int, id_envs: Sequence[int] | None
                 ) -> list[int]:
    envs = acc.envs(dataset)
    if id_envs is None:
        return [e for e in envs if e != ood]
    missing = [e for e in id_envs if e not in envs]
    if missing:
        raise UserError(f"--id_envs {' '.join(map(str, missing))}: no such environment in "
                        f"{dataset} (environments: {' '.join(map(str, envs))})")
    return [e for e in dict.fromkeys(id_envs) if e != ood]


def _split_frame(acc: Accuracies, dataset: str, ood: int, cols: list[str]) -> pd.DataFrame:
    sub = acc.subset(dataset, ood)
    missing = [c for c in cols if c not in sub]
    if missing:
        raise UserError(f"{dataset}, OOD env {ood}: no accuracies for "
                        f"{', '.join(c.replace('acc', 'env') for c in missing)} (a split "
                        f"the runs did not evaluate, see --eval_splits, cannot be fitted)")
    ok = sub[cols].notna().all(axis=1)
    if not ok.all():
        acc.notice(f"{dataset}, OOD env {ood}: left out {int((~ok).sum())} classifier(s) "
                   "with missing accuracies")
    return sub[ok]


def _fit_row(meta: dict[str, Any], x: np.ndarray, y: np.ndarray, runs: np.ndarray,
             opts: dict[str, Any], where: str) -> dict[str, Any]:
    row = dict(meta)
    row.update(fit_line(x, y, opts["scale"], opts["clip"], where))
    row["verdict"], row["well_specified"] = classify(row["r"], opts["threshold"])
    warning = fit_warning(len(x), len(set(np.asarray(runs).tolist())))
    if warning:
        row["warning"] = warning
    if opts["n_boot"]:
        tx, ty = transform(x, opts["scale"], opts["clip"]), transform(y, opts["scale"],
                                                                      opts["clip"])
        groups = runs if opts["resample"] == "runs" else None
        row["r_ci_low"], row["r_ci_high"] = bootstrap_r(tx, ty, groups, opts["n_boot"],
                                                        opts["ci"], opts["seed"])
    return row


def _options(scale: str = "probit", clip: float = AOTL_CLIP, threshold: float = 0.3,
             n_boot: int = 0, resample: str = "runs", ci: float = 0.95, seed: int = 0
             ) -> dict[str, Any]:
    if resample not in RESAMPLE:
        raise UnknownNameError("resampling unit", resample, RESAMPLE)
    transform([0.5], scale, clip)
    classify(0.0, threshold)
    if n_boot < 0 or not (0 < ci < 1):
        raise UserError("--bootstrap must be >= 0 and --ci in (0, 1)")
    return dict(scale=scale, clip=clip, threshold=threshold, n_boot=n_boot,
                resample=resample, ci=ci, seed=seed)


def _table(rows: list[dict[str, Any]], what: str) -> pd.DataFrame:
    if not rows:
        raise UserError(f"no {what} could be computed from the input")
    df = pd.DataFrame(rows)
    if "warning" in df:   # only where some fit has too few points: "" for the others
        df["warning"] = df["warning"].fillna("")
    return df


def per_ood_table(acc: Accuracies, id_envs: Sequence[int] | None = None,
                  **options: Any) -> pd.DataFrame:
    """One fit per leave-one-domain-out split: mean ID accuracy vs OOD accuracy."""
    opts = _options(**options)
    rows = []
    for dataset, ood, ids, sub, x, y in _mean_id_splits(acc, id_envs):
        meta = {"dataset": dataset, "ood_env": ood, "id_envs": " ".join(map(str, ids))}
        rows.append(_fit_row(meta, x, y, sub["run"].to_numpy(), opts,
                             f"{dataset}, OOD env {ood}"))
    return _table(rows, "per-OOD fit")


def _mean_id_splits(acc: Accuracies, id_envs: Sequence[int] | None,
                    notice: bool = True) -> Any:
    """(dataset, OOD env, ID envs, rows, mean ID accuracy, OOD accuracy) per split with an
    ID environment left (a split without one is skipped, with a notice where asked)."""
    for dataset, ood in _ordered_splits(acc):
        ids = _id_envs_for(acc, dataset, ood, id_envs)
        if not ids:
            if notice:
                acc.notice(f"{dataset}, OOD env {ood}: no ID environment left; skipped")
            continue
        sub = _split_frame(acc, dataset, ood, [acc_col(e) for e in ids] + [acc_col(ood)])
        x = sub[[acc_col(e) for e in ids]].to_numpy().mean(axis=1)
        yield dataset, ood, ids, sub, x, sub[acc_col(ood)].to_numpy()


def effective_robustness_table(acc: Accuracies, id_envs: Sequence[int] | None = None,
                               **options: Any) -> pd.DataFrame:
    """Each classifier's effective robustness (Taori et al. 2020, "Measuring Robustness to
    Natural Distribution Shifts in Image Classification"): its OOD accuracy above (+) or
    below (-) the split's accuracy-on-the-line fit of OOD on mean ID accuracy, fitted on
    the chosen scale (probit by default). Columns: the residual on that scale (`er`) with
    the standard error of the fitted line at the classifier's ID accuracy (`er_stderr`),
    the classifier's checkpoint (`run`, `step`: None for accuracy CSVs without steps),
    and the same in accuracy points (`effective_robustness` = OOD accuracy minus the
    line's prediction, in percent)."""
    opts = _options(**options)
    rows = []
    for dataset, ood, _ids, sub, x, y in _mean_id_splits(acc, id_envs):
        fit = fit_line(x, y, opts["scale"], opts["clip"], f"{dataset}, OOD env {ood}")
        tx, ty = transform(x, opts["scale"], opts["clip"]), transform(y, opts["scale"],
                                                                      opts["clip"])
        predicted = fit["slope"] * tx + fit["intercept"]
        residual_sd = np.sqrt(np.sum((ty - predicted) ** 2) / max(len(tx) - 2, 1))
        leverage = 1 / len(tx) + (tx - tx.mean()) ** 2 / np.sum((tx - tx.mean()) ** 2)
        for i, run in enumerate(sub["run"].to_numpy()):
            rows.append({"dataset": dataset, "ood_env": ood, "run": run,
                         "step": sub["step"].iloc[i] if "step" in sub else None,
                         "id_acc": float(x[i]), "ood_acc": float(y[i]),
                         "predicted_ood_acc": float(inverse_transform(predicted[i],
                                                                      opts["scale"])),
                         "effective_robustness": float(100 * (
                             y[i] - inverse_transform(predicted[i], opts["scale"]))),
                         "er": float(ty[i] - predicted[i]),
                         "er_stderr": float(residual_sd * np.sqrt(leverage[i]))})
    return _table(rows, "effective robustness")


def pairwise_table(acc: Accuracies, id_envs: Sequence[int] | None = None,
                   **options: Any) -> pd.DataFrame:
    """One fit per (OOD env, ID env): accuracy on that ID env vs OOD accuracy."""
    opts = _options(**options)
    rows = []
    for dataset, ood in _ordered_splits(acc):
        ids = _id_envs_for(acc, dataset, ood, id_envs)
        if not ids:
            acc.notice(f"{dataset}, OOD env {ood}: no ID environment left; skipped")
        for e in ids:
            sub = _split_frame(acc, dataset, ood, [acc_col(e), acc_col(ood)])
            meta = {"dataset": dataset, "ood_env": ood, "id_envs": str(e)}
            rows.append(_fit_row(meta, sub[acc_col(e)].to_numpy(),
                                 sub[acc_col(ood)].to_numpy(), sub["run"].to_numpy(), opts,
                                 f"{dataset}, OOD env {ood} <- ID env {e}"))
    return _table(rows, "pairwise fit")


def group_table(acc: Accuracies, mode: str = "average", id_envs: Sequence[int] | None = None,
                **options: Any) -> pd.DataFrame:
    """Group-level lines (paper Tables 25/26): OOD group accuracy against the mean ID
    accuracy (``mode="average"``) or against each ID group's accuracy (``"pairwise"``)."""
    if mode not in ("average", "pairwise"):
        raise UnknownNameError("group mode", mode, ("average", "pairwise"))
    opts = _options(**options)
    rows = []
    for dataset, ood in _ordered_splits(acc):
        groups = acc.groups(dataset)
        if not groups:
            continue
        ids = _id_envs_for(acc, dataset, ood, id_envs)
        sub_all = acc.subset(dataset, ood)
        for g in groups:
            ycol = acc_col(ood, g)
            if ycol not in sub_all:
                continue
            if mode == "average":
                xs = [("avg", [acc_col(e) for e in ids], " ".join(map(str, ids)))]
            else:
                xs = [(acc.group_label(dataset, h), [acc_col(e, h)], str(e))
                      for e in ids for h in groups if acc_col(e, h) in sub_all]
            for id_group, xcols, id_label in xs:
                if not xcols:
                    continue
                sub = _split_frame(acc, dataset, ood, xcols + [ycol])
                meta = {"dataset": dataset, "ood_env": ood,
                        "ood_group": acc.group_label(dataset, g), "id_envs": id_label,
                        "id_group": id_group}
                rows.append(_fit_row(meta, sub[xcols].to_numpy().mean(axis=1),
                                     sub[ycol].to_numpy(), sub["run"].to_numpy(), opts,
                                     f"{dataset}, OOD env {ood} group {g} <- {id_group}"))
    if not rows:
        raise UserError("no per-group accuracies in the input (env{i}_out_acc_g{g} record "
                        "keys); group tables need a sweep of a dataset with groups")
    return pd.DataFrame(rows)


def regime_table(acc: Accuracies, id_envs: Sequence[int] | None = None, acc_threshold: float = 0.9,
                 **options: Any) -> pd.DataFrame:
    """Separate fits for classifiers below / at-or-above an ID accuracy threshold (the paper
    notes Camelyon's high-accuracy classifiers show a negative trend)."""
    opts = _options(**options)
    rows = []
    for dataset, ood, ids, sub, x, y in _mean_id_splits(acc, id_envs, notice=False):
        runs = sub["run"].to_numpy()
        for name, keep in ((f"id < {acc_threshold:g}", x < acc_threshold),
                           (f"id >= {acc_threshold:g}", x >= acc_threshold)):
            meta = {"dataset": dataset, "ood_env": ood, "id_envs": " ".join(map(str, ids)),
                    "regime": name}
            try:
                rows.append(_fit_row(meta, x[keep], y[keep], runs[keep], opts,
                                     f"{dataset}, OOD env {ood}, {name}"))
            except UserError as e:
                acc.notice(f"{e}; regime skipped")
    return _table(rows, "regime fit")


def changepoint_table(acc: Accuracies, id_envs: Sequence[int] | None = None,
                      pen: float | None = None, min_size: int | None = None,
                      jump: int | None = None,
                      **options: Any) -> pd.DataFrame:
    """Segments of the mean-ID vs OOD scatter found by PELT, each with its own fit. The
    paper found change-point detection noise-sensitive: look at the plots too."""
    opts = _options(**options)
    rows = []
    for dataset, ood, ids, sub, x, y in _mean_id_splits(acc, id_envs, notice=False):
        runs = sub["run"].to_numpy()
        tx, ty = transform(x, opts["scale"], opts["clip"]), transform(y, opts["scale"],
                                                                      opts["clip"])
        order, ends, used_pen = changepoints(tx, ty, pen, min_size, jump)
        start = 0
        for k, end in enumerate(ends):
            sel = order[start:end]
            meta = {"dataset": dataset, "ood_env": ood, "id_envs": " ".join(map(str, ids)),
                    "segment": k, "id_acc_from": float(x[sel].min()),
                    "id_acc_to": float(x[sel].max())}
            try:
                row = _fit_row(meta, x[sel], y[sel], runs[sel], opts,
                               f"{dataset}, OOD env {ood}, segment {k}")
                row["pen"] = used_pen
                rows.append(row)
            except UserError as e:
                acc.notice(f"{e}; segment skipped")
            start = end
    return _table(rows, "segment fit")


def classifier_count_table(acc: Accuracies, id_envs: Sequence[int] | None = None,
                           pooled: bool = True, n_boot: int = 1000, conf: float = 0.95,
                           tol: float = 0.01,
                           step: int = 100, start: int = 10, resample: str = "models",
                           scale: str = "probit", clip: float = AOTL_CLIP, seed: int = 0
                           ) -> pd.DataFrame:
    """Table-3 style: minimum number of classifiers for a stable R, per split.

    ``pooled`` (the paper's Table 3): every (classifier, ID env) row is a point, x its ID
    env accuracy, so the totals count models x ID environments; otherwise x is the mean ID
    accuracy. ``resample="runs"`` draws whole runs instead of single rows.
    """
    if resample not in RESAMPLE:
        raise UnknownNameError("resampling unit", resample, RESAMPLE)
    rows = []
    for dataset, ood in _ordered_splits(acc):
        ids = _id_envs_for(acc, dataset, ood, id_envs)
        if not ids:
            continue
        sub = _split_frame(acc, dataset, ood, [acc_col(e) for e in ids] + [acc_col(ood)])
        if pooled:
            x = np.concatenate([sub[acc_col(e)].to_numpy() for e in ids])
            y = np.tile(sub[acc_col(ood)].to_numpy(), len(ids))
            runs = np.tile(sub["run"].to_numpy(), len(ids))
        else:
            x = sub[[acc_col(e) for e in ids]].to_numpy().mean(axis=1)
            y, runs = sub[acc_col(ood)].to_numpy(), sub["run"].to_numpy()
        fit = fit_line(x, y, scale, clip, f"{dataset}, OOD env {ood}")
        tx, ty = transform(x, scale, clip), transform(y, scale, clip)
        groups = runs if resample == "runs" else None
        k, total = classifier_count(tx, ty, groups, n_boot, conf, tol, step, start, seed)
        if k is None:
            acc.notice(f"{dataset}, OOD env {ood}: R did not stabilise within {total} "
                       f"{'runs' if groups is not None else 'classifiers'}")
        rows.append({"dataset": dataset, "ood_env": ood, "id_envs": " ".join(map(str, ids)),
                     "r": fit["r"], "min_samples": k, "total_samples": total,
                     "unit": "runs" if groups is not None else
                     ("rows" if pooled else "classifiers"), "converged": k is not None})
    df = _table(rows, "classifier count")
    df["min_samples"] = df["min_samples"].astype("Int64")
    return df


# ---------------------------------------------------------------------------- plots

def plot_split(acc: Accuracies, dataset: str, ood: int, path: str | Path | None = None,
               id_envs: Sequence[int] | None = None, scale: str = "probit", clip: float = AOTL_CLIP,
               ax: Axes | None = None) -> Figure:
    """Probit-axis scatter of one split: per-ID-env points and fit lines, the overall fit
    (mean ID accuracy), y = x; slope and R in the legend. Drawn on ``ax`` if given, saved
    as PNG to ``path`` if given; returns the matplotlib Figure."""
    ids = _id_envs_for(acc, dataset, ood, id_envs)
    sub = _split_frame(acc, dataset, ood, [acc_col(e) for e in ids] + [acc_col(ood)])
    y = sub[acc_col(ood)].to_numpy()
    names = acc.env_names.get(dataset) or []
    series = []
    for e in ids:
        fit = fit_line(sub[acc_col(e)].to_numpy(), y, scale, clip, f"{dataset} {ood}<-{e}")
        label = f"ID env {e}" + (f" ({names[e]})" if e < len(names) else "")
        series.append((label, sub[acc_col(e)].to_numpy(), y, fit))
    x = sub[[acc_col(e) for e in ids]].to_numpy().mean(axis=1)
    overall = fit_line(x, y, scale, clip, f"{dataset} {ood}")
    title = f"{dataset}: OOD env {ood}" + (f" ({names[ood]})" if ood < len(names) else "")
    return plots.aotl_scatter(series, ("mean ID", x, y, overall), path, scale=scale,
                              clip=clip, title=title, transform=transform, ax=ax)


# ---------------------------------------------------------------------------- CLI

def make_table(acc: Accuracies, args: argparse.Namespace) -> pd.DataFrame:
    common = dict(scale=args.scale, clip=args.clip)
    fit_opts = dict(common, threshold=args.threshold, n_boot=args.bootstrap,
                    resample=args.resample or "runs", ci=args.ci, seed=args.seed)
    table = args.table or "per-ood"
    if table == "per-ood":
        return per_ood_table(acc, args.id_envs, **fit_opts)
    if table == "pairwise":
        return pairwise_table(acc, args.id_envs, **fit_opts)
    if table == "effective-robustness":
        return effective_robustness_table(acc, args.id_envs, **fit_opts)
    if table in ("group-average", "group-pairwise"):
        return group_table(acc, table.split("-")[1], args.id_envs, **fit_opts)
    if table == "regime":
        return regime_table(acc, args.id_envs, args.acc_threshold, **fit_opts)
    if table == "changepoints":
        return changepoint_table(acc, args.id_envs, args.pen, args.min_size, **fit_opts)
    return classifier_count_table(acc, args.id_envs, pooled=not args.mean_id,
                                  n_boot=args.bootstrap or 1000, conf=args.ci, tol=args.tol,
                                  step=args.step, resample=args.resample or "models",
                                  seed=args.seed, **common)


def run(args: argparse.Namespace) -> int:
    """The aotl command on parsed arguments: tables, exports and plots."""
    configure_logging(args)
    check_outputs((args.output, "--output", False), (args.plot, "--plot", True),
                  (args.export_csv, "--export_csv", True))
    acc = load_accuracies(args.paths, split=args.split, checkpoints=args.checkpoints,
                          algorithms=args.algorithms)
    if args.export_csv is not None:
        written = export_csv(acc, args.export_csv, args.split)
        logger.info(f"wrote {len(written)} accuracy CSV file(s) under {args.export_csv}")
    if args.export_csv is None or args.table is not None:
        df = make_table(acc, args)
        warned = _fit_warnings(df)
        if warned:   # each is in the table's warning column: one line here, not a repeat
            logger.warning(f"warning: {len(warned)} of {len(df)} fit(s) have too few points "
                           f"to mean much; see the warning column of the table"
                           f"{f' in {args.output}' if args.output else ''}")
        if args.output:
            report.write(df, args.output, args.format, args.digits)
        else:
            echo(report.render(df, args.format or "text", args.digits), end="")
    if args.plot is not None:
        for dataset, ood in _ordered_splits(acc):
            plot_split(acc, dataset, ood, args.plot / f"{file_name_part(dataset)}_env{ood}.png",
                       args.id_envs, args.scale, args.clip)
    sys.stdout.flush()
    for message in dict.fromkeys(acc.notices):
        warn(message)
    return 0


def _fit_warnings(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(which fit, why it means little) for each row of a table with a warning."""
    if "warning" not in df:
        return []
    keys = [c for c in ("dataset", "ood_env", "id_envs") if c in df]
    return [(", ".join(f"{k} {row[k]}" for k in keys), row["warning"])
            for _, row in df.iterrows() if row["warning"]]

