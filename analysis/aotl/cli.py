"""The `aotl` console command: parse (a light parser, see `analysis.aotl_options`), then
import the numeric code and run it, so --help and argument errors answer at once."""
import sys

from analysis.aotl_options import build_parser
from oodutils.errors import run_cli


def main(argv=None):
    args = build_parser().parse_args(argv)
    from analysis import aotl
    return aotl.run(args)


def cli():
    """The `aotl` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
