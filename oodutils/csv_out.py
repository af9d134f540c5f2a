"""The one CSV writer of the project: every CSV a command writes (results tables, the
leaderboard, the analyses' tables, exported accuracies, run folders' ``examples.csv``)
goes through it, so a name from someone else's records can never run in a spreadsheet.

- A text cell that starts like a formula (``=``, ``+``, ``-``, ``@``, a tab, CR or LF, or
  their full-width forms, which some spreadsheets also read as formulas) gets a leading
  apostrophe, OWASP's advice against CSV injection: the spreadsheet shows it as text.
- A number stays a number: real numbers (int, float, numpy scalars) and text that is a
  plain decimal number (``-1.5``, ``+2``, ``1e-3``) are written as they are, so a user's
  spreadsheet still sums a column of negative accuracies.
- A cell holding a line break (CR or LF), a comma or a quote is quoted (RFC 4180), so it
  can never split a row; ``\\n`` ends the lines.
- Lone surrogates (text read from a broken record) are written as U+FFFD.

    >>> csv_text(["algorithm", "mean"], [["=HYPERLINK(1)", -1.5]])
    "algorithm,mean\\n'=HYPERLINK(1),-1.5\\n"

Readers of a CSV the project wrote undo the apostrophe with :func:`csv_value`.
"""
from __future__ import annotations

import csv
import io
import math
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from oodutils.text import encodable

if TYPE_CHECKING:   # pandas is imported where a table is built: commands answer --help first
    import pandas as pd

__all__ = ["FORMULA_START", "csv_cell", "csv_value", "csv_row", "csv_text", "frame_csv"]

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _is_missing(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, (float, np.floating)):
        return math.isnan(value)
    pandas = sys.modules.get("pandas")   # a pandas NA exists only once pandas is imported
    return pandas is not None and (value is pandas.NA or value is pandas.NaT)


def csv_cell(value: object) -> str:
    """One cell's text, safe to open in a spreadsheet (see the module's docstring);
    None and NaN are an empty cell."""
    if _is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)       # a number: never escaped, so it stays a number
    text = encodable(str(value))
    if text.startswith(FORMULA_START) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def csv_value(text: object) -> object:
    """A cell of a CSV the project wrote, back as it was (the apostrophe that
    :func:`csv_cell` put before a formula-like text removed)."""
    if isinstance(text, str) and text.startswith("'") and text[1:].startswith(FORMULA_START):
        return text[1:]
    return text


class _RowWriter:
    """csv's writer for one row at a time, quoting a field with CR or LF (which csv does
    only for the characters of its line terminator), ``\\n`` at the end."""

    def __init__(self) -> None:
        self._buf = io.StringIO()
        self._writer = csv.writer(self._buf, lineterminator="\r\n")

    def line(self, cells: Iterable[object]) -> str:
        self._buf.seek(0)
        self._buf.truncate()
        self._writer.writerow([csv_cell(c) for c in cells])
        return self._buf.getvalue()[:-2] + "\n"


def csv_row(cells: Iterable[object]) -> str:
    """One CSV line (with its ``\\n``) of `cells`."""
    return _RowWriter().line(cells)


def csv_text(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """The whole CSV (``\\n`` line ends) of a header and rows."""
    writer = _RowWriter()
    return writer.line(header) + "".join(writer.line(r) for r in rows)


def frame_csv(df: pd.DataFrame, index: bool = False) -> str:
    """A DataFrame as CSV: full precision (numbers as pandas writes them), missing values
    empty, text cells made inert. ``index``: the index first, as pandas' to_csv does."""
    if index:
        df = df.reset_index()
    columns = [df.iloc[:, i].to_numpy(dtype=object) for i in range(df.shape[1])]
    rows: Iterable[Sequence[Any]] = zip(*columns) if columns else []
    return csv_text([str(c) for c in df.columns], rows)
