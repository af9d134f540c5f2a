"""The data behind the leaderboard pages, as one JSON-able dict (``leaderboard.json``).

The numbers come from collect_results' own functions (``section_inputs``,
``build_section``) on the same records, and are formatted with ``reporting``'s
formatters, so every cell reads exactly as collect_results prints it. This module adds
what the pages need beyond the tables: trials and hyperparameter draws per cell, the runs
behind each cell, why a cell is missing, ranks, gains over ERM and the published rows.
``sections`` are accuracy tables; ``metric_sections[name]`` the same accuracy-based
selections' tables of each further metric the records carry (``metrics``: "accuracy"
first), as ``collect_results --metric NAME`` builds them.

    model = build_model(load_records(dirs), published.load_published())
"""
import collections
from typing import Any

from domainbed.leaderboard.published import format_published
from domainbed.results import grouping, model_selection
from domainbed.results import report as collect_results
from domainbed.results import tables as reporting
from oodutils.errors import UserError

BASELINE = "ERM"
LOO_NEEDS = "leave-one-domain-out needs runs with two test environments"
WGA_NEEDS = ("worst-group selection needs worst-group accuracies (env*_wga: datasets "
             "with groups)")


def _cell(cell: Any, **extra: Any) -> dict[Any, Any]:
    """A reporting.Cell as the pages show it; one trial has no standard error to show
    (its "+/- 0.0" would claim a precision nobody measured)."""
    if cell is None:
        return {"mean": None, "err": None, "n_trials": 0, "text": "X", **extra}
    text = reporting.format_cell(cell, "text") if cell.n > 1 else f"{cell.mean:.1f}"
    return {"mean": cell.mean, "err": cell.err, "n_trials": cell.n, "text": text, **extra}


def _rank(values: Any, lower_is_better: bool = False) -> dict[Any, Any]:
    """{name: rank} for the names with a value: 1 = highest (lowest where lower is
    better); ties share the best rank."""
    sign = -1 if lower_is_better else 1
    present = {k: sign * v for k, v in values.items() if v is not None}
    return {k: 1 + sum(other > v for other in present.values()) for k, v in present.items()}


class _SweepIndex:
    """What the records say about each (dataset label, algorithm): hyperparameter draws
    per test environment, whether two-test-environment runs exist, and the hparams of
    each run."""

    def __init__(self, records: Any, labels: Any) -> None:
        self.hparams = collections.defaultdict(set)      # (label, alg, env) -> keys
        self.pairs = set()                                # (label, alg) with 2 test envs
        self.algorithms = collections.defaultdict(set)    # label -> algorithms
        self.run_hparams: dict[Any, Any] = {}
        for r in records:
            args = r["args"]
            label = grouping.dataset_label(r, labels)
            alg = args.get("algorithm")
            self.algorithms[label].add(alg)
            envs = list(args.get("test_envs") or [])
            if len(envs) == 1:
                self.hparams[(label, alg, envs[0])].add(grouping.hparams_key(r))
            elif len(envs) == 2:
                self.pairs.add((label, alg))
            self.run_hparams.setdefault(r.get("run_dir"), r.get("hparams"))

    def missing_reason(self, method: Any, label: Any, alg: Any, env: Any, env_name: Any,
                       metric: Any = None) -> Any:
        if alg not in self.algorithms[label]:
            return f"no runs of {alg} on {label}"
        if method is model_selection.LeaveOneOutSelectionMethod and \
                (label, alg) not in self.pairs:
            return LOO_NEEDS
        if not self.hparams[(label, alg, env)]:
            return f"no run with test environment {env_name} alone"
        if metric is not None:
            return (f"the selected checkpoints have no {metric} (train with --metrics "
                    f"{metric}, or run domainbed-metrics)")
        return "no checkpoint could be selected (the records lack its validation accuracies)"


def _runs_of(selected: Any) -> Any:
    """{(label, alg, env): [selected row dicts]} from model_selection.select's frame."""
    runs = collections.defaultdict(list)
    for row in selected.sort_values("trial_seed", kind="stable").to_dict("records"):
        runs[(row["dataset"], row["algorithm"], int(row["test_env"]))].append(row)
    return runs


def _dataset_table(table: Any, method: Any, info: Any, index: Any, runs: Any,
                   metric: Any = None) -> dict[str, Any]:
    rows = []
    for alg, cells, avg in zip(table.rows, table.cells, table.avg):
        out = []
        for env, name, cell in zip(table.env_indices, table.columns, cells):
            behind = [{"trial_seed": _plain(r["trial_seed"]), "run_dir": r["run_dir"],
                       "step": _plain(r["step"]), "hparams_seed": _plain(r["hparams_seed"]),
                       "val_acc": r["val_acc"], "test_acc": r["test_acc"],
                       "n_candidates": int(r["n_candidates"]),
                       "arithmetic": r.get("arithmetic") or "single",
                       "hparams": index.run_hparams.get(r["run_dir"])}
                      for r in runs.get((info.label, alg, env), [])]
            extra = {"env": env, "n_hparams": len(index.hparams[(info.label, alg, env)]),
                     "runs": behind}
            if cell is None:
                extra["missing"] = index.missing_reason(method, info.label, alg, env, name,
                                                        metric)
            out.append(_cell(cell, **extra))
        rows.append({"algorithm": alg, "cells": out, "avg": avg,
                     "avg_text": reporting.format_avg(avg)})
    computed = sorted({run["arithmetic"] for row in rows for c in row["cells"]
                       for run in c["runs"]})
    return {"title": table.title, "dataset": info.label, "name": info.name,
            "columns": list(table.columns), "arithmetics": computed,
            "env_indices": list(table.env_indices), "rows": rows}


def _plain(value: Any) -> Any:
    """numpy scalars -> Python (JSON) scalars."""
    return value.item() if hasattr(value, "item") else value


def _overview(table: Any, datasets: Any, lower_is_better: bool = False) -> dict[str, Any]:
    """An averages table (columns: datasets) with ranks, mean rank and gain over ERM (an
    improvement: ERM minus the row where lower is better)."""
    def gain(mine: Any, erm: Any) -> Any:
        return (erm - mine if lower_is_better else mine - erm) \
            if mine is not None and erm is not None else None

    rows = [{"algorithm": alg, "cells": [_cell(c) for c in cells], "avg": avg,
             "avg_text": reporting.format_avg(avg)}
            for alg, cells, avg in zip(table.rows, table.cells, table.avg)]
    for d in range(len(datasets)):
        ranks: Any = _rank({r["algorithm"]: r["cells"][d]["mean"] for r in rows}, lower_is_better)
        for r in rows:
            r["cells"][d]["rank"] = ranks.get(r["algorithm"])
    base = next((r for r in rows if r["algorithm"] == BASELINE), None)
    for r in rows:
        ranks = [c["rank"] for c in r["cells"] if c.get("rank") is not None]
        r["mean_rank"] = sum(ranks) / len(ranks) if ranks else None
        r["gain_over_erm"] = gain(r["avg"], base["avg"] if base else None)
        for d, c in enumerate(r["cells"]):
            c["gain_over_erm"] = gain(c["mean"], base["cells"][d]["mean"] if base else None)
    return {"title": table.title, "heading": table.heading, "columns": list(datasets),
            "rows": rows}


def _published_rows(sources: Any, method_key: Any, table_name: Any, columns: Any,
                    user_rows: Any) -> Any:
    """Published rows of `table_name` for `method_key`, laid out on `columns` (+ Avg),
    each cell with its difference to the user's number for the same algorithm."""
    user = {r["algorithm"]: r for r in user_rows}
    out = []
    for src in sources:
        by_alg: Any = collections.OrderedDict()
        for row in src["rows"]:
            if row["method"] != method_key:
                continue
            cols = by_alg.setdefault(row["algorithm"], {})
            if row["table"] == table_name and (row["column"] in columns or
                                               row["column"] == "Avg"):
                cols[row["column"]] = row
            elif row["table"] == "Averages" and row["column"] == table_name:
                cols.setdefault("Avg", row)   # a dataset-level number, in the Avg column
        by_alg = collections.OrderedDict((k, v) for k, v in by_alg.items() if v)
        for alg, cols in by_alg.items():
            cells = [_published_cell(cols.get(c), user.get(alg), i)
                     for i, c in enumerate(columns)]
            avg = _published_cell(cols.get("Avg"), user.get(alg), None)
            out.append({"algorithm": alg, "source": src["source"]["id"], "cells": cells,
                        "avg": avg})
    return out


def _published_cell(row: Any, user_row: Any, index: Any) -> Any:
    if row is None:
        return None
    cell = {"mean": row["mean"], "err": row.get("err"), "text": format_published(row)}
    mine = None
    if user_row is not None:
        mine = user_row["avg"] if index is None else user_row["cells"][index]["mean"]
    if mine is not None and row["mean"] is not None:
        cell["diff"] = mine - row["mean"]
        cell["diff_text"] = f"{mine - row['mean']:+.1f}"
    return cell


VAL_WORST_GROUP = getattr(model_selection, "ValWorstGroupSelectionMethod", None)
VAL_WGA_NEEDS = ("SubpopBench's selection needs datasets whose environments are the "
                 "official train/val/test splits (e.g. Waterbirds), run with --test_envs 1 2")


def _methods(chosen: Any) -> list[Any]:
    """The chosen selection methods, by default every one the site lays out (SubpopBench's
    attribute-unknown, label-only selections are collect_results' only, for now)."""
    label_only = tuple(getattr(model_selection, "LABEL_ONLY_METHODS", ()))
    if chosen is not None:
        refused = [m.key for m in chosen if m in label_only]
        if refused:
            raise UserError(f"the leaderboard has no pages for {', '.join(refused)} yet; "
                            f"collect_results --selection_methods {' '.join(refused)} "
                            f"prints their tables")
        return list(chosen)
    return [m for m in model_selection.SELECTION_METHODS.values() if m not in label_only]


def build_model(loaded: Any, sources: Any = (), methods: Any = None,
                notes: Any = ()) -> dict[str, Any]:
    """Records (a records.Records) and published sources -> the leaderboard dict."""
    records = [r for r in loaded.records
               if r["args"].get("dataset") is not None and
               r["args"].get("algorithm") is not None]
    notes = list(notes)
    if loaded.skip_summary():
        notes.append(f"skipped {loaded.skip_summary()}")
        notes += [f"skipped {note}" for note in loaded.shown_notes()]
    if len(records) < len(loaded.records):
        notes.append(f"skipped {len(loaded.records) - len(records)} records without a "
                     "dataset or algorithm in their args")
    if not records:
        notes.append("no records found under " + ", ".join(loaded.input_dirs) +
                     ": the pages show the published numbers only")
    labels = grouping.dataset_labels(records)
    infos = collect_results.dataset_infos(records, labels)
    variants = collections.defaultdict(list)
    for info in infos.values():
        variants[info.name].append(info.label)
    for name, shown in variants.items():
        if len(shown) > 1:
            notes.append(f"{name} was run on {len(shown)} different data variants "
                         f"(data source, fingerprint, seed or precision); they are never "
                         f"pooled and are shown apart: {', '.join(shown)}")
    index = _SweepIndex(records, labels)
    chosen = _methods(methods)
    sections = [_section(records, m, infos, labels, index, sources) for m in chosen]
    metrics = collect_results.metrics_in(records, labels)
    metric_sections = {
        name: [_section(records, m, {k: i for k, i in infos.items() if k in with_it},
                        labels, index, (), metric=name)
               for m in chosen if m.metric == "accuracy"]
        for name, with_it in metrics.items()}
    return {
        "format": "domainbed-leaderboard/1",
        "inputs": list(loaded.input_dirs),
        "total_records": len(records),
        "notes": notes,
        "datasets": [{"label": i.label, "name": i.name, "env_names": i.env_names,
                      "has_worst_group": i.has_worst_group} for i in infos.values()],
        "sections": sections,
        "metrics": ["accuracy", *metrics],
        "metric_sections": metric_sections,
        "sources": [s["source"] for s in sources],
    }


def _section(records: Any, method: Any, infos: Any, labels: Any, index: Any, sources: Any,
             metric: Any = None) -> Any:
    """One selection method's tables of accuracy, or (`metric`) of that metric of the
    same selected checkpoints (collect_results --metric), for the datasets in `infos`."""
    head = {"key": method.key, "name": method.name, "metric": method.metric,
            "metric_key": "accuracy", "lower_is_better": False, "extra_tables": []}
    if metric is not None:
        head.update(metric=f"{metric} (x100)", metric_key=metric,
                    lower_is_better=metric in collect_results.LOWER_IS_BETTER)
        records = [r for r in records if grouping.dataset_label(r, labels) in infos]
    if method is VAL_WORST_GROUP and method is not None:
        return _val_worst_group_section(head, records, infos, labels, sources)
    inputs = collect_results.section_inputs(records, method, infos, labels) if records \
        else None
    if inputs is None:
        reason = WGA_NEEDS if method is model_selection.WorstGroupSelectionMethod and \
            records else "no records"
        return {**head, "missing": reason, "tables": [], "overview": None,
                "published_overview": []}
    section_records, section_infos, algorithms = inputs
    selected = model_selection.select(section_records, method, labels)
    section = collect_results.build_section(section_records, method, section_infos,
                                            algorithms, labels, selected, metric=metric)
    runs = _runs_of(selected)
    tables = []
    for table, info in zip(section.tables[:-1], section_infos.values()):
        data = _dataset_table(table, method, info, index, runs, metric)
        data["published"] = _published_rows(sources, method.key, info.name,
                                            data["columns"], data["rows"])
        tables.append(data)
    overview = _overview(section.tables[-1], list(section_infos), head["lower_is_better"])
    names = [section_infos[label].name for label in section_infos]
    return {**head, "missing": None, "tables": tables, "overview": overview,
            "published_overview": _published_overview(sources, method.key, names,
                                                      overview["rows"])}


def _published_overview(sources: Any, method_key: Any, names: list[str], user_rows: Any) -> Any:
    """Published dataset-level numbers for the user's datasets (by name), per source."""
    user = {r["algorithm"]: r for r in user_rows}
    out = []
    for src in sources:
        by_alg: Any = collections.OrderedDict()
        for row in src["rows"]:
            if row["method"] == method_key and row["table"] == "Averages" and \
                    row["column"] in names:
                by_alg.setdefault(row["algorithm"], {})[row["column"]] = row
        for alg, cols in by_alg.items():
            cells = []
            for i, name in enumerate(names):
                u = user.get(alg)
                cells.append(_published_cell(cols.get(name),
                                             {"cells": u["cells"]} if u else None, i))
            out.append({"algorithm": alg, "source": src["source"]["id"], "cells": cells})
    return out


def _val_worst_group_section(head: Any, records: Any, infos: Any, labels: Any,
                             sources: Any) -> dict[Any, Any]:
    """SubpopBench's selection: dataset-level tables only (test worst-group accuracy, then
    test average accuracy), as collect_results builds them."""
    covered = [label for label, i in infos.items()
               if getattr(i, "official_splits", False) and i.has_worst_group]
    if not covered:
        return {**head, "missing": VAL_WGA_NEEDS if records else "no records", "tables": [],
                "overview": None, "published_overview": []}
    section = collect_results.build_val_worst_group_section(records, infos, labels)
    overview, *extra = [_overview(t, covered) for t in section.tables]  # type: ignore[union-attr]
    names = [infos[label].name for label in covered]
    return {**head, "missing": None, "tables": [], "overview": overview,
            "extra_tables": extra,
            "published_overview": _published_overview(sources, head["key"], names,
                                                      overview["rows"])}
