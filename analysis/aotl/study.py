"""An accuracy-on-the-line study in one call (the `aotl-study` command): train a zoo of
small-image runs through domainbed's public API (`domainbed.api.train_zoo`), then, from the
run directories (records only), the accuracy-on-the-line tables, probit plots, OODSelect
on the most misspecified OOD environment, and `summary.md`.

The study lives in analysis because it is an analysis that starts by asking for models:
it reaches training only through `domainbed.api`, never the launch or training internals,
and domainbed never imports it."""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.aotl import tables
from analysis.aotl.options import build_parser
from analysis.oodselect import options as oodselect_options
from analysis.oodselect import protocol as oodselect_protocol
from domainbed.api import train_zoo
from domainbed.results.records import TABLE_FIELDS, load_records
from oodutils import fileio
from oodutils.errors import UserError
from oodutils.log import configure
from oodutils.tables import render


def zoo_facts(runs_dir: str) -> pd.DataFrame | None:
    """What the zoo is, from its records: runs and checkpoints per test env, algorithm
    and architecture, steps, evaluated splits, and each run's final ID accuracy."""
    recs = load_records(runs_dir, quiet=True, fields=TABLE_FIELDS).records
    if not recs:
        return None
    by_run: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in recs:
        by_run[r["run_dir"]].append(r)
    rows = []
    for run_dir, run_recs in by_run.items():
        last = max(run_recs, key=lambda r: r["step"])
        test = last["args"]["test_envs"]
        ids = [k for k in last if k.endswith("_out_acc") and k.startswith("env")
               and int(k[3:].split("_")[0]) not in test]
        rows.append({
            "run_dir": run_dir, "test_env": test[0], "algorithm": last["args"]["algorithm"],
            "arch": (f"{last['args']['backbone']} ({last['args'].get('transfer')})"
                     if last["args"].get("backbone") else last["hparams"].get("arch")),
            "width": last["hparams"].get("mlp_width"),
            "steps": last["step"] + 1, "checkpoints": len(run_recs),
            "id_acc": float(np.mean([last[k] for k in ids])) if ids else np.nan,
            "eval_splits": " ".join(last["args"].get("eval_splits") or ["all"]),
            "data_source": last["args"].get("data_source", "?")})
    return pd.DataFrame(rows)


def run_quietly(main: Callable[[list[str]], Any], argv: list[str]) -> str:
    """Call a CLI main in-process and keep what it prints (for the summary)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(argv)
    return buf.getvalue()


def run_aotl(runs_dir: str, out_dir: str) -> dict[str, str]:
    """Per-OOD and pairwise tables (markdown + csv) and probit plots under out_dir. The
    fits' warnings are left to the caller (`fit_warnings`): said once, not once per file."""
    paths = {"per_ood_csv": os.path.join(out_dir, "aotl_per_ood.csv"),
             "per_ood_md": os.path.join(out_dir, "aotl_per_ood.md"),
             "pairwise_csv": os.path.join(out_dir, "aotl_pairwise.csv"),
             "pairwise_md": os.path.join(out_dir, "aotl_pairwise.md"),
             "plots": os.path.join(out_dir, "plots")}
    try:
        _write_aotl_files(runs_dir, paths)
    finally:
        configure(0)   # the messages' default again (aotl ran with -qq)
    return paths


def _aotl(argv: list[str]) -> int:
    """The aotl command's work on `argv` (its options, no process exit)."""
    return tables.run(build_parser().parse_args(argv))


def _write_aotl_files(runs_dir: str, paths: dict[str, str]) -> None:
    for table in ("per-ood", "pairwise"):
        stem = table.replace("-", "_")
        for fmt in ("csv", "markdown"):
            output = paths[f"{stem}_{'md' if fmt == 'markdown' else 'csv'}"]
            argv = [runs_dir, "--table", table, "--format", fmt, "--output", output, "-qq"]
            try:
                _aotl(argv)
            except UserError as e:   # the per-OOD fits are the study; pairwise may fail
                if table == "per-ood":
                    raise
                fileio.atomic_write_text(output, f"pairwise fits not computed: {e}\n")
    os.makedirs(paths["plots"], exist_ok=True)
    try:
        _aotl([runs_dir, "--plot", paths["plots"], "--format", "csv", "--output",
                   os.path.join(paths["plots"], "per_ood.csv"), "-qq"])
    except UserError as e:   # a degenerate (e.g. tiny) zoo: the tables still stand
        paths["plot_error"] = str(e)


def pick_ood_env(per_ood: pd.DataFrame) -> int:
    """The OOD environment with the lowest correlation (most misspecified)."""
    return int(per_ood.sort_values("r").iloc[0]["ood_env"])


def run_oodselect(runs_dir: str, dataset: str, ood_env: int, out_dir: str, steps: int = 1500,
                  seed: int = 0) -> tuple[pd.DataFrame, list[str]]:
    """OODSelect's summary table and its small-input warnings (split.json)."""
    argv = ["--input_dir", runs_dir, "--dataset", dataset, "--ood_env", str(ood_env),
            "--output_dir", out_dir, "--steps", str(steps), "--patience", str(max(100, steps // 5)),
            "--seed", str(seed), "--baselines", "random", "hard", "--quiet", "--quiet"]
    configure(-2)   # as -qq: its small-input warnings come back in split.json, said once
    try:
        oodselect_protocol.run(oodselect_options.build_parser().parse_args(argv))
    finally:
        configure(0)
    with open(os.path.join(out_dir, "split.json")) as f:
        warnings = json.load(f).get("warnings", [])
    return pd.read_csv(os.path.join(out_dir, "summary.csv")), warnings


def _md(df: pd.DataFrame, digits: int = 3) -> str:
    return render(df, "markdown", digits).strip() if len(df) else "(empty)"


def fit_warnings(per_ood: pd.DataFrame) -> list[str]:
    """One line per per-OOD fit with too few points (analysis.aotl's `warning` column)."""
    if "warning" not in per_ood:
        return []
    return [f"OOD env {int(row['ood_env'])}: {row['warning']}"
            for _, row in per_ood.iterrows() if isinstance(row["warning"], str) and
            row["warning"]]


def _warning_lines(warnings: Sequence[str]) -> list[str]:
    """Markdown for warnings a reader must not miss: the input is too small."""
    if not warnings:
        return []
    return ["**Warning: too little input for these numbers to mean much.**", ""] + \
        [f"- {w}" for w in warnings] + [""]


def write_summary(path: str, dataset: str, facts: pd.DataFrame, per_ood: pd.DataFrame,
                  pairwise_md: str, plots: Sequence[str],
                  oodselect: tuple[pd.DataFrame, list[str]] | None,
                  ood_env: int, timings: Mapping[str, str], notes: Iterable[str] = ()) -> None:
    """summary.md: what the zoo is, its ID accuracy, the tables, verdicts, figures,
    OODSelect and the wall times."""
    lines = [f"# Accuracy on the line: {dataset} zoo", ""]
    n_runs, n_ckpt = len(facts), int(facts.checkpoints.sum())
    lines += ["## The zoo", "",
              f"{n_runs} training runs (N counts runs), {n_ckpt} checkpoints in the fits "
              f"(each run contributes every checkpoint, as Salaudeen et al. 2025, 'Are Domain "
              f"Generalization Benchmarks with Accuracy on the Line Misspecified?', count "
              f"them). "
              f"Steps per run: {', '.join(map(str, sorted(facts.steps.unique())))}; "
              f"evaluated splits: {', '.join(sorted(facts.eval_splits.unique()))}; data: "
              f"{', '.join(sorted(facts.data_source.unique()))}.", ""]
    for col, what in (("test_env", "test (OOD) environment"), ("algorithm", "algorithm"),
                      ("arch", "architecture")):
        counts = facts[col].value_counts().sort_index()
        lines.append(f"- runs per {what}: " + ", ".join(f"{k}: {v}" for k, v in
                                                        counts.items()))
    widths = facts[facts.arch == "mlp"].width.dropna().astype(int).value_counts().sort_index()
    if len(widths):
        lines.append("- MLP widths: " + ", ".join(f"{k}: {v}" for k, v in widths.items()))
    q = facts.id_acc.quantile([0, 0.1, 0.5, 0.9, 1]).to_numpy()
    lines += ["", f"Final ID accuracy (mean over the training environments' out splits, "
              f"last checkpoint of each run): min {q[0]:.3f}, 10% {q[1]:.3f}, median "
              f"{q[2]:.3f}, 90% {q[3]:.3f}, max {q[4]:.3f}.", ""]
    lines += ["## Per-OOD fits (probit scale; x = mean ID accuracy)", "",
              _md(per_ood[[c for c in ("ood_env", "id_envs", "n", "slope", "intercept", "r",
                                       "p", "verdict") if c in per_ood]]), ""]
    lines += _warning_lines(fit_warnings(per_ood))
    lines += ["## Verdict per split", ""]
    for _, row in per_ood.iterrows():
        where = "below the line (negative R)" if row["r"] < 0 else (
            "on the line (positive R)" if row["r"] >= 0.3 else "weakly correlated")
        lines.append(f"- OOD env {int(row['ood_env'])}: R = {row['r']:.3f}, "
                     f"{row['verdict']}: {where}")
    lines += ["", "## Pairwise fits", "", pairwise_md.strip(), "", "## Figures", ""]
    lines += [f"- {os.path.relpath(p, os.path.dirname(path))}" for p in plots]
    if oodselect is not None:
        frame, warnings = oodselect
        cols = [c for c in ("method", "n", "r_test", "r_test_lo", "r_test_hi", "r_val")
                if c in frame]
        lines += ["", f"## OODSelect on OOD env {ood_env}", "",
                  "Subsets of the OOD examples chosen to make ID and OOD accuracy "
                  "anti-correlated (test models held out by run); files under oodselect/.",
                  "", _md(frame[cols]), ""]
        lines += _warning_lines(warnings)
    lines += ["", "## Time", ""] + [f"- {k}: {v}" for k, v in timings.items()]
    lines += [f"- {n}" for n in notes]
    fileio.atomic_write_text(path, "\n".join(lines) + "\n")


def analyse(runs_dir: str, out_dir: str, dataset: str, ood_env: int | None = None,
            oodselect_steps: int = 1500, timings: Mapping[str, str] | None = None,
            log: Callable[[str], None] = print) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """Everything after training; returns the summary path."""
    start = time.time()
    facts = zoo_facts(runs_dir)
    if facts is None:
        raise UserError(f"no finished runs under {runs_dir}: nothing to analyse")
    paths = run_aotl(runs_dir, out_dir)
    per_ood = pd.read_csv(paths["per_ood_csv"])
    log(f"accuracy on the line: {len(per_ood)} per-OOD fits in {time.time() - start:.0f} s")
    for warning in fit_warnings(per_ood):
        log(f"warning: accuracy on the line: {warning}")
    ood_env = pick_ood_env(per_ood) if ood_env is None else ood_env
    t = time.time()
    oodselect: tuple[pd.DataFrame, list[str]] | None = None
    notes: list[str] = []
    if oodselect_steps > 0:
        try:
            oodselect = run_oodselect(runs_dir, dataset, ood_env,
                                      os.path.join(out_dir, "oodselect"), oodselect_steps)
            log(f"OODSelect on OOD env {ood_env}: {time.time() - t:.0f} s")
            for warning in oodselect[1]:
                log(f"warning: OODSelect: {warning}")
        except UserError as e:   # e.g. too few runs on that env for a split by run
            notes.append(f"OODSelect on OOD env {ood_env} not run: {e}")
            log(f"note: {notes[-1]}")
    plots = sorted(os.path.join(paths["plots"], f) for f in os.listdir(paths["plots"])
                   if f.endswith(".png"))
    if "plot_error" in paths:
        notes.append(f"probit plots incomplete: {paths['plot_error']}")
    timings = dict(timings or {})
    timings["analysis wall time"] = f"{time.time() - start:.0f} s"
    with open(paths["pairwise_md"]) as f:
        pairwise_md = f.read()
    summary = os.path.join(out_dir, "summary.md")
    write_summary(summary, dataset, facts, per_ood, pairwise_md, plots, oodselect, ood_env,
                  timings, notes)
    return summary, facts, per_ood


def run_study(dataset: str, n_models: int, output_dir: str, workers: int = 2,
              data_dir: str = "data", steps: int = 300, checkpoint_freq: int = 75,
              eval_splits: Sequence[str] = ("out", "test"), launcher: str = "pooled",
              seed: int = 0, ood_env: int | None = None, oodselect_steps: int = 1500,
              log: Callable[[str], None] = print, backbone: str | None = None
              ) -> tuple[str, pd.DataFrame, pd.DataFrame, Any, float, float]:
    """Train (or resume, or extend) the zoo under OUTPUT_DIR/runs (with `backbone`: linear
    probes on its pretrained features), analyse it and append the wall time to the summary.
    Returns (summary path, zoo facts, per-OOD table, training)."""
    start = time.time()
    runs_dir = os.path.join(output_dir, "runs")
    trained = train_zoo(dataset, n_models, runs_dir, data_dir, steps, checkpoint_freq,
                        eval_splits, launcher, workers, seed, notify=log, backbone=backbone)
    log(f"training: {trained.launched} runs launched, {trained.done}/{trained.runs} done, "
        f"{trained.failed} failed, {trained.seconds:.0f} s")
    timings = {"runs trained by this invocation": f"{trained.launched - trained.failed}",
               "training wall time (this invocation)": f"{trained.seconds:.0f} s",
               "workers": f"{workers} ({launcher} launcher)",
               "failed runs (left out of the fits; see `sweep status`)": f"{trained.failed}"}
    summary, facts, per_ood = analyse(runs_dir, output_dir, dataset, ood_env, oodselect_steps,
                                      timings=timings, log=log)
    wall = time.time() - start
    rate = 3600 * trained.launched / wall if trained.launched else 0.0
    with open(summary, encoding="utf-8") as f:     # the summary analyse() just wrote
        text = f.read()
    fileio.atomic_write_text(summary, text + f"- total wall time: {wall:.0f} s; {rate:.0f} "
                             "models per hour (runs trained by this invocation / its whole "
                             "wall time)\n")
    return summary, facts, per_ood, trained, wall, rate
