"""Render a pandas DataFrame as text, markdown, LaTeX, HTML or CSV.

Generic on purpose: every analysis module hands its result table here.

    >>> print(render(df, "markdown", digits=2))

Floats are rounded to ``digits`` places in every format except CSV, which keeps full
precision (CSV is for machines; the rounding belongs to whoever reads it). Booleans print
as ``yes``/``no`` in the human formats and as ``True``/``False`` in CSV. Missing values
print as ``-`` (human formats) or an empty field (CSV).
"""
from __future__ import annotations

import html as _html
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

FORMATS = ("text", "markdown", "latex", "csv", "html")
_EXTENSIONS = {".txt": "text", ".md": "markdown", ".tex": "latex", ".csv": "csv",
               ".html": "html", ".htm": "html"}


def format_for_path(path, default="text"):
    """The format a file name asks for by its extension (``.md``, ``.tex``, ``.csv`` ...)."""
    return _EXTENSIONS.get(Path(path).suffix.lower(), default)


def _cell(value, digits):
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
        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return str(value)


def _cells(df, digits):
    header = [str(c) for c in df.columns]
    rows = [[_cell(v, digits) for v in row] for row in df.itertuples(index=False, name=None)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
               for c in df.columns]
    return header, rows, numeric


def to_text(df, digits=2, title=None):
    header, rows, numeric = _cells(df, digits)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [title] if title else []
    out += [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out) + "\n"


def _md_escape(text):
    return text.replace("|", "\\|")


def to_markdown(df, digits=2, title=None):
    header, rows, numeric = _cells(df, digits)
    out = [f"**{title}**", ""] if title else []
    out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    out.append("|" + "|".join("---:" if num else ":---" for num in numeric) + "|")
    out += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def latex_escape(text):
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(df, digits=2, title=None, label=None):
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    header, rows, numeric = _cells(df, digits)
    spec = "".join("r" if num else "l" for num in numeric)
    out = [r"\begin{table}[t]", r"\centering"]
    if title:
        out.append(r"\caption{" + latex_escape(title) + "}")
    if label:
        out.append(r"\label{" + label + "}")
    out += [r"\begin{tabular}{" + spec + "}", r"\toprule",
            " & ".join(latex_escape(h) for h in header) + r" \\", r"\midrule"]
    out += [" & ".join(latex_escape(c) for c in r) + r" \\" for r in rows]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


def to_html(df, digits=2, title=None):
    header, rows, numeric = _cells(df, digits)
    out = ["<table>"]
    if title:
        out.append(f"<caption>{_html.escape(title)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{_html.escape(h)}</th>" for h in header)
               + "</tr></thead>")
    out.append("<tbody>")
    for r in rows:
        out.append("<tr>" + "".join(
            f'<td style="text-align:{"right" if num else "left"}">{_html.escape(c)}</td>'
            for c, num in zip(r, numeric)) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out) + "\n"


def to_csv(df):
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def render(df: pd.DataFrame, fmt: str = "text", digits: int = 2, title: str | None = None) -> str:
    """The table as a string in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "text":
        return to_text(df, digits, title)
    if fmt == "markdown":
        return to_markdown(df, digits, title)
    if fmt == "latex":
        return to_latex(df, digits, title)
    if fmt == "html":
        return to_html(df, digits, title)
    if fmt == "csv":
        return to_csv(df)
    from domainbed.errors import UnknownNameError
    raise UnknownNameError("format", fmt, FORMATS)


def write(df: pd.DataFrame, path, fmt: str | None = None, digits: int = 2, title=None) -> Path:
    """Write the table to ``path``, in ``fmt`` or the format its extension names."""
    from domainbed.fileio import atomic_write_text
    path = Path(path)
    text = render(df, fmt or format_for_path(path), digits, title)
    atomic_write_text(path, text)
    return path
