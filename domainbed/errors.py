"""User-facing errors: re-exported from :mod:`oodutils.errors`, where they live (shared by
every package). Existing ``from domainbed.errors import ...`` keeps working."""
from oodutils.errors import UnknownNameError, UserError, epilog_example, require, run_cli

__all__ = ["UserError", "UnknownNameError", "run_cli", "epilog_example", "require"]
