"""HTML pages of the leaderboard, from the model dict (``model.build_model``).

Pages: ``index.html`` (overview per selection method), ``dataset_<slug>.html`` (per test
environment, with the published rows and analysis panels), ``runs_<slug>_<method>.html``
(the runs behind each cell, one anchor per cell), ``card_<slug>.html`` (the dataset's
benchmark card) and ``published.html`` (every shipped source). This module turns the
model into plain view data (tables of cells, sections); the Jinja2 templates in
``templates/`` lay it out, autoescaped. Every link is a relative path built from slugs
(only a published source's http(s) address leaves the site); the only scripts and
styles are the site's own files.
"""
import dataclasses
import hashlib
import json
import re
from typing import Any, Optional

from domainbed.leaderboard.published import format_published
from oodutils.templating import render

STYLE = "assets/style.css"
SCRIPT = "assets/leaderboard.js"
RANK_NOTE = "Rank per dataset after each cell (#1 = best); gain over ERM on the Avg column."


def slug(text: str) -> Any:
    """A file-name-safe form of `text`, one per text: a short plain name (letters, digits,
    `_`, `.`) stays as it is; any other gets its cleaned first 60 characters and `-` with
    the first 10 hex digits of its sha256 ("My Data" and "My_Data" get different pages, a
    300-character name a short one; a plain name never holds `-`)."""
    text = str(text)
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,59}", text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_.]+", "_", text)[:60].strip("_.") + "-" + digest


def dataset_page(label: Any) -> str:
    return f"dataset_{slug(label)}.html"


def card_page(label: Any, ext: str = "html") -> str:
    """The benchmark card's page (``html``) or its Markdown twin (``md``)."""
    return f"card_{slug(label)}.{ext}"


def runs_page(label: Any, method_key: Any) -> str:
    return f"runs_{slug(label)}_{slug(method_key)}.html"


def cell_anchor(algorithm: Any, env: Any) -> str:
    return f"cell-{slug(algorithm)}-e{env}"


@dataclasses.dataclass
class Cell:
    """One ``<td>``: its text, the value the sort script reads, and optional parts."""
    text: str
    sort: str = ""
    classes: tuple = ()
    href: Optional[str] = None     # the text links there
    badge: Optional[str] = None    # a published row's first cell: the source's title
    source: Optional[str] = None   # ... and its short name
    rank: Optional[int] = None
    counts: Optional[str] = None   # "2 trials · 3 hparams"
    note: Optional[int] = None     # a missing cell: the number of its board's footnote
    diff: Optional[str] = None     # user minus published
    arithmetic: Optional[str] = None  # a table mixing arithmetics: this cell's, explained


@dataclasses.dataclass
class Row:
    algorithm: str
    cells: list
    kind: Optional[str] = None     # "user", "published" or None (the CSS class)


@dataclasses.dataclass
class Board:
    """A sortable table; ``columns`` after the first (`first`: Algorithm) column."""
    columns: list
    rows: list
    heading: Optional[str] = None
    footnotes: list = dataclasses.field(default_factory=list)   # reasons, numbered from 1
    first: str = "Algorithm"

    def footnote(self, reason: Any) -> Any:
        """The number of `reason`'s footnote, added once however many cells share it."""
        if reason not in self.footnotes:
            self.footnotes.append(reason)
        return self.footnotes.index(reason) + 1


def _sort_value(value: Any) -> Any:
    return "" if value is None else f"{value!r}"


def _best(rows: Any, getter: Any, n: Any, lower_is_better: bool = False) -> Any:
    """Per column, the best user value: the highest, or the lowest where lower is better
    (None where the column has none)."""
    best = []
    for i in range(n):
        values = [getter(r, i) for r in rows]
        values = [v for v in values if v is not None]
        best.append((min if lower_is_better else max)(values) if values else None)
    return best


def _best_class(value: Any, best: Any) -> Any:
    return ("best",) if value is not None and value == best else ()


def _name_cell(algorithm: Any) -> Any:
    return Cell(algorithm, sort=str(algorithm))


def _published_row(row: Any, sources: Any, n_cols: Any, extra_cols: int = 0) -> Any:
    src = sources.get(row["source"], {})
    first = Cell(row["algorithm"], sort=str(row["algorithm"]), badge=src.get("title", ""),
                 source=src.get("short", row["source"]))
    cells = [first]
    for cell in row["cells"][:n_cols] + ([row["avg"]] if "avg" in row else []):
        if cell is None:
            cells.append(Cell("—", classes=("na",)))
        else:
            cells.append(Cell(cell["text"], _sort_value(cell["mean"]),
                              diff=cell.get("diff_text")))
    cells += [Cell("")] * extra_cols
    return Row(row["algorithm"], cells, "published")


# Why an overview cell is X (the dataset's page footnotes each of its own X cells).
OVERVIEW_MISSING = ("no average: a test environment of this dataset has no selected run "
                    "(its page says which, and why)")
AVG_MISSING = "no average over datasets: a dataset's cell of this row is X"


def _overview_board(ov: Any, published_rows: Any, sources: Any, heading: Any = None,
                    lower: bool = False) -> Any:
    n = len(ov["columns"])
    best = _best(ov["rows"], lambda r, i: r["cells"][i]["mean"], n, lower)
    best_avg = _best(ov["rows"], lambda r, i: r["avg"], 1, lower)[0]
    board = Board([*ov["columns"], "Avg", "Mean rank", "Gain over ERM"], [], heading)
    for r in ov["rows"]:
        cells = [_name_cell(r["algorithm"])]
        for i, c in enumerate(r["cells"]):
            missing = c["mean"] is None
            cells.append(Cell(c["text"], _sort_value(c["mean"]), _best_class(c["mean"], best[i]),
                              href=dataset_page(ov["columns"][i]), rank=c.get("rank"),
                              note=board.footnote(OVERVIEW_MISSING) if missing else None))
        cells.append(Cell(r["avg_text"], _sort_value(r["avg"]), _best_class(r["avg"], best_avg),
                          note=board.footnote(AVG_MISSING) if r["avg"] is None else None))
        mr, gain = r["mean_rank"], r["gain_over_erm"]
        cells.append(Cell("—" if mr is None else f"{mr:.2f}",
                          _sort_value(None if mr is None else -mr)))
        cells.append(Cell("—" if gain is None else f"{gain:+.1f}", _sort_value(gain)))
        board.rows.append(Row(r["algorithm"], cells, "user"))
    board.rows += [_published_row(p, sources, n, extra_cols=3) for p in published_rows]
    return board


def _section(s: Any, intro: Any = None, missing: Any = None, boards: Any = ()) -> dict[str, Any]:
    return {"key": s["key"], "name": s["name"], "metric": s.get("metric_key", "accuracy"),
            "intro": intro, "missing": missing, "boards": list(boards)}


def all_sections(model: Any) -> list[Any]:
    """The accuracy sections, then each further metric's (the metric selector's choices)."""
    return [*model["sections"], *(s for name in model.get("metrics", [])[1:]
                                  for s in model["metric_sections"][name])]


def _metric_intro(s: Any) -> str:
    lower = " (lower is better)" if s.get("lower_is_better") else ""
    return f"Metric: {s['metric']}{lower}."


def _index_section(s: Any, sources: Any) -> Any:
    intro = f"{_metric_intro(s)} {RANK_NOTE}"
    if s["missing"]:
        return _section(s, intro, missing=s["missing"])
    headed = bool(s["extra_tables"])
    lower = bool(s.get("lower_is_better"))
    boards = [_overview_board(s["overview"], s["published_overview"], sources,
                              s["overview"]["heading"] if headed else None, lower)]
    boards += [_overview_board(extra, [], sources, extra["heading"], lower)
               for extra in s["extra_tables"]]
    return _section(s, intro, boards=boards)


def site_name(model: Any) -> str:
    """"Leaderboard of <sweep>, ..." from the input folders' names (at most three)."""
    sweeps = list(model.get("sweeps") or [])
    if not sweeps:
        return "Leaderboard"
    shown = ", ".join(sweeps[:3]) + (f" and {len(sweeps) - 3} more" if len(sweeps) > 3 else "")
    return f"Leaderboard of {shown}"


def _page(template: Any, title: Any, model: Any, current: str = "", nav: Any = None,
          **context: Any) -> Any:
    """A page of the site; `nav` [(href, text)] replaces the site's navigation."""
    if nav is None:
        nav = [("index.html", "Overview")]
        nav += [(dataset_page(d["label"]), d["label"]) for d in model["datasets"]]
        nav += [("published.html", "Published")]
    nav = [{"href": href, "text": text, "current": href == current} for href, text in nav]
    return render(__package__, template, title=title, nav=nav, style=STYLE, script=SCRIPT,
                  total_records=model["total_records"], sweeps=model.get("sweeps") or [],
                  built=model.get("built"), **context)


def render_card(model: Any, card: Any, in_site: bool = True) -> Any:
    """card_<slug>.html: a benchmark card (``analysis.card.build_card``); outside a
    leaderboard site (`in_site` False) it links to nothing but its Markdown twin."""
    label = card["dataset"]
    nav = None if in_site else [(card_page(d["label"]), d["label"]) for d in model["datasets"]]
    return _page("card.html.j2", f"Benchmark card: {label}", model, card_page(label), nav,
                 card=card, markdown=card_page(label, "md"),
                 back=dataset_page(label) if in_site else None)


def _filters(model: Any, algorithms: Any) -> dict[str, Any]:
    return {"methods": [(s["key"], s["name"]) for s in model["sections"]],
            "algorithms": list(algorithms), "metrics": list(model.get("metrics", []))}


def render_index(model: Any, panels: Any = ()) -> Any:
    """index.html; ``panels``: analysis panel views (``panels.py``) shown below."""
    sources = {s["id"]: s for s in model["sources"]}
    algorithms = sorted({r["algorithm"] for s in model["sections"] if s["overview"]
                         for r in s["overview"]["rows"]})
    built = f", built {model['built']}" if model.get("built") else ""
    return _page("index.html.j2", site_name(model) + built, model, "index.html",
                 notes=model["notes"], filters=_filters(model, algorithms),
                 sections=[_index_section(s, sources) for s in all_sections(model)],
                 panels=list(panels))


def _dataset_board(section: Any, table: Any, sources: Any) -> Any:
    n, lower = len(table["columns"]), bool(section.get("lower_is_better"))
    best = _best(table["rows"], lambda r, i: r["cells"][i]["mean"], n, lower)
    best_avg = _best(table["rows"], lambda r, i: r["avg"], 1, lower)[0]
    target = runs_page(table["dataset"], section["key"])
    board = Board([*table["columns"], "Avg"], [])
    for r in table["rows"]:
        cells = [_name_cell(r["algorithm"])]
        for i, c in enumerate(r["cells"]):
            href = f'{target}#{cell_anchor(r["algorithm"], c["env"])}'
            if c["mean"] is None:
                reason = c.get("missing")
                cells.append(Cell("X", classes=("missing",), href=href,
                                  note=board.footnote(reason) if reason else None))
                continue
            cells.append(Cell(c["text"], _sort_value(c["mean"]),
                              _best_class(c["mean"], best[i]), href=href,
                              counts=f'{c["n_trials"]} trials · {c["n_hparams"]} hparams',
                              arithmetic=_arithmetic_title(table, c)))
        cells.append(Cell(r["avg_text"], _sort_value(r["avg"]), _best_class(r["avg"], best_avg)))
        board.rows.append(Row(r["algorithm"], cells, "user"))
    board.rows += [_published_row(p, sources, n) for p in table["published"]]
    return board


def _arithmetic_title(table: Any, cell: Any) -> str | None:
    """The marker's title of a cell in a table whose runs were computed by several
    arithmetics (``args.arithmetic``), or None."""
    mixed = table.get("arithmetics") or []
    if len(mixed) < 2:
        return None
    mine = sorted({r.get("arithmetic", "single") for r in cell.get("runs", [])})
    return (f"computed by {', '.join(mine)}; this table mixes runs computed by "
            f"{', '.join(mixed)} (the leaderboard's --arithmetic NAME keeps one)")


def _dataset_level_board(section: Any, label: Any) -> Any:
    """A method with dataset-level tables only (SubpopBench's): this dataset's column."""
    tables = [section["overview"], *section["extra_tables"]]
    col = section["overview"]["columns"].index(label)
    rows = []
    for i, r in enumerate(section["overview"]["rows"]):
        cells = [_name_cell(r["algorithm"])]
        cells += [Cell(t["rows"][i]["cells"][col]["text"],
                       _sort_value(t["rows"][i]["cells"][col]["mean"])) for t in tables]
        rows.append(Row(r["algorithm"], cells, "user"))
    return Board([t["heading"] for t in tables], rows)


def _dataset_section(s: Any, dataset: Any, sources: Any) -> tuple[Any, ...]:
    """(section view, algorithms shown) of selection method `s` on one dataset page."""
    table = next((t for t in s["tables"] if t["dataset"] == dataset["label"]), None)
    if table is None and s["overview"] and dataset["label"] in s["overview"]["columns"]:
        intro = "Test environment figures of the selected model (dataset-level method)."
        return _section(s, intro, boards=[_dataset_level_board(s, dataset["label"])]), []
    if table is None:
        other_metric = s.get("metric_key", "accuracy") != "accuracy"
        why = s["missing"] or (f"no {s['metric']} for this dataset"
                               if s["key"] == "worst_group" or other_metric else "no table")
        return _section(s, missing=why), []
    intro = f"{_metric_intro(s)} Each cell links to the runs behind it."
    return (_section(s, intro, boards=[_dataset_board(s, table, sources)]),
            [r["algorithm"] for r in table["rows"]])


def render_dataset(model: Any, dataset: Any, panels: Any = ()) -> Any:
    """dataset_<slug>.html; ``panels``: analysis panel views shown below the tables."""
    sources = {s["id"]: s for s in model["sources"]}
    sections, algorithms = [], set()
    for s in all_sections(model):
        view, shown = _dataset_section(s, dataset, sources)
        sections.append(view)
        algorithms.update(shown)
    envs = ", ".join(f"{i}: {n}" for i, n in enumerate(dataset["env_names"]))
    return _page("dataset.html.j2", f"{site_name(model)}: {dataset['label']}", model,
                 dataset_page(dataset["label"]), dataset=dataset, envs=envs,
                 card=card_page(dataset["label"]),
                 filters=_filters(model, sorted(algorithms)), sections=sections,
                 panels=list(panels))


def _run_row(x: Any) -> list[Any]:
    return [x["trial_seed"], x["run_dir"], x["hparams_seed"], x["step"],
            f'{100 * x["val_acc"]:.1f}', f'{100 * x["test_acc"]:.1f}', x["n_candidates"],
            json.dumps(x["hparams"], sort_keys=True)]


def render_runs(model: Any, section: Any, table: Any) -> Any:
    """runs_<slug>_<method>.html: per cell, the selected run of each trial."""
    cells = []
    for r in table["rows"]:
        for c, col in zip(r["cells"], table["columns"]):
            cells.append({"anchor": cell_anchor(r["algorithm"], c["env"]),
                          "algorithm": r["algorithm"], "column": col, "text": c["text"],
                          "missing": c.get("missing", "") if c["mean"] is None else None,
                          "runs": [_run_row(x) for x in c["runs"]]})
    return _page("runs.html.j2", f"Runs: {table['dataset']}, {section['name']}", model,
                 back=dataset_page(table["dataset"]), dataset=table["dataset"],
                 method=section["name"], cells=cells)


def _source_boards(rows: Any) -> Any:
    """One board per (selection method, table) of a source, as the source prints it."""
    tables: dict[Any, dict] = {}
    for row in rows:
        t = tables.setdefault((row["method"], row["table"]), {"columns": [], "rows": {}})
        if row["column"] not in t["columns"]:
            t["columns"].append(row["column"])
        t["rows"].setdefault(row["algorithm"], {})[row["column"]] = row
    boards = []
    for (method, name), t in tables.items():
        board_rows = [Row(alg, [_name_cell(alg)] + [
            Cell(format_published(cols[c]), _sort_value(cols[c]["mean"])) if c in cols
            else Cell("—") for c in t["columns"]]) for alg, cols in t["rows"].items()]
        boards.append(Board(t["columns"], board_rows, f"{name} ({method})"))
    return boards


def render_published(model: Any, sources: Any) -> Any:
    """published.html: every shipped source with its tables."""
    shown = [{"meta": src["source"], "boards": _source_boards(src["rows"])}
             for src in sources]
    return _page("published.html.j2", "Published reference numbers", model,
                 "published.html", sources=shown)
