"""Rendering results tables: text (as DomainBed's collect_results prints), markdown,
LaTeX (as DomainBed's ``--latex``) and CSV (long format, one row per cell).

A Report holds Sections (one per model selection method), each a list of Tables.
Cells are Cell(mean, err, n) in percent, or None for a missing cell ('X').
"""
import csv
import dataclasses
import io
from typing import List, Optional

import numpy as np

FORMATS = ("text", "markdown", "latex", "csv")
SUFFIXES = {"text": "txt", "markdown": "md", "latex": "tex", "csv": "csv"}


@dataclasses.dataclass
class Cell:
    mean: float   # percent
    err: float    # standard error, percent
    n: int        # number of trials


def summarize(values):
    """Accuracies (fractions) over trials -> Cell(mean, standard error) in percent, or
    None when empty. Standard error = np.std (ddof 0) / sqrt(n), as DomainBed."""
    values = [float(v) for v in values]
    if not values:
        return None
    data = np.asarray(values)
    return Cell(100 * float(np.mean(data)),
                100 * float(np.std(data / np.sqrt(len(data)))), len(data))


def format_cell(cell, style="text"):
    if cell is None:
        return "X"
    sep = {"text": "+/-", "latex": "$\\pm$", "markdown": "±"}.get(style, "+/-")
    return f"{cell.mean:.1f} {sep} {cell.err:.1f}"


def format_avg(value):
    return "X" if value is None else f"{value:.1f}"


def row_average(cells):
    """The Avg column: mean of the cell means, or None when any cell is missing."""
    if not cells or any(c is None for c in cells):
        return None
    return sum(c.mean for c in cells) / len(cells)


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


@dataclasses.dataclass
class Section:
    method_name: str
    tables: List[Table]
    key: str = ""


@dataclasses.dataclass
class Report:
    total_records: int
    sections: List[Section]


def _text_row(cells, width):
    # DomainBed's misc.print_row: cells left-justified to the column width, joined by two
    # spaces, and print(..., "") leaves one trailing space. Columns widen, never truncate.
    return "  ".join(str(c).ljust(width) for c in cells) + " "


def _table_strings(table, style):
    header = ["Algorithm", *table.columns, "Avg"]
    body = [[name, *(format_cell(c, style) for c in cells), format_avg(avg)]
            for name, cells, avg in zip(table.rows, table.cells, table.avg)]
    return header, body


def render_text(report):
    lines = [f"Total records: {report.total_records}"]
    for section in report.sections:
        for table in section.tables:
            header, body = _table_strings(table, "text")
            width = max([table.colwidth] + [len(str(c)) for row in [header, *body]
                                            for c in row])
            lines += ["", f"-------- {table.title}", _text_row(header, width)]
            lines += [_text_row(row, width) for row in body]
    return "\n".join(lines) + "\n"


def latex_escape(text):
    special = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "#": "\\#",
               "_": "\\_", "$": "\\$", "{": "\\{", "}": "\\}"}
    return "".join(special.get(char, char) for char in str(text))


def render_latex(report):
    lines = ["\\documentclass{article}", "\\usepackage{booktabs}",
             "\\usepackage{adjustbox}", "\\begin{document}",
             "\\section{Full DomainBed results}",
             f"% Total records: {report.total_records}"]
    for section in report.sections:
        lines += ["", f"\\subsection{{Model selection: {latex_escape(section.method_name)}}}"]
        for table in section.tables:
            header, body = _table_strings(table, "latex")
            header = ["\\textbf{" + latex_escape(c) + "}" for c in header]
            body = [[latex_escape(row[0]), *row[1:]] for row in body]
            lines += ["", f"\\subsubsection{{{latex_escape(table.heading)}}}", "",
                      "\\begin{center}", "\\adjustbox{max width=\\textwidth}{%",
                      "\\begin{tabular}{l" + "c" * (len(table.columns) + 1) + "}",
                      "\\toprule"]
            width = table.colwidth
            for r, row in enumerate([header, *body]):
                lines.append(" & ".join(str(c).ljust(width) for c in row) + " \\\\")
                if r == 0:
                    lines.append("\\midrule")
            lines += ["\\bottomrule", "\\end{tabular}}", "\\end{center}"]
    lines.append("\\end{document}")
    return "\n".join(lines) + "\n"


def _md(text):
    return str(text).replace("|", "\\|")


def render_markdown(report):
    lines = [f"Total records: {report.total_records}"]
    for section in report.sections:
        lines += ["", f"## Model selection: {section.method_name}"]
        for table in section.tables:
            header, body = _table_strings(table, "markdown")
            lines += ["", f"### {_md(table.heading)}", "",
                      "| " + " | ".join(_md(c) for c in header) + " |",
                      "|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|"]
            lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["selection_method", "table", "algorithm", "column", "env", "mean",
               "stderr", "n_trials"]


def render_csv(report):
    """Long format: one line per cell (Avg cells included, with empty stderr/n_trials);
    means and standard errors in percent, unrounded; missing cells have an empty mean."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for section in report.sections:
        for table in section.tables:
            envs = table.env_indices or [""] * len(table.columns)
            for name, cells, avg in zip(table.rows, table.cells, table.avg):
                for column, env, cell in zip(table.columns, envs, cells):
                    writer.writerow([section.method_name, table.heading, name, column, env,
                                     "" if cell is None else repr(cell.mean),
                                     "" if cell is None else repr(cell.err),
                                     "" if cell is None else cell.n])
                writer.writerow([section.method_name, table.heading, name, "Avg", "",
                                 "" if avg is None else repr(avg), "", ""])
    return buf.getvalue()


RENDERERS = {"text": render_text, "markdown": render_markdown, "latex": render_latex,
             "csv": render_csv}


def render(report, fmt="text"):
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    return RENDERERS[fmt](report)
