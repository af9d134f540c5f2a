"""``python -m analysis.card``: the `benchmark-card` command."""
from analysis.card.cli import cli

cli()
