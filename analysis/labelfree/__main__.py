"""``python -m analysis.labelfree``: the `labelfree` command."""
from analysis.labelfree.cli import cli

cli()
