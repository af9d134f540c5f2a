"""Published reference numbers, shipped as JSON data files in ``leaderboard/data``.

Each file holds one source: ``{"source": {id, title, citation, url, licence, note,
metric}, "rows": [...]}``. A row is one printed number::

    {"method": "training_domain", "table": "VLCS", "algorithm": "ERM",
     "column": "C", "mean": 97.7, "err": 0.4}

``table`` is a dataset name (``column`` an environment name, or "Avg") or "Averages"
(``column`` a dataset name, or "Avg"). ``err`` is null where the source prints none.
Numbers are copied as printed (percent). DomainBed's file is converted from its
``results.tex`` by ``parse_results_tex`` (``scripts/convert_published.py``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from importlib import resources
from typing import Any

from domainbed.results import model_selection
from oodutils.errors import UserError

DATA_PACKAGE = "domainbed.leaderboard.data"
_SUBSECTION = re.compile(r"^\\subsection\{Model selection: (.*)\}\s*$")
_SUBSUBSECTION = re.compile(r"^\\subsubsection\{(.*)\}\s*$")
_BOLD = re.compile(r"^\\textbf\{(.*)\}$")
_CELL = re.compile(r"^(-?\d+(?:\.\d+)?) \$\\pm\$ (-?\d+(?:\.\d+)?)$")
_TEX_UNESCAPE = {"\\%": "%", "\\_": "_", "\\&": "&", "\\#": "#", "\\$": "$"}
Row = dict[str, Any]        # one published number
Source = dict[str, Any]     # one data file: {"source": {...}, "rows": [Row, ...]}


def _unescape(text: str) -> str:
    for escaped, plain in _TEX_UNESCAPE.items():
        text = text.replace(escaped, plain)
    return text


def method_key(method_name: str) -> str:
    """A selection method's key from the name printed in table headers."""
    for method in model_selection.SELECTION_METHODS.values():
        if method.name == method_name:
            return method.key
    raise UserError(f"unknown model selection method {method_name!r} in the published table")


def _parse_number(text: str, where: str) -> tuple[float | None, float | None]:
    text = text.strip()
    if text == "X":
        return None, None
    match = _CELL.match(text)
    if match:
        return float(match.group(1)), float(match.group(2))
    try:
        return float(text), None
    except ValueError:
        raise UserError(f"cannot read the cell {text!r} ({where})") from None


def parse_results_tex(text: str) -> list[Row]:
    """DomainBed's results.tex (as collect_results --latex writes it) -> rows."""
    rows: list[Row] = []
    method: str | None = None
    table: str | None = None
    header: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if (m := _SUBSECTION.match(line)):
            method, table, header = method_key(m.group(1)), None, None
        elif (m := _SUBSUBSECTION.match(line)):
            table, header = _unescape(m.group(1)), None
        elif table and line.rstrip().endswith("\\\\"):
            cells = [c.strip() for c in line.rstrip()[:-2].split("&")]
            if header is None:
                header = [_unescape(_BOLD.match(c).group(1))  # type: ignore[union-attr]
                          if _BOLD.match(c) else c
                          for c in cells]
                continue
            for column, cell in zip(header[1:], cells[1:]):
                mean, err = _parse_number(cell, f"line {number}")
                rows.append({"method": method, "table": table,
                             "algorithm": _unescape(cells[0]), "column": column,
                             "mean": mean, "err": err})
    if not rows:
        raise UserError("no table rows found in the published LaTeX file")
    return rows


def format_published(row: Row) -> str:
    """A published number as the leaderboard prints it ("97.7 +/- 0.4", "63.09", "X")."""
    if row["mean"] is None:
        return "X"
    digits = row.get("digits", 1)
    text = f"{row['mean']:.{digits}f}"
    if row.get("err") is not None:
        text += f" +/- {row['err']:.{digits}f}"
    return text


def data_files() -> list[str]:
    return sorted(p.name for p in resources.files(DATA_PACKAGE).iterdir()
                  if p.name.endswith(".json"))


def load_source(name: str) -> Source:
    with resources.files(DATA_PACKAGE).joinpath(name).open("r", encoding="utf-8") as f:
        return json.load(f)


def load_published() -> list[Source]:
    """Every shipped source: a list of {"source": ..., "rows": [...]}."""
    return [load_source(name) for name in data_files()]


def dumps_source(source: dict[str, Any], rows: Iterable[Row]) -> str:
    """A data file's text: the source block, then one row per line (diffs stay readable)."""
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    return ("{\"source\": " + json.dumps(source, indent=1, ensure_ascii=False) +
            ",\n\"rows\": [\n" + ",\n".join(lines) + "\n]}\n")
