"""The benchmark card command (``benchmark-card``, also ``python -m analysis.card``):
one card per dataset of the given sweeps, from whatever analyses they support.

    benchmark-card --input_dir SWEEP [SWEEP ...] --output_dir DIR
        [--oodselect DIR ...] [--ood_bench DIR ...] [--bootstrap N]

Writes DIR/card_<dataset>.md and DIR/card_<dataset>.html (the dataset name made
file-safe as the leaderboard's pages are) with: accuracy on the line per OOD split and its
verdict, the spread of effective robustness, validity desiderata, OoD-Bench's diversity
and correlation shift, OODSelect's worst subsets, label-free estimation error and rank
stability; a section the sweeps cannot support says what it needs. The leaderboard
(`domainbed-leaderboard`) writes the same cards into its site.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Sequence

from analysis import card
from domainbed.results import grouping
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_directories,
    check_outputs,
    configure_logging,
    echo,
)
from oodutils.errors import UserError, run_cli
from oodutils.fileio import check_output_path

EPILOG = "example:\n  benchmark-card --input_dir sweeps/s1 --output_dir cards/"


def build_parser() -> ArgumentParser:
    """The benchmark-card command's options."""
    p = ArgumentParser(prog="benchmark-card", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--input_dir", nargs="+", required=True, help="sweep directories")
    add_option(p, "--output_dir", required=True, help="where the cards go")
    add_option(p, "--oodselect", nargs="+", default=[], metavar="DIR",
               help="output directories of `oodselect --output_dir DIR`")
    add_option(p, "--ood_bench", nargs="+", default=[], metavar="DIR",
               help="output directories of `ood-bench run` (their summary.json)")
    add_option(p, "--bootstrap", type=int, default=200, metavar="N",
               help="bootstrap resamples for rank stability (default 200)")
    add_logging_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The benchmark-card command on `argv`: options checked, then the cards (the
    leaderboard's page writers and the records load after the flags are parsed)."""
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_outputs((args.output_dir, "--output_dir", True))
    check_directories(args.input_dir)
    if args.bootstrap < 1:
        raise UserError(f"--bootstrap must be at least 1, not {args.bootstrap}")
    from domainbed.leaderboard import pages, panels, site
    from domainbed.results import records
    check_output_path(args.output_dir, "--output_dir", directory=True)
    oodselect = [panels.read_oodselect(path) for path in args.oodselect]
    loaded = records.load_records(args.input_dir, quiet=True)
    by_label = site.records_by_label(loaded.records)
    if not by_label:
        raise UserError(f"no finished runs under {', '.join(args.input_dir)}")
    labels = grouping.dataset_labels(loaded.records)
    datasets = [{"label": label, "name": str(dataset)}
                for (dataset, _), label in sorted(labels.items(), key=lambda x: x[1])
                if label in by_label]
    inputs = card.CardInputs(input_dirs=args.input_dir, oodselect=oodselect,
                             ood_bench=card.read_ood_bench_summaries(args.ood_bench),
                             labelfree=card.labelfree_by_dataset(args.input_dir),
                             n_boot=args.bootstrap)
    model = {"datasets": datasets, "total_records": len(loaded.records),
             "sweeps": site.sweep_names(args.input_dir),
             "built": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
    os.makedirs(args.output_dir, exist_ok=True)
    site.write_cards(args.output_dir, model, by_label, inputs, in_site=False)
    for d in datasets:
        echo(f"wrote {os.path.join(args.output_dir, pages.card_page(d['label']))} and .md")
    return 0


def cli() -> None:
    """The `benchmark-card` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
