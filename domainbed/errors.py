"""Deprecated: moved to :mod:`oodutils.errors`. Importing this module warns and gives the same
objects, so old imports keep working for one more release."""
import warnings

from oodutils.errors import (  # noqa: F401
    UnknownNameError,
    UserError,
    epilog_example,
    require,
    run_cli,
)

__all__ = ["UserError", "UnknownNameError", "run_cli", "epilog_example", "require"]

warnings.warn("domainbed.errors is deprecated: import from oodutils.errors",
              DeprecationWarning, stacklevel=2)
