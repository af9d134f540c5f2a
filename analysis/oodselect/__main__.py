"""``python -m analysis.oodselect``: the `oodselect` command."""
from analysis.oodselect.cli import cli

cli()
