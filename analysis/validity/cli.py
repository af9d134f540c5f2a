"""The ``benchmark-validity`` command line (``python -m analysis.validity``): subcommands
report, compute-k, robustness, agreement, recommend, leave-one-out over run directories,
through the records adapter :mod:`analysis.validity.records` (see its docstring)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from analysis import validity
from analysis.validity import config as validity_config
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.tables import FORMATS

EPILOG = epilog_example("benchmark-validity", "analysis.validity",
                        "report --input_dir sweeps/s1 sweeps/s2")

def _add_input(p: argparse.ArgumentParser, k: bool = True) -> None:
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


def _add_k_options(p: argparse.ArgumentParser) -> None:
    add_option(p, "--reference", help="reference algorithm of K (default: ReweightedERM, "
                  "else GroupDRO)")
    add_option(p, "--k_step", default="val_nll",
                  help="checkpoint of the K runs: val_nll (default), last, or a step")
    add_option(p, "--worst_group", default="erm_lowest_acc",
                  help="erm_lowest_acc (default), smallest, or a group index")
    add_option(p, "--reduction", default="mean", choices=["mean", "sum"])
    add_option(p, "--test_splits", default="in,out",
                  help="test-environment splits K is computed on (default in,out)")


def _add_output(p: argparse.ArgumentParser) -> None:
    add_option(p, "--format", choices=FORMATS)
    add_option(p, "--output", "--out", "--output-dir", dest="output",
                  help="write here (format from the extension unless --format)")
    add_option(p, "--digits", type=int, default=2)


def build_parser() -> ArgumentParser:
    """The benchmark-validity command and its subcommands."""
    parser = ArgumentParser(
        prog="benchmark-validity",
        description="Validity desiderata of spurious-correlation benchmarks (Bell et al. 2024, "
                    "'Reassessing the Validity of Spurious Correlations Benchmarks').",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def thresholds(p: argparse.ArgumentParser) -> None:
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

    p = sub.add_parser("compute-k", help="K between an ERM run and a reference run")
    add_option(p, "--erm_run", required=True)
    add_option(p, "--reference_run", required=True)
    _add_k_options(p)
    _add_output(p)

    p = sub.add_parser("robustness", help="per method: median, IQR, R^2 on K")
    _add_input(p)
    _add_output(p)

    p = sub.add_parser("agreement", help="benchmark x benchmark agreement")
    _add_input(p, k=False)
    add_option(p, "--method", default="pearson", choices=["pearson", "spearman", "kendall"])
    _add_output(p)

    p = sub.add_parser("recommend", help="choose a method: all / valid / closest")
    _add_input(p)
    thresholds(p)
    add_option(p, "--strategy", choices=validity_config.STRATEGIES, default="closest")
    add_option(p, "--query_k", type=float, help="K of your dataset")
    add_option(p, "--query_benchmark", help="a benchmark of the input to treat as new "
                  "(its K is used and it is left out of the choice)")
    _add_output(p)

    p = sub.add_parser("leave-one-out", help="Table 2: the three strategies, leave-one-out")
    _add_input(p)
    thresholds(p)
    _add_output(p)
    for p in sub.choices.values():
        add_logging_flags(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The benchmark-validity command on `argv`: options checked, then the subcommand (the
    package loads pandas and scipy on first use, after the flags are parsed)."""
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_outputs((getattr(args, "output", None), "--output", False))
    for name in ("input_dir", "k_dir"):
        for d in getattr(args, name, None) or []:
            if not os.path.isdir(d):
                raise UserError(f"{d!r} is not a directory")
    return validity.run(args)


def cli() -> None:
    """The `benchmark-validity` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
