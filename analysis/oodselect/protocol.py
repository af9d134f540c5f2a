"""The OODSelect protocol on one correctness matrix, as the `oodselect` command runs it:
a split of the models, the selection, the baselines, and the files and plots described in
`analysis.oodselect.cli`."""
from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.oodselect import baselines as bl
from analysis.oodselect import data
from analysis.oodselect import report as rep
from analysis.oodselect import selector as core
from analysis.oodselect.config import BASELINES
from analysis.oodselect.data import CorrectnessMatrix
from oodutils.errors import UserError
from oodutils.log import get_logger
from oodutils.tables import render

logger = get_logger(__name__)

Parts = tuple[np.ndarray, np.ndarray, np.ndarray]   # train, val, test model indices

DEFAULT_SIZES = (10, 20, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000)


def make_split(cm: CorrectnessMatrix, how: str = "run", seed: int = 0,
               fractions: ArrayLike = (0.6, 0.2, 0.2), test_archs: Sequence[str] | None = None
               ) -> Parts:
    """(train, val, test) model indices. how: "run" (whole runs), "model" (each
    checkpoint on its own) or "arch" (architecture-disjoint test set)."""
    if how == "run":
        return data.split_models(cm.models["run"].to_numpy(), fractions, seed)
    if how == "model":
        return data.split_models(np.arange(cm.n_models), fractions, seed)
    if how == "arch":
        if "arch" not in cm.models or not cm.models["arch"].astype(str).str.len().any():
            raise UserError("--model_split arch needs each model's architecture (hparams 'arch' "
                            "in the runs, or an 'arch' array in the matrix file)")
        return data.split_by_arch(cm.models["arch"].to_numpy(), cm.models["run"].to_numpy(),
                                  test_archs, fractions, seed)
    raise UserError(f"unknown split {how!r}; valid: run, model, arch")


def _row(method: str, n: int, A: np.ndarray, y: np.ndarray, parts: Parts, subset: ArrayLike,
         fisher_m: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    tr, va, te = parts
    r_te = core.subset_correlation(A[te], y[te], subset)
    m = fisher_m or len(te)
    lo, hi = rep.fisher_interval(r_te, m)
    row: dict[str, Any] = {
        "method": method, "n": int(n), "r_test": r_te, "r_test_lo": lo,
        "r_test_hi": hi, "r_test_err": r_te - lo if np.isfinite(lo) else np.nan,
        "r_val": core.subset_correlation(A[va], y[va], subset),
        "r_train": core.subset_correlation(A[tr], y[tr], subset),
        "spearman_test": core.subset_correlation(A[te], y[te], subset, method="spearman"),
        "ood_acc_test": float(core.subset_accuracy(A[te], subset).mean()),
        "m_train": len(tr), "m_val": len(va), "m_test": len(te), "fisher_m": m}
    undefined = [k for k in ("r_test", "r_val", "r_train") if not np.isfinite(row[k])]
    if undefined:
        row["note"] = (f"{', '.join(undefined)} undefined: accuracy on the subset (or ID "
                       f"accuracy) is constant across those models")
    row.update(extra or {})
    return row


def run_selection(cm: CorrectnessMatrix, sizes: Sequence[int], seed: int = 0,
                  out_dir: str | None = None, split: str = "run",
                  fractions: ArrayLike = (0.6, 0.2, 0.2), test_archs: Sequence[str] | None = None,
                  selector: core.OODSelect | None = None, baselines: Sequence[str] = BASELINES,
                  random_draws: int = 100, hard_reference: str = "train",
                  greedy_max_cost: float = 2e10, exhaustive_max: int = 1_000_000,
                  fisher_m: int | None = None, n_boot: int = 1000, plots: bool = True,
                  log: Callable[[str], Any] | None = None
                  ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The whole protocol on one correctness matrix. Returns (summary DataFrame, dict of
    results); writes the files described in the module docstring when out_dir is set.
    ``log``: where progress lines go (default: this package's logger, at INFO)."""
    log = log or logger.info
    A, y, N = cm.A, cm.y, cm.n_examples
    sizes = sorted({int(n) for n in sizes})
    bad = [n for n in sizes if not 1 <= n <= N]
    if bad:
        raise UserError(f"subset sizes {bad} outside 1..{N} (the OOD set has {N} examples)")
    unknown = sorted(set(baselines) - set(BASELINES))
    if unknown:
        raise UserError(f"unknown baseline(s) {unknown}; valid: {', '.join(BASELINES)}")
    parts = make_split(cm, split, seed, fractions, test_archs)
    tr, va, te = parts
    log(f"[oodselect] {cm.n_models} models x {N} OOD examples; split {split}: "
        f"{len(tr)} train / {len(va)} val / {len(te)} test models")
    warnings = rep.small_input_warnings(cm.models["run"].to_numpy(), parts, sizes)
    for warning in warnings:
        logger.warning(f"warning: {warning}")
    selector = selector or core.OODSelect(seed=seed)
    t0 = time.time()
    selector.fit(A[tr], y[tr], sizes, A[va], y[va])
    log(f"[oodselect] selection of {len(sizes)} size(s) took {time.time() - t0:.1f}s")

    rows = [_row("all", N, A, y, parts, np.arange(N), fisher_m)]
    subsets: dict[str, dict[int, Any]] = {"oodselect": {}, "random": {}, "hard": {},
                                          "greedy": {}, "exhaustive": {}}
    for k, n in enumerate(sizes):
        sub = selector.subsets_[k]
        subsets["oodselect"][n] = sub
        rows.append(_row("oodselect", n, A, y, parts, sub, fisher_m, {
            "best_step": int(selector.best_step_[k]), "n_steps": int(selector.n_steps_[k]),
            "r_val_selection": float(selector.val_r_[k])}))
    if "random" in baselines:
        for n in sizes:
            res_te = bl.random_baseline(A[te], y[te], n, random_draws, seed + 1)
            r_va = bl.masks_correlation(A[va], y[va], res_te["masks"])
            r_tr = bl.masks_correlation(A[tr], y[tr], res_te["masks"])
            m = fisher_m or len(te)
            lo, hi = rep.fisher_interval(res_te["mean"], m)
            rows.append({"method": "random", "n": n, "r_test": res_te["mean"],
                         "r_test_lo": lo, "r_test_hi": hi,
                         "r_test_err": res_te["mean"] - lo, "r_test_sd": res_te["sd"],
                         "r_test_q025": res_te["q025"], "r_test_q975": res_te["q975"],
                         "r_val": float(r_va.mean()), "r_train": float(r_tr.mean()),
                         "m_train": len(tr), "m_val": len(va), "m_test": len(te),
                         "fisher_m": m, "draws": random_draws})
            subsets["random"][n] = np.flatnonzero(res_te["masks"][0])
    if "hard" in baselines:
        ref = {"train": tr, "test": te, "all": np.arange(cm.n_models)}[hard_reference]
        order, _ = bl.hardest(A[ref])
        for n in sizes:
            subsets["hard"][n] = order[:n]
            rows.append(_row("hard", n, A, y, parts, order[:n], fisher_m))
    if "greedy" in baselines:
        cost = bl.greedy_cost(len(tr), N, max(sizes))
        if cost <= greedy_max_cost:
            t0 = time.time()
            order, _ = bl.greedy(A[tr], y[tr], max(sizes))
            for n in sizes:
                subsets["greedy"][n] = order[:n]
                rows.append(_row("greedy", n, A, y, parts, order[:n], fisher_m))
            log(f"[oodselect] greedy baseline took {time.time() - t0:.1f}s")
        else:
            log(f"[oodselect] greedy baseline skipped: {cost:.2g} cell updates exceed "
                f"--greedy_max_cost {greedy_max_cost:.2g}")
    if "exhaustive" in baselines:
        for n in sizes:
            if math.comb(N, n) <= exhaustive_max:
                best, _ = bl.exhaustive(A[tr], y[tr], n, max_subsets=exhaustive_max)
                subsets["exhaustive"][n] = best
                rows.append(_row("exhaustive", n, A, y, parts, best, fisher_m))
    summary = pd.DataFrame(rows)
    results = {"summary": summary, "subsets": subsets, "split": parts, "selector": selector,
               "sizes": sizes, "warnings": warnings}
    our = {n: subsets["oodselect"][n] for n in sizes}
    results["jaccard"] = rep.normalized_jaccard(our, N) if len(sizes) > 1 else None
    attrs = [c for c in cm.examples.columns if c not in ("id", "path")
             and 2 <= cm.examples[c].nunique() <= 50]
    results["composition"] = {n: rep.composition(cm.examples, our[n], attrs, n_boot, seed)
                              for n in sizes if attrs and n < N}
    if out_dir:
        write_outputs(out_dir, cm, results, plots)
    return summary, results


def write_outputs(out_dir: str, cm: CorrectnessMatrix, results: dict[str, Any],
                  plots: bool = True) -> None:
    """The files and plots of `run_selection`'s results under `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    summary, sel, sizes = results["summary"], results["selector"], results["sizes"]
    rep.write_csv(os.path.join(out_dir, "summary.csv"), summary)
    for k, n in enumerate(sizes):
        table = rep.subset_table(cm.examples, sel.subsets_[k], sel.scores_[k])
        rep.write_csv(os.path.join(out_dir, f"subset_{n}.csv"), table)
    tr, va, te = results["split"]
    rep.write_json(os.path.join(out_dir, "split.json"), {
        "train": tr, "val": va, "test": te, "warnings": results["warnings"],
        "runs": {name: sorted(map(str, cm.models["run"].iloc[p].unique()))
                 for name, p in (("train", tr), ("val", va), ("test", te))}})
    rep.write_json(os.path.join(out_dir, "subsets.json"), {
        "info": cm.info, "n_models": cm.n_models, "n_examples": cm.n_examples,
        "example_ids": {method: {str(n): cm.examples["id"].to_numpy()[idx]
                                 for n, idx in d.items()}
                        for method, d in results["subsets"].items() if d},
        "oodselect": [{"n": n, "index": sel.subsets_[k],
                       "selection_score": sel.scores_[k][sel.subsets_[k]],
                       "val_r": sel.val_r_[k], "hparams": sel.hparams_[k].as_dict()}
                      for k, n in enumerate(sizes)],
        "trials": getattr(sel, "trials_", [])})
    if results["jaccard"] is not None:
        rep.write_csv(os.path.join(out_dir, "jaccard.csv"), results["jaccard"].reset_index())
    for n, comp in results["composition"].items():
        rep.write_csv(os.path.join(out_dir, f"composition_{n}.csv"), comp)
    if plots:
        full = summary.loc[summary.method == "all", "r_test"]
        curves = summary[summary.method != "all"].copy()
        if "r_test_q025" in curves:   # random: the spread over draws, not a Fisher band
            is_rand = curves.method == "random"
            curves.loc[is_rand, "r_test_lo"] = curves.loc[is_rand, "r_test_q025"]
            curves.loc[is_rand, "r_test_hi"] = curves.loc[is_rand, "r_test_q975"]
        rep.plot_correlation_vs_size(curves, os.path.join(out_dir, "correlation_vs_size.png"),
                                     full_r=float(full.iloc[0]) if len(full) else None)
        A, y = cm.A, cm.y
        acc_all = core.subset_accuracy(A[te], np.arange(cm.n_examples))
        for k, n in enumerate(sizes):
            rep.plot_probit_scatter(y[te], acc_all, core.subset_accuracy(A[te], sel.subsets_[k]),
                                    os.path.join(out_dir, f"scatter_{n}.png"), n=n)


def load_input(args: argparse.Namespace) -> CorrectnessMatrix:
    """The correctness matrix of --matrix or --input_dir (saved to --save_matrix if given)."""
    if bool(args.matrix) == bool(args.input_dir):
        raise UserError("give exactly one of --matrix FILE.npz or --input_dir DIR")
    if args.matrix:
        cm = data.load_matrix(args.matrix)
    else:
        cm = data.from_runs(args.input_dir, args.dataset, args.id_envs, args.ood_env,
                            steps=args.checkpoints, quiet=args.quiet)
    if args.save_matrix:
        data.save_matrix(args.save_matrix, cm)
    return cm


def run(args: argparse.Namespace) -> int:
    """The oodselect command on parsed (and checked) arguments: read the input, select,
    write the outputs, print the summary."""
    log = logger.info     # -q (or --quiet) hides the progress lines, as it always did
    cm = load_input(args)
    sizes = args.sizes or [n for n in DEFAULT_SIZES if n < cm.n_examples]
    if not sizes:
        raise UserError(f"the OOD set has only {cm.n_examples} examples; give --sizes")
    steps, trials = args.steps, args.trials
    if args.paper_budget:
        steps, trials = 50_000, 100
    hp = core.Hparams(lr=args.lr, eta_min=args.eta_min, t_max=args.t_max,
                      penalty=args.penalty, anneal_iters=args.anneal_iters)
    selector = core.OODSelect(hparams=hp, trials=trials, steps=steps, patience=args.patience,
                              penalty_form=args.penalty_form, loss=args.loss,
                              restore_best=not args.last_theta, trial_batch=args.trial_batch,
                              restarts=args.restarts, seed=args.seed, device=args.device,
                              verbose=not args.quiet)
    summary, results = run_selection(
        cm, sizes, seed=args.seed, out_dir=args.out, split=args.split,
        fractions=tuple(args.fractions), test_archs=args.test_archs, selector=selector,
        baselines=tuple(args.baselines), random_draws=args.random_draws,
        hard_reference=args.hard_reference, greedy_max_cost=args.greedy_max_cost,
        exhaustive_max=args.exhaustive_max,
        fisher_m=rep.PAPER_FISHER_M if args.paper_fisher else None,
        n_boot=args.bootstrap, plots=not args.no_plots, log=log)
    if not args.quiet:
        print(format_summary(summary, results["warnings"]))
    return 0


def format_summary(summary: pd.DataFrame, warnings: Sequence[str] = ()) -> str:
    """The summary table, then one `warning:` line per reason the input is too small."""
    cols = [c for c in ("method", "n", "r_test", "r_test_lo", "r_test_hi", "r_test_sd",
                        "r_val", "spearman_test", "m_test") if c in summary]
    table = summary[cols]
    text = render(table, "text", digits=3)
    return text + "".join(f"warning: {w}\n" for w in warnings)
