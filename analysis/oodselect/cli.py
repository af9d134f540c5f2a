"""The `oodselect` console command (also ``python -m analysis.oodselect``): the options of
`analysis.oodselect.options` parsed and checked, then the protocol; the package loads
torch on first use, so --help and argument errors answer before it loads."""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from analysis import oodselect
from analysis.oodselect.options import build_parser
from oodutils.cli import configure_logging
from oodutils.errors import UserError, run_cli
from oodutils.fileio import check_output_path


def check_args(args: argparse.Namespace) -> None:
    """Bad numbers and paths are one clear error before the matrix is even read."""
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    for name in ("lr", "eta_min", "penalty"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            raise UserError(f"--{name.replace('_', '-')} must be a finite number >= 0, "
                            f"got {value}")
    if args.lr <= 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    fractions = list(args.fractions)
    if any(not math.isfinite(f) or f < 0 for f in fractions) or \
            abs(sum(fractions) - 1.0) > 1e-6:
        raise UserError(f"--fractions must be three numbers >= 0 summing to 1, got "
                        f"{' '.join(map(str, fractions))}")
    if args.sizes and min(args.sizes) < 1:
        raise UserError(f"--sizes must be at least 1, got {min(args.sizes)}")
    check_output_path(args.out, "--output_dir", directory=True)
    if args.save_matrix:
        check_output_path(args.save_matrix, "--save_matrix")


def main(argv: Sequence[str] | None = None) -> int:
    """The oodselect command on `argv`: options checked, then the protocol (the package
    loads torch on first use, after the flags are parsed)."""
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_args(args)
    return oodselect.run(args)


def cli() -> None:
    """The `oodselect` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
