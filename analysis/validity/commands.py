"""The work of the `benchmark-validity` subcommands on parsed arguments: records read,
tables computed with `analysis.validity.stats`, written or printed."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.validity import stats as V
from analysis.validity.config import SPLIT_CODES
from analysis.validity.records import (
    benchmark_names,
    compute_k,
    group_results,
    k_from_records,
    read_k_csv,
    validity_report,
    wga_matrix,
)
from domainbed.results.records import TABLE_FIELDS, load_records
from oodutils import tables as report
from oodutils.cli import echo
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_text

REPORT_COLUMNS = {"K": "K", "mi": "I(Y;A)", "erm_failure": "ERM Fail.",
                  "disc_power": "Disc. Power", "conv_validity": "Conv. Validity",
                  "cv_r2": "CV R^2", "best_method": "Method", "best_wga": "WG test acc.",
                  "pass_erm_failure": "ERM Fail. ok", "pass_disc_power": "Disc. Power ok",
                  "pass_conv_validity": "Conv. Validity ok", "valid": "valid"}


def _display(table: pd.DataFrame, columns: Mapping[str, str]) -> pd.DataFrame:
    return table.reset_index()[["benchmark"] + list(columns)].rename(
        columns={"benchmark": "Benchmark", **columns})


def _k_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    wg = args.worst_group
    splits = tuple(s.strip() for s in args.test_splits.split(",") if s.strip())
    bad = [s for s in splits if s not in SPLIT_CODES]
    if bad or not splits:
        raise UserError(f"--test_splits takes in, out, uda; got {args.test_splits!r}")
    step = int(args.k_step) if str(args.k_step).lstrip("-").isdigit() else args.k_step
    return {"step": step, "reduction": args.reduction, "test_splits": splits,
            "worst_group": int(wg) if str(wg).lstrip("-").isdigit() else wg}


def _load(args: argparse.Namespace
          ) -> tuple[pd.DataFrame, pd.Series | None, pd.DataFrame | None]:
    recs = load_records(args.input_dir, require_done=not args.include_unfinished,
                        fields=TABLE_FIELDS)
    k_recs: list[dict[str, Any]] = []
    if getattr(args, "k_dir", None):
        if args.k_csv:
            raise UserError("pass either --k_dir or --k_csv, not both")
        k_recs = load_records(args.k_dir, require_done=not args.include_unfinished,
                              fields=TABLE_FIELDS).records
    names, labels = benchmark_names(recs.records + k_recs)
    results = group_results(recs, names, labels)
    K: pd.Series | None = None
    k_table: pd.DataFrame | None = None
    if k_recs:
        k_table = k_from_records(k_recs, names, labels, reference=args.reference,
                                 erm=args.erm_algorithm, **_k_kwargs(args))
        K = k_table.groupby("benchmark")["k"].mean()
    elif getattr(args, "k_csv", None):
        K = read_k_csv(args.k_csv)
    return results, K, k_table


def _emit(df: pd.DataFrame, args: argparse.Namespace, title: str,
          notes: Sequence[str] = ()) -> None:
    fmt = args.format or (report.format_for_path(args.output) if args.output else "text")
    text = report.render(df, fmt, args.digits, title if fmt != "csv" else None)
    if fmt != "csv":
        for note in notes:
            text += f"\nnote: {note}"
        if notes:
            text += "\n"
    if args.output:
        atomic_write_text(args.output, text)
        print(f"wrote {args.output}")
    else:
        echo(text, end="")


def _thresholds(args: argparse.Namespace) -> dict[str, float]:
    return {"erm_failure": args.erm_failure_min, "disc_power": args.disc_power_min,
            "conv_validity": args.conv_validity_min}


def cmd_report(args: argparse.Namespace) -> None:
    """Table 1: K, the three desiderata and pass/fail per benchmark."""
    results, K, _ = _load(args)
    table = validity_report(results, K, _thresholds(args), args.erm_algorithm, args.ddof,
                            with_mi=not args.no_mi, min_pairs=args.cv_min_pairs)
    cols = dict(REPORT_COLUMNS)
    if args.no_mi:
        cols.pop("mi")
    thr = table.attrs["thresholds"]
    title = ("Validity of benchmarks (ERM Fail. and Disc. Power in accuracy points; pass: "
             f"ERM Fail. >= {thr['erm_failure']:g}, Disc. Power >= {thr['disc_power']:g}, "
             f"Conv. Validity >= {thr['conv_validity']:g})")
    _emit(_display(table, cols), args, title, table.attrs["notes"])


def cmd_compute_k(args: argparse.Namespace) -> None:
    """K between one ERM run and one reference run."""
    out = compute_k(args.erm_run, args.reference_run, **_k_kwargs(args))
    df = pd.DataFrame([{"K": out["k"], "worst group": out["worst_group_name"],
                        "n": out["n"], "ERM acc. on it": out["erm_group_acc"],
                        "ERM step": out["erm_step"],
                        "reference step": out["reference_step"]}])
    _emit(df, args, "K (per-sample mean log-likelihood ratio, nats)"
          if args.reduction == "mean" else "K (summed log-likelihood ratio, nats)")


def cmd_robustness(args: argparse.Namespace) -> None:
    """Per method: median and IQR of worst-group accuracy over benchmarks, R^2 on K."""
    results, K, _ = _load(args)
    rob = V.method_robustness(wga_matrix(results), K).reset_index()
    rob = rob.sort_values(["median", "iqr"], ascending=[False, True])
    _emit(rob.rename(columns={"method": "Method", "median": "median WG acc.",
                              "iqr": "IQR", "n_benchmarks": "benchmarks",
                              "slope_k": "slope on K", "r2_k": "R^2 on K"}),
          args, "Method robustness over benchmarks (worst-group test accuracy, points)")


def cmd_agreement(args: argparse.Namespace) -> None:
    """Benchmark x benchmark agreement of the methods' worst-group accuracies."""
    results, _, _ = _load(args)
    agree = V.agreement_matrix(wga_matrix(results), method=args.method)
    _emit(agree.reset_index().rename(columns={"index": "benchmark"}), args,
          f"Agreement between benchmarks ({args.method} r of WG test accuracy over methods)")


def _valid_set(args: argparse.Namespace, results: pd.DataFrame, K: pd.Series | None
               ) -> tuple[list[str], pd.DataFrame]:
    table = validity_report(results, K, _thresholds(args), args.erm_algorithm, args.ddof,
                            with_mi=False, min_pairs=args.cv_min_pairs)
    return list(table.index[table["valid"].fillna(False).astype(bool)]), table


def cmd_recommend(args: argparse.Namespace) -> None:
    """A method chosen by the all / valid / closest strategy."""
    results, K, _ = _load(args)
    wga = wga_matrix(results)
    valid, _ = _valid_set(args, results, K) if args.strategy != "all" else ([], None)
    if args.strategy != "all" and not valid:
        raise UserError("no benchmark passes all three desiderata; use --strategy all or "
                        "lower the thresholds")
    query_k = args.query_k
    if args.strategy == "closest" and query_k is None:
        if args.query_benchmark is None:
            raise UserError("--strategy closest needs --query_k or --query_benchmark")
        if K is None or args.query_benchmark not in K.index:
            raise UserError(f"no K for {args.query_benchmark!r}")
        query_k = K[args.query_benchmark]
    exclude = [args.query_benchmark] if args.query_benchmark else []
    rec = V.recommend_method(wga, args.strategy, valid=valid, K=K, query_k=query_k,
                             exclude=exclude)
    df = pd.DataFrame([{"strategy": rec.strategy, "method": rec.method or "(tie)",
                        "from": b, "candidate": m, "WG acc.": 100 * s}
                       for b, m, s in rec.candidates] or
                      [{"strategy": rec.strategy, "method": "(none)", "from": "",
                        "candidate": "", "WG acc.": np.nan}])
    _emit(df, args, f"Recommended method ({args.strategy})", [rec.note] if rec.note else [])


def cmd_leave_one_out(args: argparse.Namespace) -> None:
    """Table 2: the three strategies compared, leaving each benchmark out."""
    results, K, _ = _load(args)
    if K is None:
        raise UserError("leave-one-out needs K (--k_dir or --k_csv)")
    valid, _ = _valid_set(args, results, K)
    if not valid:
        raise UserError("no benchmark passes all three desiderata; lower the thresholds "
                        "to run the leave-one-out comparison")
    loo = V.leave_one_out(wga_matrix(results), K, valid)
    wins = V.strategy_win_counts(loo["all_acc"], loo["valid_acc"], loo["closest_acc"])
    note = (f"Valid beats All on {wins['valid_beats_all']}/{wins['n']}; Closest is best on "
            f"{wins['closest_best_with_ties']}/{wins['n_closest']} counting ties, "
            f"{wins['closest_best_strict']}/{wins['n_closest']} strictly")
    _emit(loo.reset_index(), args, "Leave-one-out method choice (WG test accuracy, points)",
          [note])


COMMANDS: Mapping[str, Callable[[argparse.Namespace], None]] = {
    "report": cmd_report, "compute-k": cmd_compute_k, "robustness": cmd_robustness,
    "agreement": cmd_agreement, "recommend": cmd_recommend, "leave-one-out": cmd_leave_one_out}


def run(args: argparse.Namespace) -> int:
    """The subcommand `args.command` on parsed arguments."""
    COMMANDS[args.command](args)
    return 0
