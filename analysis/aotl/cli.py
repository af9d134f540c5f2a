"""The `aotl` console command (also ``python -m analysis.aotl``): parse with the light
parser of `analysis.aotl.options`, then run; the package loads its numeric code on first
use, so --help and argument errors answer before numpy, pandas and scipy load."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from analysis import aotl
from analysis.aotl.options import build_parser
from oodutils.errors import run_cli


def main(argv: Sequence[str] | None = None) -> int:
    """The aotl command on `argv`."""
    args = build_parser().parse_args(argv)   # first: `aotl.run` loads the numeric code
    return aotl.run(args)


def cli() -> None:
    """The `aotl` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
