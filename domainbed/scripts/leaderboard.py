"""A static leaderboard site from one or more sweeps.

    domainbed-leaderboard --input_dir SWEEP [--input_dir SWEEP ...]
        --output_dir SITE_DIR [--oodselect DIR ...] [--ood_bench DIR ...]
        [--selection_methods METHOD ...] [--include_unfinished] [--bootstrap N]

Writes SITE_DIR/index.html (overview per model-selection method, how sure the ranking
is), a page per dataset (with effective robustness), a benchmark card per dataset
(card_<dataset>.html and .md), the runs behind each cell, the published reference
numbers, leaderboard.json and leaderboard.csv. Open index.html from disk or copy the
folder to any static host.
"""
import argparse
import os
import sys

from domainbed.results import model_selection
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import get_logger

logger = get_logger(__name__)

EPILOG = epilog_example("domainbed-leaderboard", "domainbed.scripts.leaderboard",
                        "--input_dir sweeps/s1 --output_dir site")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="domainbed-leaderboard", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--input_dir", required=True, action="extend", nargs="+",
                  help="sweep output directory; repeat (or list several) to pool sweeps")
    add_option(p, "--output_dir", "--out", "--output", required=True,
               help="folder to write the site into")
    add_option(p, "--oodselect", action="extend", nargs="+", default=[], metavar="DIR",
                  help="output directory of oodselect --output_dir DIR")
    add_option(p, "--ood_bench", action="extend", nargs="+", default=[], metavar="DIR",
               help="output directory of `ood-bench run` (its summary.json), shown on the "
                    "dataset's benchmark card")
    add_option(p, "--bootstrap", type=int, default=200, metavar="N",
               help="bootstrap resamples of the rank-stability panel and cards "
                    "(default 200)")
    add_option(p, "--selection_methods", nargs="+", default=None, metavar="METHOD",
                  help="any of: " + ", ".join(model_selection.SELECTION_METHODS) +
                  " (default: all)")
    add_option(p, "--include_unfinished", action="store_true",
                  help="also read runs without a 'done' marker")
    add_option(p, "--arithmetic", default=None, metavar="NAME",
               help="only runs computed by this arithmetic (args.arithmetic; records "
                    "without it count as single)")
    add_logging_flags(p)
    args = p.parse_args(argv)
    configure_logging(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_outputs((args.output_dir, "--output_dir", True))
    from domainbed.leaderboard.site import SiteExtras, build_site
    if args.bootstrap < 1:
        raise UserError(f"--bootstrap must be at least 1, not {args.bootstrap}")
    methods = None
    if args.selection_methods:
        methods = [model_selection.get_selection_method(n) for n in args.selection_methods]
    model = build_site(args.input_dir, args.output_dir, args.oodselect, args.include_unfinished,
                       methods, SiteExtras(args.ood_bench, args.bootstrap, args.arithmetic))
    for note in model["notes"]:
        logger.warning(f"warning: {note}")
    print(f"leaderboard: {os.path.join(os.path.abspath(args.output_dir), 'index.html')} "
          f"({model['total_records']} records, {len(model['datasets'])} datasets)")
    return 0


def cli() -> None:
    """The `domainbed-leaderboard` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
