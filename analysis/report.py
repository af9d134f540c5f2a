"""Render a pandas DataFrame as text, markdown, LaTeX, HTML or CSV: the project's one
table renderer, :mod:`oodutils.tables`, under the name the analysis modules have always
used.

    >>> print(render(df, "markdown", digits=2))
"""
from oodutils.tables import (
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
