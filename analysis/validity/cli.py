"""The ``benchmark-validity`` command line (``python -m analysis.validity``): subcommands
report, compute-k, robustness, agreement, recommend, leave-one-out over run directories,
through the records adapter :mod:`analysis.validity.records` (see its docstring)."""
from __future__ import annotations

import argparse
import os
import sys

from analysis.validity import config as validity_config
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
    echo,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.tables import FORMATS

EPILOG = epilog_example("benchmark-validity", "analysis.validity",
                        "report --input_dir sweeps/s1 sweeps/s2")

REPORT_COLUMNS = {"K": "K", "mi": "I(Y;A)", "erm_failure": "ERM Fail.",
                  "disc_power": "Disc. Power", "conv_validity": "Conv. Validity",
                  "cv_r2": "CV R^2", "best_method": "Method", "best_wga": "WG test acc.",
                  "pass_erm_failure": "ERM Fail. ok", "pass_disc_power": "Disc. Power ok",
                  "pass_conv_validity": "Conv. Validity ok", "valid": "valid"}


def _display(table, columns):
    return table.reset_index()[["benchmark"] + list(columns)].rename(
        columns={"benchmark": "Benchmark", **columns})


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def _add_input(p, k=True):
    add_option(p, "--input_dir", nargs="+", required=True,
                  help="sweep output directories (run directories at any depth)")
    add_option(p, "--erm_algorithm", default="ERM")
    add_option(p, "--include_unfinished", action="store_true",
                  help="also read runs without a 'done' marker")
    if k:
        add_option(p, "--k_dir", nargs="+", help="K reference runs "
                      "(scripts/train_k_reference.py output)")
        add_option(p, "--k_csv", help="K per benchmark instead: CSV with benchmark,K")
        _add_k_options(p)


def _add_k_options(p):
    add_option(p, "--reference", help="reference algorithm of K (default: ReweightedERM, "
                  "else GroupDRO)")
    add_option(p, "--k_step", default="val_nll",
                  help="checkpoint of the K runs: val_nll (default), last, or a step")
    add_option(p, "--worst_group", default="erm_lowest_acc",
                  help="erm_lowest_acc (default), smallest, or a group index")
    add_option(p, "--reduction", default="mean", choices=["mean", "sum"])
    add_option(p, "--test_splits", default="in,out",
                  help="test-environment splits K is computed on (default in,out)")


def _add_output(p):
    add_option(p, "--format", choices=FORMATS)
    add_option(p, "--output", "--out", "--output-dir", dest="output",
                  help="write here (format from the extension unless --format)")
    add_option(p, "--digits", type=int, default=2)


def _k_kwargs(args):
    wg = args.worst_group
    splits = tuple(s.strip() for s in args.test_splits.split(",") if s.strip())
    bad = [s for s in splits if s not in validity_config.SPLIT_CODES]
    if bad or not splits:
        raise UserError(f"--test_splits takes in, out, uda; got {args.test_splits!r}")
    step = int(args.k_step) if str(args.k_step).lstrip("-").isdigit() else args.k_step
    return {"step": step, "reduction": args.reduction, "test_splits": splits,
            "worst_group": int(wg) if str(wg).lstrip("-").isdigit() else wg}


def _load(args):
    from analysis.validity.records import benchmark_names, group_results, k_from_records, read_k_csv
    from domainbed.results.records import TABLE_FIELDS, load_records
    recs = load_records(args.input_dir, require_done=not args.include_unfinished,
                        fields=TABLE_FIELDS)
    k_recs = []
    if getattr(args, "k_dir", None):
        if args.k_csv:
            raise UserError("pass either --k_dir or --k_csv, not both")
        k_recs = load_records(args.k_dir, require_done=not args.include_unfinished,
                              fields=TABLE_FIELDS).records
    names, labels = benchmark_names(recs.records + k_recs)
    results = group_results(recs, names, labels)
    K, k_table = None, None
    if k_recs:
        k_table = k_from_records(k_recs, names, labels, reference=args.reference,
                                 erm=args.erm_algorithm, **_k_kwargs(args))
        K = k_table.groupby("benchmark")["k"].mean()
    elif getattr(args, "k_csv", None):
        K = read_k_csv(args.k_csv)
    return results, K, k_table


def _emit(df, args, title, notes=()):
    from oodutils import tables as report
    fmt = args.format or (report.format_for_path(args.output) if args.output else "text")
    text = report.render(df, fmt, args.digits, title if fmt != "csv" else None)
    if fmt != "csv":
        for note in notes:
            text += f"\nnote: {note}"
        if notes:
            text += "\n"
    if args.output:
        from oodutils.fileio import atomic_write_text
        atomic_write_text(args.output, text)
        print(f"wrote {args.output}")
    else:
        echo(text, end="")


def _thresholds(args):
    return {"erm_failure": args.erm_failure_min, "disc_power": args.disc_power_min,
            "conv_validity": args.conv_validity_min}


def cmd_report(args):
    from analysis.validity.records import validity_report
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


def cmd_compute_k(args):
    import pandas as pd

    from analysis.validity.records import compute_k
    out = compute_k(args.erm_run, args.reference_run, **_k_kwargs(args))
    df = pd.DataFrame([{"K": out["k"], "worst group": out["worst_group_name"],
                        "n": out["n"], "ERM acc. on it": out["erm_group_acc"],
                        "ERM step": out["erm_step"],
                        "reference step": out["reference_step"]}])
    _emit(df, args, "K (per-sample mean log-likelihood ratio, nats)"
          if args.reduction == "mean" else "K (summed log-likelihood ratio, nats)")


def cmd_robustness(args):
    from analysis import validity as V
    from analysis.validity.records import wga_matrix
    results, K, _ = _load(args)
    rob = V.method_robustness(wga_matrix(results), K).reset_index()
    rob = rob.sort_values(["median", "iqr"], ascending=[False, True])
    _emit(rob.rename(columns={"method": "Method", "median": "median WG acc.",
                              "iqr": "IQR", "n_benchmarks": "benchmarks",
                              "slope_k": "slope on K", "r2_k": "R^2 on K"}),
          args, "Method robustness over benchmarks (worst-group test accuracy, points)")


def cmd_agreement(args):
    from analysis import validity as V
    from analysis.validity.records import wga_matrix
    results, _, _ = _load(args)
    agree = V.agreement_matrix(wga_matrix(results), method=args.method)
    _emit(agree.reset_index().rename(columns={"index": "benchmark"}), args,
          f"Agreement between benchmarks ({args.method} r of WG test accuracy over methods)")


def _valid_set(args, results, K):
    from analysis.validity.records import validity_report
    table = validity_report(results, K, _thresholds(args), args.erm_algorithm, args.ddof,
                            with_mi=False, min_pairs=args.cv_min_pairs)
    return list(table.index[table["valid"].fillna(False).astype(bool)]), table


def cmd_recommend(args):
    import numpy as np
    import pandas as pd

    from analysis import validity as V
    from analysis.validity.records import wga_matrix
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


def cmd_leave_one_out(args):
    from analysis import validity as V
    from analysis.validity.records import wga_matrix
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


def build_parser():
    parser = ArgumentParser(
        prog="benchmark-validity",
        description="Validity desiderata of spurious-correlation benchmarks (Bell et al. 2024, "
                    "'Reassessing the Validity of Spurious Correlations Benchmarks').",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def thresholds(p):
        d = validity_config.DEFAULT_THRESHOLDS
        add_option(p, "--erm_failure_min", type=float, default=d["erm_failure"])
        add_option(p, "--disc_power_min", type=float, default=d["disc_power"])
        add_option(p, "--conv_validity_min", type=float, default=d["conv_validity"])
        add_option(p, "--ddof", type=int, default=1, help="SD degrees of freedom (1: sample)")
        add_option(p, "--cv_min_pairs", type=int, default=3,
                      help="comparison benchmarks needed for Convergent Validity")

    p = sub.add_parser("report", help="Table 1: K, the three desiderata, pass/fail")
    _add_input(p)
    thresholds(p)
    add_option(p, "--no_mi", action="store_true", help="skip I(Y;A)")
    _add_output(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compute-k", help="K between an ERM run and a reference run")
    add_option(p, "--erm_run", required=True)
    add_option(p, "--reference_run", required=True)
    _add_k_options(p)
    _add_output(p)
    p.set_defaults(func=cmd_compute_k)

    p = sub.add_parser("robustness", help="per method: median, IQR, R^2 on K")
    _add_input(p)
    _add_output(p)
    p.set_defaults(func=cmd_robustness)

    p = sub.add_parser("agreement", help="benchmark x benchmark agreement")
    _add_input(p, k=False)
    add_option(p, "--method", default="pearson", choices=["pearson", "spearman", "kendall"])
    _add_output(p)
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser("recommend", help="choose a method: all / valid / closest")
    _add_input(p)
    thresholds(p)
    add_option(p, "--strategy", choices=validity_config.STRATEGIES, default="closest")
    add_option(p, "--query_k", type=float, help="K of your dataset")
    add_option(p, "--query_benchmark", help="a benchmark of the input to treat as new "
                  "(its K is used and it is left out of the choice)")
    _add_output(p)
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("leave-one-out", help="Table 2: the three strategies, leave-one-out")
    _add_input(p)
    thresholds(p)
    _add_output(p)
    p.set_defaults(func=cmd_leave_one_out)
    for p in sub.choices.values():
        add_logging_flags(p)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_outputs((getattr(args, "output", None), "--output", False))
    for name in ("input_dir", "k_dir"):
        for d in getattr(args, name, None) or []:
            if not os.path.isdir(d):
                raise UserError(f"{d!r} is not a directory")
    args.func(args)
    return 0


def cli():
    """The `benchmark-validity` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    from oodutils.errors import run_cli
    sys.exit(run_cli(main))
