"""The `labelfree` command (``python -m analysis.labelfree``): estimate each model's OOD
accuracy without OOD labels from a sweep's saved logits, and say where that can be trusted.

    python -m analysis.labelfree --input_dir SWEEP [SWEEP ...] --output_dir DIR
        [--all_steps]

Writes DIR/estimates.csv (run, step, dataset, env, method, estimated_acc, true_acc),
DIR/summary.csv (mean absolute error per dataset, OOD environment and method),
DIR/agreement.csv (the agreement line per split), DIR/verdicts.csv (trust or not, and
why) and DIR/estimates_<dataset>_env<k>.png (the dataset name made file-safe). The sweep
must have saved logits (`--save_logits` on train or sweep).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis import labelfree
from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_directories,
    configure_logging,
)
from oodutils.errors import epilog_example, run_cli
from oodutils.fileio import check_output_path

EPILOG = epilog_example("labelfree", "analysis.labelfree",
                        "--input_dir sweeps/zoo --output_dir labelfree/")


def build_parser() -> ArgumentParser:
    """The labelfree command's options."""
    p = ArgumentParser(prog="labelfree", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--input_dir", nargs="+", required=True,
               help="sweep directories whose runs saved logits")
    add_option(p, "--output_dir", required=True, help="where the tables and plots go")
    add_option(p, "--all_steps", action="store_true",
               help="every checkpoint with logits, not only each run's last")
    add_logging_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The labelfree command on `argv`: inputs and output checked, then the estimates (the
    package loads pandas and scipy on first use, after the flags are parsed)."""
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_directories(args.input_dir)
    check_output_path(args.output_dir, "--output_dir", directory=True)
    return labelfree.run(args)


def cli() -> None:
    """The `labelfree` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
