"""``python -m analysis.aotl``: the `aotl` command."""
from analysis.aotl.cli import cli

cli()
