"""python -m ood_bench COMMAND ...

  extract    train the environment classifier (Algorithm 1), write features.npz
  quantify   estimate diversity / correlation shift from features (Algorithm 2)
  run        several trials (extract + quantify), summary.json; --calibrate optional
  calibrate  i.i.d. threshold calibration from features files, calibration.json
  summarize  mean +/- standard error of result.json files
  table3     Table 3 of the paper on Colored MNIST, ours beside the paper's
  heatmap    a Fig. 4 grid on Colored MNIST (grid.json + PNG)
  plot       plane (Fig. 3) from summaries, or heatmap from a grid.json
"""
import argparse
import glob
import json
import os
import sys

from ood_bench import quantify as q
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    configure_logging,
    parse_json_object,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.fileio import atomic_write_json, atomic_write_text
from oodutils.untrusted import read_input

EPILOG = epilog_example("ood-bench", "ood_bench",
                        "quantify --features features.npz --seed 0 --output result.json")


def add_training_arguments(p, dataset_required=True):
    g = p.add_argument_group("data")
    add_option(g, "--dataset", required=dataset_required, help="a registered dataset name")
    add_option(g, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(g, "--envs_p", type=int, nargs="+", required=dataset_required,
                  help="environment indices of side P")
    add_option(g, "--envs_q", type=int, nargs="+", required=dataset_required,
                  help="environment indices of side Q")
    add_option(g, "--dataset_settings", default="", help="JSON: dataset hparams")
    add_option(g, "--data_seed", type=int, default=0)
    add_option(g, "--holdout_fraction", type=float, default=0.1)
    g = p.add_argument_group("environment classifier (Algorithm 1)")
    add_option(g, "--backbone", default="auto",
                  help="auto (mlp for small images, else resnet18), mlp, resnet18, resnet34, "
                        "resnet50, featurizer (domainbed.networks.Featurizer)")
    add_option(g, "--dim_z", type=int, default=8)
    add_option(g, "--steps", type=int, default=2000)
    add_option(g, "--batch_size", type=int, default=32, help="per side")
    add_option(g, "--lr", type=float, default=3e-4)
    add_option(g, "--weight_decay", type=float, default=0.0)
    add_option(g, "--eval_every", type=int, default=100)
    add_option(g, "--mlp_width", type=int, default=390)
    add_option(g, "--pretrained", action="store_true", default=None,
               help="ImageNet weights for ResNets (default: yes for resnet*)")
    add_option(g, "--no_pretrained", dest="pretrained", action="store_false", default=None,
               help="random initialisation")
    add_option(g, "--pretrained_path", default="")
    add_option(g, "--featurizer_hparams", default="", help="JSON for --backbone featurizer")
    add_option(g, "--select", default="acc", choices=("acc", "loss", "last"),
                  help="checkpoint selection on the held-out part (default: accuracy)")
    add_option(g, "--extract_split", default="out", choices=("out", "train", "all"),
                  help="which examples' features are written (default: held-out)")
    add_option(g, "--n_workers", type=int, default=0)


def config_from_args(a):
    from ood_bench.trials import TrialConfig
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


def cmd_extract(a):
    from ood_bench.trials import extract_trial, save_features
    cfg = config_from_args(a)
    cfg.device = a.device
    with q.torch_threads(a.num_threads):
        feats, log = extract_trial(cfg, a.seed, force_iid=a.force_iid, verbose=a.verbose)
    from dataclasses import asdict
    meta = {"config": asdict(cfg), "seed": a.seed, "train": log}
    save_features(a.out, feats, meta)
    atomic_write_json(os.path.splitext(a.out)[0] + ".json", meta)
    print(json.dumps({"features": a.out, "n_p": len(feats["y_p"]), "n_q": len(feats["y_q"]),
                      "val_acc": log["val_acc"], "selected_step": log["selected_step"]}))


def cmd_quantify(a):
    result = q.quantify_file(a.features, a.seed, a.mode, a.num_threads,
                             **q.estimator_options(a))
    if a.out:
        atomic_write_json(a.out, result)
    print(json.dumps({k: result[k] for k in ("diversity", "correlation") if k in result}))


def cmd_run(a):
    from ood_bench.trials import run_trials
    cfg = config_from_args(a)
    with q.torch_threads(a.num_threads):
        s = run_trials(cfg, a.n_trials, a.seed, a.output_dir, a.calibrate,
                       a.calibration_level, a.iid_reference, a.verbose)
    _print_summary(s)


def _print_summary(s):
    d, c = s["diversity"], s["correlation"]
    line = {"diversity": d["mean"], "diversity_se": d["se"], "correlation": c["mean"],
            "correlation_se": c["se"], "n_trials": s["n_trials"], "eps_div": s.get("eps_div"),
            "eps_cor": s.get("eps_cor")}
    print(json.dumps(line))


def _expand(paths):
    out = []
    for p in paths:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        out.extend(hits)
    if not out:
        raise UserError(f"no files match {paths}")
    return out


def cmd_calibrate(a):
    from ood_bench.trials import (
        TrialConfig,
        bisect_thresholds,
        densities,
        iid_feature_densities,
        load_features,
    )
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


def cmd_summarize(a):
    from ood_bench.trials import load_results, summarize
    paths = _expand(a.results) if a.results else sorted(
        glob.glob(os.path.join(a.root, "**", "result.json"), recursive=True))
    if not paths:
        raise UserError(f"no result.json under {a.root!r}")
    s = summarize(load_results(paths))
    s["results"] = paths
    if a.out:
        atomic_write_json(a.out, s)
    _print_summary(s)


def cmd_table3(a):
    from ood_bench import table3
    overrides = dict(table3.QUICK) if a.quick else {}
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


def cmd_heatmap(a):
    from ood_bench import figures
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


def cmd_plot(a):
    from ood_bench import figures
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


def _reduced_training_args(p):
    for flag, typ in (("--steps", int), ("--mlp_width", int), ("--holdout_fraction", float),
                      ("--sample_size", int), ("--eval_every", int)):
        add_option(p, flag, type=typ, default=None)
    add_option(p, "--num_threads", type=int, default=0)
    add_option(p, "--seed", type=int, default=0)


def build_parser():
    parser = ArgumentParser(prog="ood-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("extract", help="train the environment classifier, write features")
    add_training_arguments(p)
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--force_iid", action="store_true",
                  help="pool P and Q and split 50/50 at random (i.i.d. reference)")
    add_option(p, "--output", "--out", "--output-dir", dest="out",
                  required=True, help="features .npz (a .json log goes beside)")
    add_option(p, "--device", default="cpu")
    add_option(p, "--num_threads", type=int, default=0)
    p.set_defaults(func=cmd_extract)

    p = sub.add_parser("quantify", help="Algorithm 2 on a features file")
    q.build_parser(p)
    p.set_defaults(func=cmd_quantify)

    p = sub.add_parser("run", help="trials: extract + quantify, summary.json")
    add_training_arguments(p)
    q.add_estimator_arguments(p)
    add_option(p, "--n_trials", type=int, default=5)
    add_option(p, "--seed", type=int, default=0, help="trial seeds are seed, seed+1, ...")
    add_option(p, "--output_dir", "--output", "--out", required=True)
    add_option(p, "--calibrate", action="store_true", help="i.i.d. threshold calibration")
    add_option(p, "--calibration_level", default="data", choices=("data", "features"))
    add_option(p, "--iid_reference", action="store_true",
                  help="also report i.i.d. estimates at the thresholds used")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("calibrate", help="calibrate eps_div / eps_cor on i.i.d. splits")
    add_option(p, "--features", nargs="+", required=True, help="features files (globs ok)")
    add_option(p, "--already_iid", action="store_true",
                  help="the files are i.i.d. already (extract --force_iid); no re-split")
    add_option(p, "--output", "--out", "--output-dir", dest="out", required=True)
    add_option(p, "--seed", type=int, default=0)
    q.add_estimator_arguments(p)
    for flag, default in (("--lower_bound", 5e-3), ("--upper_bound", 1e-2),
                          ("--min_eps_div", 0.0), ("--max_eps_div", 1e-6),
                          ("--min_eps_cor", 0.0), ("--max_eps_cor", 1.0)):
        add_option(p, flag, type=float, default=default)
    add_option(p, "--max_iters", type=int, default=20)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("summarize", help="mean +/- SE over result.json files")
    add_option(p, "--results", nargs="+", help="result.json files (globs ok)")
    add_option(p, "--input_dir", "--root", dest="root", default=".",
               help="else every result.json under this folder")
    add_option(p, "--output", "--out", "--output-dir", dest="out", default=None)
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("table3", help="Table 3 on Colored MNIST, ours beside the paper's")
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--n_trials", type=int, default=5)
    add_option(p, "--output_dir", "--output", "--out", default=None)
    add_option(p, "--rows", nargs="+", default=None,
                  help="subset of 0.9 0.7 0.5 0.3 0.1 0.1+blue")
    add_option(p, "--quick", action="store_true", help="reduced CPU setting (table3.QUICK)")
    _reduced_training_args(p)
    p.set_defaults(func=cmd_table3)

    p = sub.add_parser("heatmap", help="a Fig. 4 grid on Colored MNIST")
    add_option(p, "--kind", default="rho", choices=("rho", "mu-div", "mu-cor"))
    add_option(p, "--values", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--output_dir", "--output", "--out", required=True)
    _reduced_training_args(p)
    p.set_defaults(func=cmd_heatmap)

    p = sub.add_parser("plot", help="plane (Fig. 3) or heatmap (Fig. 4) PNG")
    p.add_argument("what", choices=("plane", "heatmap"))
    add_option(p, "--summaries", nargs="+", help="NAME=summary.json (plane)")
    add_option(p, "--paper", action="store_true", help="overlay Table 8's points (plane)")
    add_option(p, "--grid", help="heatmap_*.json (heatmap)")
    add_option(p, "--output", "--out", "--output-dir", dest="out", required=True, help="PNG path")
    p.set_defaults(func=cmd_plot)
    for p in sub.choices.values():   # -v / --verbose: training progress; -q: warnings only
        add_logging_flags(p)
    return parser


def main(argv=None):
    from oodutils.fileio import check_output_path
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if getattr(args, "out", None):
        check_output_path(args.out, "--output")
    if getattr(args, "output_dir", None):
        check_output_path(args.output_dir, "--output_dir", directory=True)
    args.func(args)
    return 0

def cli():
    """The `ood-bench` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    from oodutils.errors import run_cli
    sys.exit(run_cli(main))
