"""Results tables of a sweep: text (as DomainBed's collect_results prints), markdown,
LaTeX (as DomainBed's ``--latex``), CSV (long format, one row per cell) and HTML. The
layout is DomainBed's; the cells are laid out by the shared renderer,
:mod:`oodutils.tables` (one LaTeX escaper, one markdown escaper for the whole project).

A Report holds Sections (one per model selection method), each a list of Tables.
Cells are Cell(mean, err, n) in percent, or None for a missing cell ('X').

The text and LaTeX formats are DomainBed's, byte for byte (one trial shows ``+/- 0.0``).
Our own formats say more: a cell of one trial shows ``(n=1)``, not a spread that is not
there; a table of another metric than accuracy names it; X cells are explained.
"""
import dataclasses
from typing import Iterable, List, Optional, Sequence

import numpy as np

from oodutils import tables
from oodutils.csv_out import csv_text
from oodutils.templating import render as render_template

FORMATS = tables.FORMATS
SUFFIXES = tables.SUFFIXES


@dataclasses.dataclass
class Cell:
    mean: float   # percent
    err: float    # standard error, percent
    n: int        # number of trials


def summarize(values: Iterable[float]) -> Optional[Cell]:
    """Accuracies (fractions) over trials -> Cell(mean, standard error) in percent, or
    None when empty. Standard error = np.std (ddof 0) / sqrt(n), as DomainBed."""
    data = np.asarray([float(v) for v in values], dtype=float)
    if not data.size:
        return None
    return Cell(100 * float(np.mean(data)),
                100 * float(np.std(data / np.sqrt(len(data)))), len(data))


# What an X cell means, for the formats (and the terminal) that explain it.
MISSING_NOTE = ("X: no selected run for that cell (not run, not finished, or the model "
                "selection method had no checkpoint to choose); an Avg or Averages cell is X "
                "when any cell it averages is")


def format_cell(cell: Optional[Cell], style: str = "text") -> str:
    """DomainBed's cell (``mean +/- err``) in text and LaTeX; in markdown (and HTML) a
    cell of one trial shows ``(n=1)`` instead of a ``± 0.0`` spread."""
    if cell is None:
        return "X"
    if style == "markdown" and cell.n == 1:
        return f"{cell.mean:.1f} (n=1)"
    sep = {"text": "+/-", "latex": "$\\pm$", "markdown": "±"}.get(style, "+/-")
    return f"{cell.mean:.1f} {sep} {cell.err:.1f}"


def format_avg(value: Optional[float]) -> str:
    return "X" if value is None else f"{value:.1f}"


def row_average(cells: List[Optional[Cell]]) -> Optional[float]:
    """The Avg column: mean of the cell means, or None when any cell is missing."""
    if not cells or any(c is None for c in cells):
        return None
    return sum(c.mean for c in cells if c is not None) / len(cells)


@dataclasses.dataclass
class Table:
    title: str                 # text header, e.g. "Dataset: VLCS, model selection method: ..."
    heading: str               # short name: the dataset, or "Averages"
    columns: List[str]         # column labels between "Algorithm" and "Avg"
    rows: List[str]            # algorithm names
    cells: List[List[Optional[Cell]]]
    avg: List[Optional[float]]
    colwidth: int = 20
    env_indices: Optional[List[int]] = None   # column -> env index (dataset tables)
    notes: List[str] = dataclasses.field(default_factory=list)  # lines under the table


@dataclasses.dataclass
class Section:
    method_name: str
    tables: List[Table]
    key: str = ""
    metric: Optional[str] = None   # None: accuracy; else the metric the cells report

    @property
    def heading(self) -> str:
        """The model selection method, and the metric where it is not accuracy."""
        return self.method_name + ("" if self.metric is None else
                                   f", metric: {self.metric} (x100)")


@dataclasses.dataclass
class Report:
    total_records: int
    sections: List[Section]

    def has_missing(self) -> bool:
        """Whether any cell (or Avg) is X."""
        return any(c is None for s in self.sections for t in s.tables
                   for row in t.cells for c in row) or \
            any(a is None for s in self.sections for t in s.tables for a in t.avg)


def _table_strings(table: Table, style: str) -> tuple[list[str], list[list[str]]]:
    header = ["Algorithm", *table.columns, "Avg"]
    body = [[name, *(format_cell(c, style) for c in cells), format_avg(avg)]
            for name, cells, avg in zip(table.rows, table.cells, table.avg)]
    return header, body


def render_text(report: Report) -> str:
    # DomainBed's misc.print_row: cells left-justified to one column width (the table's
    # colwidth, widened to its longest cell, never truncated), joined by two spaces, and
    # print(..., "") leaves one trailing space.
    lines = [f"Total records: {report.total_records}"]
    for section in report.sections:
        for table in section.tables:
            header, body = _table_strings(table, "text")
            lines += ["", f"-------- {table.title}"]
            lines += tables.text_lines(header, body, min_width=table.colwidth, uniform=True,
                                       rule=False, end=" ")
            lines += table.notes
    return "\n".join(lines) + "\n"


latex_escape = tables.latex_escape


def render_latex(report: Report) -> str:
    lines = ["\\documentclass{article}", "\\usepackage{booktabs}",
             "\\usepackage{adjustbox}", "\\begin{document}",
             "\\section{Full DomainBed results}",
             f"% Total records: {report.total_records}"]
    for section in report.sections:
        lines += ["", f"\\subsection{{Model selection: {latex_escape(section.heading)}}}"]
        for table in section.tables:
            header, body = _table_strings(table, "latex")
            header = ["\\textbf{" + latex_escape(c) + "}" for c in header]
            body = [[latex_escape(row[0]), *row[1:]] for row in body]
            lines += ["", f"\\subsubsection{{{latex_escape(table.heading)}}}", "",
                      "\\begin{center}", "\\adjustbox{max width=\\textwidth}{%"]
            lines += tables.latex_tabular(header, body, "l" + "c" * (len(table.columns) + 1),
                                          pad=table.colwidth, escape=False)
            lines[-1] += "}"    # closes the adjustbox
            lines.append("\\end{center}")
    lines.append("\\end{document}")
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    lines = [f"Total records: {report.total_records}"]
    for section in report.sections:
        lines += ["", f"## Model selection: {section.heading}"]
        for table in section.tables:
            header, body = _table_strings(table, "markdown")
            lines += ["", f"### {tables.markdown_escape(table.heading)}", ""]
            lines += tables.markdown_lines(header, body, [None] + ["center"] * (len(header) - 1))
            lines += ["", *table.notes] if table.notes else []
    if report.has_missing():
        lines += ["", MISSING_NOTE + "."]
    return "\n".join(lines) + "\n"


def render_html(report: Report) -> str:
    """An HTML fragment (``templates/report.html.j2``): a heading per model selection
    method, a table per dataset."""
    sections = []
    for section in report.sections:
        shown = []
        for table in section.tables:
            header, body = _table_strings(table, "markdown")
            shown.append({"heading": table.heading, "header": header, "rows": body,
                          "align": ["left"] + ["center"] * (len(header) - 1)})
        sections.append({"method_name": section.heading, "tables": shown})
    return render_template(__package__, "report.html.j2",
                           total_records=report.total_records, sections=sections,
                           missing_note=MISSING_NOTE if report.has_missing() else None)


CSV_COLUMNS = ["selection_method", "table", "algorithm", "column", "env", "mean",
               "stderr", "n_trials"]   # the leaderboard's CSV starts with these, too


def render_csv(report: Report) -> str:
    """Long format: one line per cell (Avg cells included, with empty stderr/n_trials);
    means and standard errors in percent, unrounded; missing cells have an empty mean, a
    cell of one trial an empty stderr (no spread to show); `metric`: what the cells
    report (accuracy unless --metric)."""
    rows = []
    for section in report.sections:
        metric = section.metric or "accuracy"
        for table in section.tables:
            envs: Sequence[int | str] = table.env_indices or [""] * len(table.columns)
            for name, cells, avg in zip(table.rows, table.cells, table.avg):
                for column, env, cell in zip(table.columns, envs, cells):
                    rows.append([section.method_name, table.heading, name, column, env,
                                 "" if cell is None else repr(cell.mean),
                                 "" if cell is None or cell.n < 2 else repr(cell.err),
                                 "" if cell is None else cell.n, metric])
                rows.append([section.method_name, table.heading, name, "Avg", "",
                             "" if avg is None else repr(avg), "", "", metric])
    return csv_text([*CSV_COLUMNS, "metric"], rows)


RENDERERS = {"text": render_text, "markdown": render_markdown, "latex": render_latex,
             "csv": render_csv, "html": render_html}


def render(report: Report, fmt: str = "text") -> str:
    """The whole report in ``fmt`` (one of :data:`FORMATS`); an unknown format is an
    UnknownNameError (a UserError) naming the valid ones."""
    tables.check_format(fmt)
    return RENDERERS[fmt](report)
