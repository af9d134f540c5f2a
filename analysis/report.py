"""Deprecated: moved to :mod:`oodutils.tables`. Importing this module warns and gives the same
objects, so old imports keep working for one more release."""
import warnings

from oodutils.tables import (  # noqa: F401
    FORMATS,
    format_for_path,
    format_value,
    latex_escape,
    render,
    to_csv,
    to_html,
    to_latex,
    to_markdown,
    to_text,
    write,
)

__all__ = ["FORMATS", "format_for_path", "format_value", "latex_escape", "render", "to_csv",
           "to_html", "to_latex", "to_markdown", "to_text", "write"]

warnings.warn("analysis.report is deprecated: import from oodutils.tables",
              DeprecationWarning, stacklevel=2)
