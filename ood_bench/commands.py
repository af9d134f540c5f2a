"""What each `ood-bench` subcommand does once `ood_bench.cli` has parsed and checked its
flags (this module imports torch and the trainer; the parser does not)."""
from __future__ import annotations

import argparse
import glob
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ood_bench import figures, table3
from ood_bench import quantify as q
from ood_bench.features import load_features, save_features
from ood_bench.trials import (
    TrialConfig,
    bisect_thresholds,
    densities,
    extract_trial,
    iid_feature_densities,
    load_results,
    run_trials,
    summarize,
)
from oodutils.cli import parse_json_object
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_json, atomic_write_text
from oodutils.untrusted import read_input


def config_from_args(a: argparse.Namespace) -> TrialConfig:
    if a.steps < 1 or a.batch_size < 1 or a.dim_z < 1 or a.eval_every < 1:
        raise UserError("--steps, --batch_size, --dim_z and --eval_every must be positive")
    est = q.estimator_options(a) if hasattr(a, "sample_size") else {}
    return TrialConfig(
        dataset=a.dataset, data_dir=a.data_dir, envs_p=a.envs_p, envs_q=a.envs_q,
        dataset_settings=parse_json_object(a.dataset_settings, "--dataset_settings"),
        data_seed=a.data_seed, holdout_fraction=a.holdout_fraction, backbone=a.backbone,
        dim_z=a.dim_z, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
        weight_decay=a.weight_decay, eval_every=a.eval_every, mlp_width=a.mlp_width,
        pretrained=a.pretrained, pretrained_path=a.pretrained_path,
        featurizer_hparams=parse_json_object(a.featurizer_hparams, "--featurizer_hparams"),
        select=a.select, extract_split=a.extract_split, n_workers=a.n_workers,
        **{k: v for k, v in est.items()})


def cmd_extract(a: argparse.Namespace) -> None:
    cfg = config_from_args(a)
    cfg.device = a.device
    with q.torch_threads(a.num_threads):
        feats, log = extract_trial(cfg, a.seed, force_iid=a.force_iid, verbose=a.verbose)
    meta = {"config": asdict(cfg), "seed": a.seed, "train": log}
    save_features(a.out, feats, meta)
    atomic_write_json(os.path.splitext(a.out)[0] + ".json", meta)
    print(json.dumps({"features": a.out, "n_p": len(feats["y_p"]), "n_q": len(feats["y_q"]),
                      "val_acc": log["val_acc"], "selected_step": log["selected_step"]}))


def cmd_quantify(a: argparse.Namespace) -> None:
    result = q.quantify_file(a.features, a.seed, a.mode, a.num_threads,
                             **q.estimator_options(a))
    if a.out:
        atomic_write_json(a.out, result)
    print(json.dumps({k: result[k] for k in ("diversity", "correlation") if k in result}))


def cmd_run(a: argparse.Namespace) -> None:
    cfg = config_from_args(a)
    with q.torch_threads(a.num_threads):
        s = run_trials(cfg, a.n_trials, a.seed, a.output_dir, a.calibrate,
                       a.calibration_level, a.iid_reference, a.verbose)
    _print_summary(s)


def _print_summary(s: dict[str, Any]) -> None:
    d, c = s["diversity"], s["correlation"]
    line = {"diversity": d["mean"], "diversity_se": d["se"], "correlation": c["mean"],
            "correlation_se": c["se"], "n_trials": s["n_trials"], "eps_div": s.get("eps_div"),
            "eps_cor": s.get("eps_cor")}
    print(json.dumps(line))


def _expand(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        out.extend(hits)
    if not out:
        raise UserError(f"no files match {paths}")
    return out


def cmd_calibrate(a: argparse.Namespace) -> None:
    cfg = TrialConfig("", "", [0], [1], **q.estimator_options(a))
    feats = [load_features(p) for p in _expand(a.features)]
    with q.torch_threads(a.num_threads):
        if a.already_iid:
            iid = [densities(f, cfg, a.seed + k) for k, f in enumerate(feats)]
        else:
            iid = iid_feature_densities(feats, cfg, a.seed)
        cal = bisect_thresholds(iid, a.lower_bound, a.upper_bound, a.max_iters,
                                (a.min_eps_div, a.max_eps_div), (a.min_eps_cor, a.max_eps_cor))
    cal["level"] = "given i.i.d. features" if a.already_iid else "features"
    cal["features"] = _expand(a.features)
    atomic_write_json(a.out, cal)
    print(json.dumps({k: cal[k] for k in ("eps_div", "eps_cor", "iid_div", "iid_cor",
                                          "converged")}))


def cmd_summarize(a: argparse.Namespace) -> None:
    paths = _expand(a.results) if a.results else sorted(
        glob.glob(os.path.join(a.root, "**", "result.json"), recursive=True))
    if not paths:
        raise UserError(f"no result.json under {a.root!r}")
    s = summarize(load_results(paths))
    s["results"] = paths
    if a.out:
        atomic_write_json(a.out, s)
    _print_summary(s)


def cmd_table3(a: argparse.Namespace) -> None:
    overrides: dict[str, Any] = dict(table3.QUICK) if a.quick else {}
    for name in ("steps", "mlp_width", "holdout_fraction", "sample_size", "eval_every"):
        if getattr(a, name) is not None:
            overrides[name] = getattr(a, name)
    with q.torch_threads(a.num_threads):
        results = table3.run_table3(a.data_dir, a.n_trials, a.seed, a.output_dir, a.rows,
                                    verbose=a.verbose, **overrides)
    text = table3.format_table3(results)
    rho = table3.spearman_cor_vs_rho(results)
    if rho is not None:
        text += f"\nSpearman(rho_te, mean correlation shift) = {rho:.3f}"
    print(text)
    if a.output_dir:
        atomic_write_json(os.path.join(a.output_dir, "table3.json"),
                          {"results": results, "rows": table3.table3_rows(results),
                           "spearman": rho, "settings": overrides})
        atomic_write_text(os.path.join(a.output_dir, "table3.md"), text + "\n")


def cmd_heatmap(a: argparse.Namespace) -> None:
    overrides = {k: getattr(a, k) for k in ("steps", "mlp_width", "holdout_fraction",
                                            "sample_size", "eval_every")
                 if getattr(a, k) is not None}
    with q.torch_threads(a.num_threads):
        grid = figures.run_heatmap(a.kind, a.values, a.data_dir, a.seed, a.verbose, **overrides)
    os.makedirs(a.output_dir, exist_ok=True)
    atomic_write_json(os.path.join(a.output_dir, f"heatmap_{a.kind}.json"), grid)
    png = os.path.join(a.output_dir, f"heatmap_{a.kind}.png")
    figures.plot_heatmap(grid, png)
    print(json.dumps({"grid": grid["grid"], "png": png}))


def cmd_plot(a: argparse.Namespace) -> None:
    if a.what == "plane":
        named = {}
        for item in a.summaries or []:
            name, sep, path = item.partition("=")
            if not sep:
                name, path = os.path.basename(os.path.dirname(os.path.abspath(item))), item
            named[name] = path
        if not named and not a.paper:
            raise UserError("give --summaries NAME=summary.json ... and/or --paper")
        figures.plot_plane(figures.plane_points_from_summaries(named), a.out, paper=a.paper)
    else:
        if not a.grid:
            raise UserError("plot heatmap needs --grid heatmap_*.json")
        try:
            grid = json.loads(read_input(a.grid, "--grid", 64 << 20))
        except (ValueError, RecursionError) as e:
            raise UserError(f"cannot read grid {a.grid!r}: {e}") from None
        figures.plot_heatmap(grid, a.out)
    print(a.out)


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "extract": cmd_extract, "quantify": cmd_quantify, "run": cmd_run,
    "calibrate": cmd_calibrate, "summarize": cmd_summarize, "table3": cmd_table3,
    "heatmap": cmd_heatmap, "plot": cmd_plot}


def run(args: argparse.Namespace) -> None:
    """Run the subcommand `args.command` names."""
    COMMANDS[args.command](args)
