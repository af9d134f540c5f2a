"""A benchmark card per dataset: on one page, what a set of sweeps says about the
benchmark itself, from the analyses this project has (each reused, never redone here).

Sections, in order: accuracy on the line per OOD split and its verdict
(``analysis.aotl``), the spread of effective robustness around those lines, validity
desiderata (``analysis.validity``: ERM Failure, Discriminative Power), diversity and
correlation shift (``ood_bench`` summaries), OODSelect's worst subsets, label-free
estimation error (``analysis.labelfree``) and rank stability (``analysis.selection_stats``).
A section the inputs cannot support is kept, with what it needs (a flag, an input).

    card = build_card(records, label, name, inputs=CardInputs(...))
    text = render_markdown(card)

The leaderboard writes ``card_<slug>.html`` and ``.md`` per dataset; ``python -m
analysis.card`` (``analysis.card.cli``) writes them from sweeps alone.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis import selection_stats as stats
from analysis.aotl import tables as aotl
from analysis.aotl.inputs import accuracies_from_records
from analysis.labelfree import estimators as labelfree
from analysis.validity import records as validity_records
from domainbed.results import model_selection as ms
from oodutils.errors import UserError
from oodutils.tables import markdown_escape
from oodutils.untrusted import parse_json, read_regular_bytes

LABELFREE_NEEDS = ("label-free estimates need saved logits: rerun the sweep with "
                   "--save_logits")
OOD_BENCH_NEEDS = ("diversity and correlation shift need an OoD-Bench summary: run "
                   "`ood-bench run --dataset {name} ... --output_dir DIR` and pass DIR "
                   "(--ood_bench DIR)")
OODSELECT_NEEDS = ("worst subsets need an OODSelect output folder for {name}: run "
                   "`oodselect ... --output_dir DIR` and pass DIR (--oodselect DIR)")
RANK_METHOD = "training-domain validation"
WORST_SUBSETS = 5


@dataclass
class CardInputs:
    """What the cards of one set of sweeps may draw on besides the records."""
    input_dirs: Sequence[str] = ()
    oodselect: Sequence[dict[str, Any]] = ()   # {"dir", "dataset", "summary": [rows]}
    ood_bench: Sequence[dict[str, Any]] = ()   # {"dir", "summary": summary.json}
    labelfree: Any = None                      # labelfree_by_dataset(...)'s result
    n_boot: int = 200
    seed: int = 0


@dataclass
class Section:
    key: str
    title: str
    summary: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    needs: str | None = None          # why this section is empty, and what it needs

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "summary": self.summary,
                "columns": self.columns, "rows": self.rows, "needs": self.needs}


def _fmt(value: Any, digits: int = 3) -> Any:
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else round(float(value), digits)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _frame_rows(frame: pd.DataFrame, columns: Sequence[str], digits: int = 3
                ) -> list[list[Any]]:
    return [[_fmt(v, digits) for v in row] for row in frame[list(columns)].itertuples(
        index=False, name=None)]


def _accuracies(records: list) -> Any:
    return accuracies_from_records(records, split="out", checkpoints="all")


def aotl_section(records: list) -> Section:
    s = Section("aotl", "Accuracy on the line")
    try:
        table = aotl.per_ood_table(_accuracies(records))
    except UserError as e:
        s.needs = str(e)
        return s
    columns = [c for c in ("ood_env", "n", "slope", "r", "verdict", "warning")
               if c in table]
    s.columns, s.rows = columns, _frame_rows(table, columns)
    counts = table["verdict"].value_counts()
    s.summary = (f"{len(table)} OOD split(s), analysis.aotl's verdicts: " +
                 ", ".join(f"{verdict} {n}" for verdict, n in counts.items()))
    return s


def effective_robustness_section(records: list) -> Section:
    s = Section("effective_robustness", "Effective robustness spread")
    try:
        table = aotl.effective_robustness_table(_accuracies(records))
    except UserError as e:
        s.needs = str(e)
        return s
    s.columns = ["ood_env", "n", "sd", "min", "max"]
    grouped = table.groupby("ood_env")["effective_robustness"]
    spread = pd.DataFrame({"n": grouped.size(), "sd": grouped.std(), "min": grouped.min(),
                           "max": grouped.max()}).reset_index()
    s.rows = _frame_rows(spread, s.columns, 2)
    s.summary = ("OOD accuracy minus the line's prediction, in points, over every "
                 "checkpoint of each split: a wide spread means some models are far more "
                 "(or less) robust than their ID accuracy predicts")
    return s


def validity_section(records: list, name: str) -> Section:
    s = Section("validity", "Validity desiderata (Bell et al. 2024)")
    try:
        results = validity_records.group_results(records)
        report = validity_records.validity_report(results, with_mi=False)
    except UserError as e:
        s.needs = f"{e} (it also needs ERM and at least one other algorithm)"
        return s
    report = report.reset_index()
    columns = [c for c in ("benchmark", "erm_failure", "disc_power", "best_method",
                           "best_wga", "valid") if c in report]
    s.columns, s.rows = columns, _frame_rows(report, columns, 2)
    s.summary = ("ERM Failure (SD of ERM's group accuracies) and Discriminative Power (SD "
                 "of methods' worst-group accuracy), in points")
    return s


def ood_bench_section(name: str, summaries: Sequence[dict[str, Any]]) -> Section:
    s = Section("ood_bench", "Diversity and correlation shift (OoD-Bench)")
    mine = [x for x in summaries
            if ((x.get("summary") or {}).get("config") or {}).get("dataset") == name]
    if not mine:
        s.needs = OOD_BENCH_NEEDS.format(name=name)
        return s
    s.columns = ["dir", "envs_p", "envs_q", "diversity", "correlation", "n_trials"]
    for x in mine:
        summary, config = x["summary"], x["summary"].get("config") or {}
        s.rows.append([x["dir"], str(config.get("envs_p")), str(config.get("envs_q")),
                       _mean_se(summary.get("diversity")),
                       _mean_se(summary.get("correlation")), summary.get("n_trials")])
    s.summary = "mean ± standard error over OoD-Bench's trials"
    return s


def _mean_se(value: Any) -> str:
    if isinstance(value, dict) and value.get("mean") is not None:
        se = value.get("se")
        return f"{value['mean']:.4f}" + ("" if se is None else f" ± {se:.4f}")
    return "—"


def oodselect_section(name: str, outputs: Sequence[dict[str, Any]]) -> Section:
    s = Section("oodselect", "OODSelect's worst subsets")
    mine = [x for x in outputs if x.get("dataset") == name]
    if not mine:
        s.needs = OODSELECT_NEEDS.format(name=name)
        return s
    s.columns = ["dir", "method", "n", "r_test"]
    rows = []
    for x in mine:
        for row in x.get("summary") or []:
            try:
                r = float(row.get("r_test", "nan"))
            except ValueError:
                r = float("nan")
            rows.append([x["dir"], row.get("method"), row.get("n"), _fmt(r)])
    rows.sort(key=lambda r: (np.inf if r[3] is None else r[3]))
    s.rows = rows[:WORST_SUBSETS]
    s.summary = ("the subsets of OOD examples with the lowest ID-OOD correlation "
                 "(r_test): where accuracy on the line breaks")
    return s


def labelfree_by_dataset(input_dirs: Sequence[str]) -> dict[str, Any] | str:
    """{dataset name: (summary frame, verdicts frame)} from the sweeps' saved logits, or
    the reason there are none."""
    try:
        checkpoints = labelfree.checkpoints_from_sweep(list(input_dirs))
    except UserError as e:
        return f"{LABELFREE_NEEDS} ({e})" if "--save_logits" not in str(e) else str(e)
    estimates, agreement = labelfree.estimate(checkpoints)
    n_models = estimates[estimates["method"] == "avg_conf"].groupby(
        ["dataset", "env"]).size().to_dict()
    summary, verdicts = labelfree.summary(estimates), labelfree.verdicts(agreement, n_models)
    return {str(d): (summary[summary["dataset"] == d], verdicts[verdicts["dataset"] == d])
            for d in summary["dataset"].unique()}


def labelfree_section(name: str, found: dict[str, Any] | str | None) -> Section:
    s = Section("labelfree", "Label-free estimation error")
    if found is None:
        s.needs = LABELFREE_NEEDS
        return s
    if isinstance(found, str) or name not in found:
        s.needs = found if isinstance(found, str) else \
            f"no {name} run saved logits: {LABELFREE_NEEDS}"
        return s
    summary, verdicts = found[name]
    wide = summary.pivot_table(index="env", columns="method", values="mae").reset_index()
    wide = wide.merge(verdicts[["env", "verdict"]], on="env", how="left")
    s.columns = [str(c) for c in wide.columns]
    s.rows = _frame_rows(wide, list(wide.columns), 2)
    s.summary = ("mean absolute error (points) of each label-free estimate of OOD "
                 "accuracy, and whether it can be trusted (agreement on the line)")
    return s


def rank_section(records: list, n_boot: int, seed: int) -> Section:
    s = Section("rank_stability", "Rank stability")
    method = ms.IIDAccuracySelectionMethod
    candidates = stats.candidate_table(records, method)
    if candidates.empty:
        s.needs = "rank stability needs runs with a single test environment and trials"
        return s
    ranks, tau = stats.rank_stability(candidates, n_boot=n_boot, seed=seed)
    ranks = ranks.reset_index()
    s.columns = [str(c) for c in ranks.columns]
    s.rows = _frame_rows(ranks, list(ranks.columns), 2)
    agreement = ("n/a (one algorithm)" if np.isnan(tau["mean"]) else
                 f"{tau['mean']:.2f} [{tau['low']:.2f}, {tau['high']:.2f}]")
    s.summary = (f"{RANK_METHOD} selection; P(rank) over {n_boot} bootstrap resamples of "
                 f"trials and hyperparameter draws; Kendall's tau with the whole-sweep "
                 f"ranking {agreement}")
    return s


def build_card(records: list, label: str, name: str,
               inputs: CardInputs | None = None) -> dict[str, Any]:
    """The card of one dataset (its records only): a dict with the dataset's label and
    name and the sections, each with a summary line, a small table or what it needs."""
    inputs = inputs or CardInputs()
    sections = [aotl_section(records), effective_robustness_section(records),
                validity_section(records, name), ood_bench_section(name, inputs.ood_bench),
                oodselect_section(name, inputs.oodselect),
                labelfree_section(name, inputs.labelfree),
                rank_section(records, inputs.n_boot, inputs.seed)]
    return {"dataset": label, "name": name, "n_records": len(records),
            "n_runs": len({r.get("run_dir") for r in records}),
            "sections": [s.as_dict() for s in sections]}


def _md_cell(value: Any) -> str:
    """One cell or line of the card (``oodutils.tables.markdown_escape``; None: a dash)."""
    return "—" if value is None else markdown_escape(value)


def render_markdown(card: dict[str, Any]) -> str:
    """The card as Markdown (cells escaped: a dataset or run name cannot break a table
    or become markup)."""
    lines = [f"# Benchmark card: {_md_cell(card['dataset'])}", "",
             f"{card['n_runs']} runs, {card['n_records']} checkpoint records.", ""]
    for s in card["sections"]:
        lines += [f"## {s['title']}", ""]
        if s["needs"]:
            lines += [f"Not available: {_md_cell(s['needs'])}", ""]
            continue
        if s["summary"]:
            lines += [_md_cell(s["summary"]), ""]
        if s["columns"]:
            lines.append("| " + " | ".join(_md_cell(c) for c in s["columns"]) + " |")
            lines.append("|" + "---|" * len(s["columns"]))
            lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in s["rows"]]
            lines.append("")
    return "\n".join(lines)


def read_ood_bench_summaries(dirs: Sequence[str]) -> list[dict[str, Any]]:
    """{"dir", "summary"} of each OoD-Bench output folder (its summary.json)."""
    out = []
    for d in dirs:
        path = os.path.join(d, "summary.json")
        try:
            summary = parse_json(read_regular_bytes(path, 16 << 20).decode("utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"--ood_bench {d!r}: cannot read summary.json ({e}); give the "
                            f"--output_dir of `ood-bench run`") from None
        if not isinstance(summary, dict):
            raise UserError(f"--ood_bench {d!r}: summary.json is not an object")
        out.append({"dir": str(d), "summary": summary})
    return out

