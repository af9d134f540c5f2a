"""Two leaderboard analyses beyond the tables: each algorithm's effective robustness
(``analysis.aotl``) and how sure the ranking is (``analysis.selection_stats``).

``effective_robustness(model, records_by_label)`` gives leaderboard.json's
``effective_robustness``; ``leaderboard_stats(records, methods)`` its ``stats``. The
``*_panel`` functions turn each into the view the ``boards_panel`` macro lays out: a list
of sortable ``pages.Board`` tables with a title and an intro.
"""
from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis import aotl
from analysis import selection_stats as stats
from analysis.aotl.inputs import accuracies_from_records
from domainbed.leaderboard.pages import Board, Cell, Row, slug
from domainbed.results import model_selection as ms
from oodutils.errors import UserError
from oodutils.plotting import figure_and_axes, save_figure

ER_FIT = ("per leave-one-domain-out split, one probit line of OOD accuracy on mean ID "
          "accuracy (the `out` splits) through every checkpoint of the dataset's runs, as "
          "the accuracy-on-the-line panel")
ER_STDERR = ("er_stderr: mean over the selected models of the fitted line's standard "
             "error at each model's ID accuracy (probit units; an upper bound on the "
             "line's standard error at their mean)")
DEFAULT_BOOTSTRAPS = 200


# ------------------------------------------------------------------ effective robustness
def _split_fits(acc: Any) -> list[dict[str, Any]]:
    table = aotl.per_ood_table(acc)
    return [{"dataset": str(r["dataset"]), "ood_env": int(r["ood_env"]), "n": int(r["n"]),
             "slope": float(r["slope"]), "intercept": float(r["intercept"]),
             "r": float(r["r"]), "stderr": float(r["stderr"]),
             "intercept_stderr": float(r["intercept_stderr"])}
            for r in table.to_dict("records")]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def _selected_er(section: dict, table: dict, by_checkpoint: dict) -> list[dict[str, Any]]:
    """One row per (algorithm, test env) cell: the mean effective robustness of the
    models the selection method chose (one per trial)."""
    rows = []
    for r in table["rows"]:
        for c in r["cells"]:
            found = [by_checkpoint[key] for key in
                     ((str(x["run_dir"]), int(x["step"])) for x in c["runs"])
                     if key in by_checkpoint]
            if not found:
                continue
            rows.append({
                "method": section["key"], "dataset": table["dataset"],
                "algorithm": r["algorithm"], "test_env": int(c["env"]),
                "n_models": len(found),
                "effective_robustness": _mean([f["effective_robustness"] for f in found]),
                "er": _mean([f["er"] for f in found]),
                "er_stderr": _mean([f["er_stderr"] for f in found]),
                "id_acc": _mean([f["id_acc"] for f in found]),
                "ood_acc": _mean([f["ood_acc"] for f in found])})
    return rows


def effective_robustness(model: dict, records_by_label: dict[str, list]) -> dict[str, Any]:
    """Per selection method, dataset, algorithm and test environment: the selected models'
    OOD accuracy above (+) or below (-) the split's accuracy-on-the-line fit (Taori et al.
    2020), in accuracy points (`effective_robustness`) and probit units (`er`, with the
    fit's standard error `er_stderr`); the fits themselves; why a dataset has none."""
    cells: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for dataset in model["datasets"]:
        label = dataset["label"]
        try:
            acc = accuracies_from_records(records_by_label.get(label, []), split="out",
                                          checkpoints="all")
            table = aotl.effective_robustness_table(acc)
            fits += [{**f, "dataset": label} for f in _split_fits(acc)]
        except UserError as e:
            missing[label] = str(e)
            continue
        by_checkpoint = {(str(row["run"]), int(row["step"])): row
                         for row in table.to_dict("records") if pd.notna(row["step"])}
        for section in model["sections"]:
            for t in section["tables"]:
                if t["dataset"] == label:
                    cells += _selected_er(section, t, by_checkpoint)
    return {"fit": ER_FIT, "stderr": ER_STDERR, "cells": cells, "fits": fits,
            "missing": missing}


def _er_cell(rows: list[dict[str, Any]]) -> Cell:
    if not rows:
        return Cell("—", classes=("na",))
    er = _mean([r["effective_robustness"] for r in rows])
    se = _mean([r["er_stderr"] for r in rows])
    return Cell(f"{er:+.1f}", repr(er), classes=("pos",) if er > 0 else (),
                counts=f"fit SE {se:.3f} probit")


def effective_robustness_panel(data: dict[str, Any], model: dict, label: str,
                               env_names: Sequence[str]) -> dict[str, Any]:
    """The dataset page's panel: one board per selection method, algorithms by test
    environment (and their average), in accuracy points above the line."""
    view: dict[str, Any] = {"kind": "boards", "title": "Effective robustness (Taori et al. "
                            "2020)", "missing": data["missing"].get(label), "boards": [],
                            "images": [],
                            "intro": "Selected models' OOD accuracy minus the accuracy-on-"
                                     f"the-line prediction, in points (mean over trials); "
                                     f"fit: {ER_FIT}; {ER_STDERR}."}
    mine = [c for c in data["cells"] if c["dataset"] == label]
    for section in model["sections"]:
        rows = [c for c in mine if c["method"] == section["key"]]
        if not rows:
            continue
        envs = sorted({c["test_env"] for c in rows})
        by_alg: dict[str, list] = collections.defaultdict(list)
        for c in rows:
            by_alg[c["algorithm"]].append(c)
        board = Board([_env_name(env_names, e) for e in envs] + ["Avg"], [],
                      heading=f"Model selection: {section['name']}")
        for alg, cs in by_alg.items():
            cells = [Cell(alg, sort=alg)]
            cells += [_er_cell([c for c in cs if c["test_env"] == e]) for e in envs]
            cells.append(_er_cell(cs))
            board.rows.append(Row(alg, cells, "user"))
        view["boards"].append(board)
    if view["missing"] is None and not view["boards"]:
        view["missing"] = "no selected model has a checkpoint on the fitted line"
    return view


def _env_name(names: Sequence[str], env: int) -> str:
    return str(names[env]) if env < len(names) else f"env {env}"


# ------------------------------------------------------------------ how sure the ranking is
def _records_of(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def leaderboard_stats(records: list, methods: Sequence[type[ms.SelectionMethod]],
                      n_boot: int = DEFAULT_BOOTSTRAPS, seed: int = 0) -> dict[str, Any]:
    """{method key: the four statistics of ``stats.stats_tables`` as JSON rows} for every
    method they apply to; a method they cannot be computed for gets its reason."""
    out: dict[str, Any] = {}
    for method in methods:
        if not stats.applies_to(method) or not records:
            continue
        try:
            tables = stats.stats_tables(records, method, n_boot, seed)
        except (UserError, ValueError) as e:   # e.g. a degenerate sweep scipy refuses
            out[method.key] = {"missing": str(e)}
            continue
        out[method.key] = {
            "missing": None, "n_boot": n_boot, "kendall_tau": tables["kendall_tau"],
            "rank_stability": _records_of(tables["rank_stability"].reset_index()),
            "paired_vs_erm": _records_of(tables["paired"]),
            "selection_regret": _records_of(tables["regret"].reset_index()),
            "expected_best": _records_of(tables["expected_best"])}
    return out


def _fmt(value: Any, digits: int) -> str:
    if isinstance(value, (float, np.floating)):
        return "—" if np.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def frame_board(rows: list[dict[str, Any]], heading: str, digits: int = 2) -> Board:
    """A sortable board of JSON rows (first column: the row's name)."""
    columns = list(rows[0]) if rows else []
    first = str(columns[0]).replace("_", " ").capitalize() if columns else "Algorithm"
    board = Board(columns[1:], [], heading, first=first)
    for row in rows:
        name = str(row[columns[0]])
        board.rows.append(Row(name, [Cell(name, sort=name)] + [
            Cell(_fmt(row[c], digits), repr(row[c])) for c in columns[1:]]))
    return board


def _short_name(text: str, most: int = 30) -> str:
    text = str(text)
    return text if len(text) <= most else text[:most - 1] + "…"


def plot_expected_best(rows: list[dict[str, Any]], title: str, path: str) -> None:
    """Expected best accuracy against the number of hyperparameter draws, one line per
    (dataset, algorithm)."""
    fig, ax = figure_and_axes(None, (6, 4))
    for row in rows:
        ks = [int(c[2:]) for c in row if c.startswith("k=")]
        ax.plot(ks, [row[f"k={k}"] for k in ks], marker="o",
                label=f"{_short_name(row['dataset'])}: {_short_name(row['algorithm'])}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hyperparameter draws k")
    ax.set_ylabel("expected best test accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def stats_panel(data: dict[str, Any], model: dict, site_dir: str | None = None
                ) -> dict[str, Any]:
    """The index page's panel: per selection method, the four statistics (with the
    expected-best curves drawn into `site_dir`/img when given)."""
    boards: list[Board] = []
    images: list[dict[str, str]] = []
    names = {s["key"]: s["name"] for s in model["sections"]}
    missing = []
    for key, st in data.items():
        if st["missing"]:
            missing.append(f"{names.get(key, key)}: {st['missing']}")
            continue
        tau = st["kendall_tau"]
        agreement = ("n/a (one algorithm)" if np.isnan(tau["mean"]) else
                     f"{tau['mean']:.2f} [{tau['low']:.2f}, {tau['high']:.2f}]")
        name = names.get(key, key)
        boards += [
            frame_board(st["rank_stability"], f"Rank stability, {name}: P(rank) over "
                        f"{st['n_boot']} bootstrap resamples of trials and hyperparameter "
                        f"draws; Kendall's tau with the whole-sweep ranking {agreement}"),
            frame_board(st["paired_vs_erm"], f"Paired comparison with ERM, {name}: mean "
                        "difference (points) on shared (trial, test environment) cells, "
                        "Wilcoxon p, Benjamini-Hochberg adjusted", digits=3),
            frame_board(st["selection_regret"], f"Selection regret, {name}: test-domain "
                        "oracle minus this method (points)"),
            frame_board(st["expected_best"], f"Expected best accuracy, {name}: after k "
                        "hyperparameter draws (Dodge et al. 2019)")]
        if site_dir is not None and st["expected_best"]:
            image = f"img/expected_best_{slug(key)}.png"
            plot_expected_best(st["expected_best"], f"Expected best accuracy, {name}",
                               os.path.join(site_dir, image))
            images.append({"src": image, "caption": f"Expected best accuracy against "
                                                    f"hyperparameter draws, {name}"})
    return {"kind": "boards", "title": "How sure is this leaderboard?",
            "intro": "From analysis.selection_stats (collect_results --stats).",
            "missing": "; ".join(missing) if missing and not boards else None,
            "boards": [b for b in boards if b.rows], "images": images}
