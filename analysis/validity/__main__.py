"""``python -m analysis.validity``: the `benchmark-validity` command."""
from analysis.validity.cli import cli

cli()
