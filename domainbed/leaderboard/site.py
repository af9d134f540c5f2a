"""Build the static site: read the sweeps, build the model, write every page, the assets,
the images, ``leaderboard.json`` and ``leaderboard.csv``.

The site is written into a staging folder beside ``out`` and moved into place at the
end, so a failed build never leaves a half-written site.
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from analysis import card
from domainbed.leaderboard import model as lbmodel
from domainbed.leaderboard import pages, panels, robustness
from domainbed.leaderboard.published import load_published
from domainbed.results import grouping, model_selection
from domainbed.results import tables as reporting
from domainbed.results.records import TABLE_FIELDS, load_records, only_arithmetic
from oodutils.csv_out import csv_text
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_text, finite_json
from oodutils.pinned_dir import current_umask

if TYPE_CHECKING:
    from domainbed.results.model_selection import SelectionMethod
    from domainbed.results.records import PathLike, Record, Records

Model = dict[str, Any]      # the leaderboard's data model (leaderboard.json)

SITE_MARKER = "leaderboard.json"
ASSETS = ("style.css", "leaderboard.js")
CSV_COLUMNS = reporting.CSV_COLUMNS + ["n_hparams", "source", "text", "diff_vs_published",
                                       "metric"]


@dataclass
class SiteExtras:
    """Inputs of the analyses beyond the tables: OoD-Bench output folders for the cards,
    bootstrap resamples for the statistics."""
    ood_bench_dirs: Sequence[PathLike] = ()
    n_boot: int = robustness.DEFAULT_BOOTSTRAPS
    arithmetic: str | None = None     # only runs computed by it (--arithmetic)


def check_out_dir(out: str) -> None:
    """Refuse to replace anything but an empty folder or an earlier leaderboard site."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise UserError(f"--output_dir {out!r} exists and is not a directory")
    entries = os.listdir(out)
    if entries and SITE_MARKER not in entries:
        raise UserError(f"--output_dir {out!r} is a non-empty directory that holds no leaderboard "
                        f"({SITE_MARKER}); choose a new or empty directory")


def records_by_label(records: Iterable[Record]) -> dict[str, list[Record]]:
    """{dataset label: its records} (records without a dataset or algorithm left out)."""
    usable = [r for r in records if r["args"].get("dataset") is not None and
              r["args"].get("algorithm") is not None]
    labels = grouping.dataset_labels(usable)
    by_label: dict[str, list[Record]] = collections.defaultdict(list)
    for r in usable:
        by_label[grouping.dataset_label(r, labels)].append(r)
    return by_label


def _csv_row(method: str, table: str, algorithm: str, column: str, env: int | str,
             cell: dict[str, Any] | None, source: str = "", text: str | None = None,
             diff: float | None = None, metric: str = "accuracy") -> list[Any]:
    mean = cell.get("mean") if cell else None
    err = cell.get("err") if cell else None
    if cell and cell.get("n_trials") == 1:
        err = None   # one trial: no spread to show (as collect_results' CSV)
    return [method, table, algorithm, column, env,
            "" if mean is None else repr(mean), "" if err is None else repr(err),
            "" if mean is None or "n_trials" not in cell  # type: ignore[operator]
            else cell["n_trials"],  # type: ignore[index]
            "" if not cell or "n_hparams" not in cell else cell["n_hparams"], source,
            text if text is not None else (cell.get("text", "") if cell else ""),
            "" if diff is None else repr(diff), metric]


def render_csv(model: Model) -> str:
    """Every number on the pages, one per line. The user's rows come first, in
    collect_results' CSV layout (its columns, its order, then ours; accuracy, then each
    further metric's); published rows follow. Written by ``oodutils.csv_out``: a name
    from the records can never run as a formula or split a row."""
    rows: list[list[Any]] = []
    published: list[list[Any]] = []
    for s in pages.all_sections(model):
        if s["missing"]:
            continue
        metric = s.get("metric_key", "accuracy")
        for t in s["tables"]:
            for r in t["rows"]:
                for col, c in zip(t["columns"], r["cells"]):
                    rows.append(_csv_row(s["name"], t["dataset"], r["algorithm"], col,
                                         c["env"], c, metric=metric))
                rows.append(_csv_row(s["name"], t["dataset"], r["algorithm"], "Avg", "",
                                     {"mean": r["avg"]}, text=r["avg_text"], metric=metric))
            for p in t["published"]:
                for col, c in zip([*t["columns"], "Avg"], [*p["cells"], p["avg"]]):
                    if c is not None:
                        published.append(_csv_row(s["name"], t["dataset"], p["algorithm"],
                                                  col, "", c, p["source"],
                                                  diff=c.get("diff")))
        ov = s["overview"]
        for table in [ov, *s["extra_tables"]]:
            for r in table["rows"]:
                for col, c in zip(table["columns"], r["cells"]):
                    rows.append(_csv_row(s["name"], table["heading"], r["algorithm"], col, "",
                                         c, metric=metric))
                rows.append(_csv_row(s["name"], table["heading"], r["algorithm"], "Avg", "",
                                     {"mean": r["avg"]}, text=r["avg_text"], metric=metric))
        for p in s["published_overview"]:
            for col, c in zip(ov["columns"], p["cells"]):
                if c is not None:
                    published.append(_csv_row(s["name"], ov["heading"], p["algorithm"], col, "",
                                              c, p["source"], diff=c.get("diff")))
    return csv_text(CSV_COLUMNS, rows + published)


def _write(stage: str, name: str, text: str) -> None:
    """One page, written whole or not at all (lone surrogates as U+FFFD)."""
    atomic_write_text(os.path.join(stage, name), text)


def write_cards(folder: str, model: Model, by_label: dict[str, list[Record]],
                inputs: card.CardInputs, in_site: bool = True) -> dict[str, Any]:
    """card_<slug>.html and .md per dataset of `model`; returns {label: card} (for
    leaderboard.json). Outside a site (`in_site` False) the pages link nowhere else."""
    cards, texts = {}, {}
    for dataset in model["datasets"]:    # every card built before the first is written
        label = dataset["label"]
        cards[label] = card.build_card(by_label[label], label, dataset["name"], inputs)
        texts[pages.card_page(label)] = pages.render_card(model, cards[label], in_site)
        texts[pages.card_page(label, "md")] = card.render_markdown(cards[label])
    for name, text in texts.items():
        _write(folder, name, text)
    return cards


def _write_site(stage: str, model: Model, loaded: Records, oodselect_dirs: Sequence[PathLike],
                sources: list[dict[str, Any]], extras: SiteExtras) -> Model:
    os.makedirs(os.path.join(stage, "img"), exist_ok=True)
    by_label = records_by_label(loaded.records)
    analysis: dict[str, Any] = {"aotl": {}, "oodselect": []}
    oodselect_views = []
    for number, path in enumerate(oodselect_dirs):
        view, data = panels.oodselect_panel(path, number, stage)
        oodselect_views.append(view)
        analysis["oodselect"].append(data)
    er = robustness.effective_robustness(model, by_label)
    methods = [model_selection.get_selection_method(s["key"]) for s in model["sections"]
               if not s["missing"]]
    board_stats = robustness.leaderboard_stats(loaded.records, methods, extras.n_boot)
    for dataset in model["datasets"]:
        view, data = panels.aotl_panel(by_label[dataset["label"]], dataset["label"], stage)
        analysis["aotl"][dataset["label"]] = data
        er_view = robustness.effective_robustness_panel(er, model, dataset["label"],
                                                        dataset["env_names"])
        mine = [v for v, d in zip(oodselect_views, analysis["oodselect"])
                if d["dataset"] == dataset["name"]]
        _write(stage, pages.dataset_page(dataset["label"]),
               pages.render_dataset(model, dataset, [view, er_view, *mine]))
    cards = write_cards(stage, model, by_label, card.CardInputs(
        input_dirs=list(loaded.input_dirs), oodselect=analysis["oodselect"],
        ood_bench=card.read_ood_bench_summaries([str(d) for d in extras.ood_bench_dirs]),
        labelfree=card.labelfree_by_dataset(list(loaded.input_dirs)), n_boot=extras.n_boot))
    oodselect_views.insert(0, robustness.stats_panel(board_stats, model, stage))
    for s in model["sections"]:
        for t in s["tables"]:
            _write(stage, pages.runs_page(t["dataset"], s["key"]), pages.render_runs(model, s, t))
    _write(stage, "index.html", pages.render_index(model, oodselect_views))
    _write(stage, "published.html", pages.render_published(model, sources))
    for name in ASSETS:
        _write(stage, f"assets/{name}",
               resources.files("domainbed.leaderboard.assets").joinpath(name)
               .read_text(encoding="utf-8"))
    model = {**model, "analysis": analysis, "effective_robustness": er,
             "stats": board_stats, "cards": cards}
    _write(stage, "leaderboard.csv", render_csv(model))
    _write(stage, SITE_MARKER, json.dumps(finite_json(model), indent=1, default=str) + "\n")
    return model



def _replace(stage: str, out: str) -> None:
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=".leaderboard-old-", dir=os.path.dirname(out) or ".")
        os.rmdir(old)
        os.rename(out, old)
    os.rename(stage, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def sweep_names(input_dirs: PathLike | Sequence[PathLike]) -> list[str]:
    """The input folders' names, each once, in order: what the title calls the sweeps."""
    if isinstance(input_dirs, (str, os.PathLike)):
        input_dirs = [input_dirs]
    names: list[str] = []
    for path in input_dirs:
        name = os.path.basename(os.path.normpath(os.path.abspath(path)))
        if name not in names:
            names.append(name)
    return names


def build_site(input_dirs: PathLike | Sequence[PathLike], out: PathLike,
               oodselect_dirs: Iterable[PathLike] = (), include_unfinished: bool = False,
               methods: Sequence[type[SelectionMethod]] | None = None,
               extras: SiteExtras | None = None) -> Model:
    """Build the site into `out`; returns the model (with its "analysis",
    "effective_robustness", "stats" and "cards" parts)."""
    out = os.path.abspath(out)
    check_out_dir(out)
    for path in oodselect_dirs:
        panels.check_oodselect_dir(path)
    loaded = load_records(input_dirs, require_done=not include_unfinished, quiet=True,
                          fields=TABLE_FIELDS)
    if extras is not None and extras.arithmetic is not None:
        loaded = only_arithmetic(loaded, extras.arithmetic)
    sources = load_published()
    model = lbmodel.build_model(loaded, sources, methods)
    model["sweeps"] = sweep_names(input_dirs)
    model["built"] = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".leaderboard-", dir=parent)
    try:
        model = _write_site(stage, model, loaded, list(oodselect_dirs), sources,
                            extras or SiteExtras())
        os.chmod(stage, 0o777 & ~current_umask())   # as a plain mkdir would make it
        _replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return model
