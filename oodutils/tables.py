"""The one table renderer: text, markdown, LaTeX, CSV and HTML, with one LaTeX escaper.

Two levels, both used across the project:

- grids of ready-made string cells (``text_lines``, ``markdown_lines``, ``latex_tabular``,
  ``html_table``, ``csv_text``): domainbed's results tables (DomainBed's exact layout, kept
  byte for byte) lay their cells out with these;
- pandas DataFrames (``render(df, fmt, digits, title)``, ``write(df, path)``): every
  analysis result table.

    >>> print(render(df, "markdown", digits=2))

For DataFrames, floats are rounded to ``digits`` places in every format except CSV, which
keeps full precision (CSV is for machines; the rounding belongs to whoever reads it).
Booleans print as ``yes``/``no`` in the human formats and as ``True``/``False`` in CSV.
Missing values print as ``-`` (human formats) or an empty field (CSV). Text from
records is escaped for every format: CSV cells that start like a formula and line breaks
(``oodutils.csv_out``, the one CSV writer), raw HTML in markdown and HTML, TeX commands
in LaTeX. Numeric columns
are right-aligned, others left-aligned.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:   # pandas is imported where a table is built: commands answer --help first
    import pandas as pd

from oodutils.csv_out import frame_csv
from oodutils.errors import UnknownNameError
from oodutils.fileio import atomic_write_text
from oodutils.templating import render as render_template
from oodutils.text import printable

FORMATS = ("text", "markdown", "latex", "csv", "html")
SUFFIXES = {"text": "txt", "markdown": "md", "latex": "tex", "csv": "csv", "html": "html"}
_EXTENSIONS = {".txt": "text", ".md": "markdown", ".tex": "latex", ".csv": "csv",
               ".html": "html", ".htm": "html"}

Align = Optional[str]   # "left", "right", "center", or None (the format's default)


def check_format(fmt: str) -> str:
    """``fmt`` when it is one of :data:`FORMATS`, else an UnknownNameError (a UserError)
    listing the valid ones."""
    if fmt not in FORMATS:
        raise UnknownNameError("format", fmt, FORMATS)
    return fmt


def format_for_path(path: str | os.PathLike[str], default: str = "text") -> str:
    """The format a file name asks for by its extension (``.md``, ``.tex``, ``.csv`` ...)."""
    return _EXTENSIONS.get(Path(path).suffix.lower(), default)


# ------------------------------------------------------------------------------ escaping

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}", "\n": " ", "\r": " "}


def latex_escape(text: object) -> str:
    """``text`` safe inside LaTeX text mode: the ten special characters escaped, line
    breaks (a blank line would end the table) made spaces, other control characters
    written as ``\\xNN``. Text from records (dataset, algorithm names) can so never run
    a TeX command."""
    text = "".join(" " if ch in "\n\r" else ch for ch in str(text))
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in printable(text))


_MARKDOWN_SPECIAL = {"|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": " ",
                     "\r": " ", "\\": "\\\\", "[": "\\[", "]": "\\]"}


def markdown_escape(text: object) -> str:
    """``text`` safe inside a markdown table cell: ``|``, ``\\`` and the brackets of
    link and image syntax escaped (a name cannot split a cell or become a link or a
    remote image), raw HTML made inert
    (``<``, ``>``, ``&`` as entities, which markdown shows as the characters), line
    breaks made spaces, other control characters written as ``\\xNN``."""
    return printable("".join(_MARKDOWN_SPECIAL.get(ch, ch) for ch in str(text)))


# ------------------------------------------------------------------- grids of string cells

def text_lines(header: Sequence[str], rows: Sequence[Sequence[str]],
               align: Optional[Sequence[Align]] = None, *, min_width: int = 0,
               uniform: bool = False, rule: bool = True, end: Optional[str] = None
               ) -> list[str]:
    """A plain-text table as lines: columns two spaces apart, each as wide as its widest
    cell (``uniform``: every column as wide as the widest cell of the table), never less
    than ``min_width``; ``align`` "right" right-justifies a column (default left); ``rule``
    puts a line of dashes under the header. ``end``: appended to every line as is (None:
    trailing spaces stripped instead)."""
    grid = [[printable(c) for c in header]] + [[printable(c) for c in r] for r in rows]
    n = len(grid[0])
    align = list(align) if align is not None else [None] * n
    widths = [max([min_width] + [len(r[i]) for r in grid]) for i in range(n)]
    if uniform:
        widths = [max(widths + [min_width])] * n

    def line(cells: Sequence[str]) -> str:
        text = "  ".join(c.rjust(w) if a == "right" else c.ljust(w)
                         for c, w, a in zip(cells, widths, align))
        return text.rstrip() if end is None else text + end

    out = [line(grid[0])]
    if rule:
        out.append("  ".join("-" * w for w in widths) + (end or ""))
    return out + [line(r) for r in grid[1:]]


_MD_RULE = {None: "---", "left": ":---", "right": "---:", "center": ":---:"}


def markdown_lines(header: Sequence[str], rows: Sequence[Sequence[str]],
                   align: Optional[Sequence[Align]] = None) -> list[str]:
    """A markdown (GitHub) table as lines; cells are escaped here."""
    align = list(align) if align is not None else [None] * len(header)
    out = ["| " + " | ".join(markdown_escape(h) for h in header) + " |",
           "|" + "|".join(_MD_RULE[a] for a in align) + "|"]
    return out + ["| " + " | ".join(markdown_escape(c) for c in r) + " |" for r in rows]


def latex_tabular(header: Sequence[str], rows: Sequence[Sequence[str]], spec: str, *,
                  pad: int = 0, escape: bool = True) -> list[str]:
    """A booktabs ``tabular`` (needs ``\\usepackage{booktabs}``) as lines, from
    ``\\begin{tabular}`` to ``\\end{tabular}``. ``escape=False``: the cells are LaTeX
    already (the caller escaped what is text). ``pad``: cells left-justified to this
    width, so the source lines up."""
    fix = latex_escape if escape else str

    def line(cells: Sequence[str]) -> str:
        return " & ".join(fix(c).ljust(pad) for c in cells) + r" \\"

    return ([r"\begin{tabular}{" + spec + "}", r"\toprule", line(header), r"\midrule"]
            + [line(r) for r in rows] + [r"\bottomrule", r"\end{tabular}"])


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]],
               align: Optional[Sequence[Align]] = None, caption: Optional[str] = None
               ) -> str:
    """An HTML ``<table>`` (from ``templates/table.html.j2``, autoescaped: cells and
    caption are text, never markup)."""
    align = list(align) if align is not None else [None] * len(header)
    rows = [[str(c) for c in r][:len(align)] for r in rows]
    return render_template(__package__, "table.html.j2", header=[str(h) for h in header],
                           rows=rows, align=align, caption=caption)


# ----------------------------------------------------------------------------- DataFrames

def _pandas() -> ModuleType:
    """pandas, imported when a frame is first rendered: commands that only name a format
    (``FORMATS``) answer --help before it."""
    import pandas
    return pandas


def format_value(value: object, digits: int = 2) -> str:
    """One DataFrame value as the human formats show it."""
    if value is None:
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "-"
        text = f"{value:.{digits}f}"
        if text.startswith("-") and float(text) == 0.0:  # "-0.00" reads as a sign error
            text = text[1:]
        return text
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    try:
        if _pandas().isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return str(value)


def _cells(df: pd.DataFrame, digits: int) -> tuple[list[str], list[list[str]], list[str]]:
    types = _pandas().api.types
    header = [str(c) for c in df.columns]
    rows = [[format_value(v, digits) for v in row]
            for row in df.itertuples(index=False, name=None)]
    align = ["right" if types.is_numeric_dtype(df[c]) and not types.is_bool_dtype(df[c])
             else "left" for c in df.columns]
    return header, rows, align


def to_text(df: pd.DataFrame, digits: int = 2, title: Optional[str] = None) -> str:
    header, rows, align = _cells(df, digits)
    out = [title] if title else []
    return "\n".join(out + text_lines(header, rows, align)) + "\n"


def to_markdown(df: pd.DataFrame, digits: int = 2, title: Optional[str] = None) -> str:
    header, rows, align = _cells(df, digits)
    out = [f"**{markdown_escape(title)}**", ""] if title else []
    return "\n".join(out + markdown_lines(header, rows, align)) + "\n"


def to_latex(df: pd.DataFrame, digits: int = 2, title: Optional[str] = None,
             label: Optional[str] = None) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    header, rows, align = _cells(df, digits)
    out = [r"\begin{table}[t]", r"\centering"]
    if title:
        out.append(r"\caption{" + latex_escape(title) + "}")
    if label:
        out.append(r"\label{" + label + "}")
    spec = "".join("r" if a == "right" else "l" for a in align)
    out += latex_tabular(header, rows, spec) + [r"\end{table}"]
    return "\n".join(out) + "\n"


def to_html(df: pd.DataFrame, digits: int = 2, title: Optional[str] = None) -> str:
    header, rows, align = _cells(df, digits)
    return html_table(header, rows, align, caption=title)


def to_csv(df: pd.DataFrame) -> str:
    """Full-precision CSV, text cells made inert (``oodutils.csv_out``)."""
    return frame_csv(df)


def render(df: pd.DataFrame, fmt: str = "text", digits: int = 2,
           title: Optional[str] = None) -> str:
    """The table as a string in ``fmt`` (one of :data:`FORMATS`; CSV has no title)."""
    check_format(fmt)
    if fmt == "csv":
        return to_csv(df)
    return {"text": to_text, "markdown": to_markdown, "latex": to_latex,
            "html": to_html}[fmt](df, digits, title)


def write(df: pd.DataFrame, path: str | os.PathLike[str], fmt: Optional[str] = None,
          digits: int = 2, title: Optional[str] = None) -> Path:
    """Write the table atomically to ``path``, in ``fmt`` or the format its extension
    names."""
    path = Path(path)
    atomic_write_text(path, render(df, fmt or format_for_path(path), digits, title))
    return path
