"""Results tables of a sweep, as DomainBed's collect_results prints them.

    python -m domainbed.scripts.collect_results --input_dir SWEEP_DIR
        [--latex | --format text|markdown|latex|csv|html] [-v | -q]
        [--selection_methods training_domain leave_one_out oracle worst_group val_worst_group]

For each model selection method: one table per dataset (rows: algorithms, columns: test
environments, cells: mean +/- standard error over trials of the selected model's test
accuracy, 'X' where missing, and their Avg), then a table of averages over datasets.
Datasets whose records carry worst-group accuracies also get a worst-group section;
datasets whose environments are official splits (train/val/test, SubpopBench framing) also
get SubpopBench's selection (best val worst-group accuracy; test worst-group and average
accuracy tables).
Works from the records alone; the tables are also saved as results.<txt|md|tex|csv|html> in
the input directory, as DomainBed does (unless --no_save).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from domainbed.results import model_selection
from domainbed.results import tables as reporting
from domainbed.results.export import export_selected
from domainbed.results.records import TABLE_FIELDS, load_records, only_arithmetic
from domainbed.results.report import build_report
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
    echo,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.fileio import atomic_write_text
from oodutils.log import get_logger
from oodutils.metrics import METRICS
from oodutils.tables import FORMATS

logger = get_logger(__name__)

EPILOG = epilog_example("domainbed-collect-results", "domainbed.scripts.collect_results",
                        "--input_dir sweeps/s1 --format markdown")

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="domainbed-collect-results",
        description="Results tables of a sweep (DomainBed's collect_results)",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(parser, "--input_dir", required=True, nargs="+",
               help="sweep output directory (or several)")
    add_option(parser, "--latex", action="store_true", help="same as --format latex")
    add_option(parser, "--format", choices=FORMATS, default=None)
    add_option(parser, "--selection_methods", nargs="+", default=None,
               metavar="METHOD",
               help="any of: " + ", ".join(model_selection.SELECTION_METHODS) +
               " (default: the first three, plus worst_group where records have "
               "worst-group accuracies, plus val_worst_group for datasets with "
               "val/test environments)")
    add_option(parser, "--include_unfinished", action="store_true",
               help="also read runs without a 'done' marker")
    add_option(parser, "--metric", default=None, metavar="NAME",
               help="tables of this metric of the selected checkpoints instead of "
                    "accuracy (selection unchanged): nll, ece, brier, balanced_acc, "
                    "macro_f1, worst_class_acc, auroc, acc_class<k>; read from the "
                    "records (--metrics) or metrics.jsonl (domainbed-metrics)")
    add_option(parser, "--arithmetic", default=None, metavar="NAME",
               help="only runs computed by this arithmetic (args.arithmetic: single, "
                    "fused-exact, fused-batched, probe-stack, data-parallel-<n>; records "
                    "without it count as single)")
    add_option(parser, "--stats", action="store_true",
               help="also print how sure the tables are: rank stability, paired "
                    "comparison with ERM, selection regret, expected best accuracy")
    add_option(parser, "--export_selected", default=None, metavar="DIR",
               help="copy (hard-link) the checkpoint each selection method picks "
                    "for each cell into DIR, with a manifest.json")
    add_option(parser, "--no_save", action="store_true",
               help="do not write results.<ext> into the input directory")
    add_logging_flags(parser)
    args = parser.parse_args(argv)
    configure_logging(args)
    return args


def check_metric_name(name: str) -> None:

    if name == "class_acc" or (name not in METRICS and not re.fullmatch(r"acc_class\d+", name)):
        raise UserError(f"--metric {name!r}: not one of "
                        f"{', '.join(m for m in METRICS if m != 'class_acc')} or acc_class<k>")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_outputs((args.export_selected, "--export_selected", True))
    if args.latex and args.format not in (None, "latex"):
        raise UserError(f"--latex conflicts with --format {args.format}")
    fmt = "latex" if args.latex else (args.format or "text")
    methods = None
    if args.selection_methods:
        methods = [model_selection.get_selection_method(n) for n in args.selection_methods]

    loaded = load_records(args.input_dir, require_done=not args.include_unfinished,
                          quiet=True, fields=TABLE_FIELDS)
    where = ", ".join(args.input_dir)
    if args.arithmetic is not None:
        loaded = only_arithmetic(loaded, args.arithmetic)
    if not len(loaded):
        skipped = loaded.skip_summary()
        detail = f" (skipped {skipped})" if skipped else ""
        raise UserError(f"no records found under {where}{detail}")
    if loaded.warning():
        logger.warning(loaded.warning())

    if args.metric is not None:
        check_metric_name(args.metric)
    report = build_report(loaded, methods, metric=args.metric)
    text = reporting.render(report, fmt)
    if args.stats:
        from analysis.selection_stats import render_stats
        text += "\n" + render_stats(loaded.records, methods or
                                     list(model_selection.DOMAINBED_METHODS), fmt)
    echo(text, end="")
    sys.stdout.flush()
    if report.has_missing() and fmt in ("text", "latex"):   # DomainBed's tables: aside
        logger.info(f"notice: {reporting.MISSING_NOTE}")
    if args.export_selected:
        manifest = export_selected(loaded.records, methods or
                                   list(model_selection.DOMAINBED_METHODS),
                                   args.export_selected)
        kept = sum(e["model"] is not None for e in manifest["entries"])
        logger.info(f"exported {kept} of {len(manifest['entries'])} selected models to "
                    f"{args.export_selected} (manifest.json lists every cell)")
    if not args.no_save and len(args.input_dir) == 1:
        path = os.path.join(args.input_dir[0], f"results.{reporting.SUFFIXES[fmt]}")
        try:
            atomic_write_text(path, text)
        except OSError as e:
            logger.warning(f"warning: could not save {path}: {e}")
    return 0

def cli() -> None:
    """The `domainbed-collect-results` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
