"""Metrics beyond accuracy for runs already trained: `domainbed-metrics --input_dir SWEEP`
computes them from each run's saved predictions (and logits, where saved: nll, ece, brier
and auroc need them) into `metrics.jsonl` beside its results.jsonl, which stays untouched."""
import argparse
import sys
from typing import Any

from domainbed.predictions import run_metrics
from domainbed.results.records import load_records
from oodutils.cli import ArgumentParser, add_logging_flags, add_option, configure_logging
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import get_logger
from oodutils.metrics import METRICS, check_metrics

logger = get_logger(__name__)
EPILOG = epilog_example("domainbed-metrics", "domainbed.scripts.metrics",
                        "--input_dir sweeps/s1 --metrics ece balanced_acc")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="domainbed-metrics", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--input_dir", required=True, nargs="+", help="sweep or run directories")
    add_option(p, "--metrics", nargs="+", default=list(METRICS), metavar="METRIC",
               help=f"any of: {', '.join(METRICS)} (default: all)")
    add_option(p, "--include_unfinished", action="store_true",
               help="also runs without a 'done' marker")
    add_logging_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    names = check_metrics(args.metrics)
    loaded = load_records(args.input_dir, require_done=not args.include_unfinished,
                          quiet=True)
    runs: dict[Any, Any] = {}
    for record in loaded.records:
        runs.setdefault(record["run_dir"], record)
    if not runs:
        raise UserError(f"no finished runs under {', '.join(args.input_dir)}")
    for run_dir, record in sorted(runs.items()):
        num_classes = record["args"].get("num_classes")
        if not isinstance(num_classes, int) or num_classes < 2:
            logger.warning(f"warning: {run_dir}: its records do not say how many classes "
                           f"(args.num_classes); skipped")
            continue
        try:
            lines = run_metrics(run_dir, num_classes, names)
        except OSError as e:   # a run folder this user cannot write (a read-only sweep)
            logger.warning(f"warning: {run_dir}: metrics.jsonl not written "
                           f"({e.strerror or e}); skipped")
            continue
        print(f"{run_dir}: {len(lines)} checkpoint(s) -> metrics.jsonl")
    return 0


def cli() -> None:
    """The `domainbed-metrics` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
