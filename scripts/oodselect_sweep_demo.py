"""OODSelect end to end on a training sweep: build A from the run directories, select
subsets, compare with random (and hard) subsets, print the report.

    python scripts/oodselect_sweep_demo.py SWEEP_DIR --ood_env 3
    python scripts/oodselect_sweep_demo.py SWEEP_DIR --dataset PACS --id_envs 0 1 2 \\
        --ood_env 3 --sizes 10 50 100 500 --out oodselect_out --trials 20

Every checkpoint with a predictions file is a model; y is its mean ``env{i}_out_acc``
over the ID environments; A covers the OOD environment's in and out splits. Models are
split 60/20/20 by run. Without --out the files go to a temporary directory.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from analysis import oodselect as core  # noqa: E402
from analysis.oodselect import data, protocol  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402
from oodutils.errors import run_cli  # noqa: E402


def default_sizes(N):
    grid = [n for n in (10, 20, 50, 100, 250, 500, 1000, 2500, 5000, 10000) if n < N]
    return grid + [max(1, N // 2)] if N // 2 not in grid else grid


def main(argv=None):
    p = ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", nargs="+")
    add_option(p, "--dataset")
    add_option(p, "--id_envs", type=int, nargs="+")
    add_option(p, "--ood_env", type=int)
    add_option(p, "--sizes", type=int, nargs="+")
    add_option(p, "--out")
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--steps", type=int, default=3000)
    add_option(p, "--patience", type=int, default=500)
    add_option(p, "--trials", type=int, default=0)
    add_option(p, "--split", choices=("run", "model", "arch"), default="run")
    add_option(p, "--random_draws", type=int, default=100)
    add_option(p, "--with_greedy", action="store_true")
    args = p.parse_args(argv)

    t0 = time.time()
    cm = data.from_runs(args.sweep_dir, args.dataset, args.id_envs, args.ood_env)
    info = cm.info
    print(f"dataset {info['dataset']}: ID envs {info['id_envs']}, OOD env {info['ood_env']};"
          f" {cm.n_models} models (checkpoints) from {info['n_runs']} runs x "
          f"{cm.n_examples} OOD examples; built in {time.time() - t0:.1f}s")
    if info.get("skipped_checkpoints"):
        print(f"  ({info['skipped_checkpoints']} checkpoints had no predictions)")
    print(f"  ID accuracy {cm.y.min():.3f}..{cm.y.max():.3f}; mean OOD accuracy "
          f"{cm.A.mean():.3f}")
    out = args.out or tempfile.mkdtemp(prefix="oodselect_")
    sizes = args.sizes or default_sizes(cm.n_examples)
    selector = core.OODSelect(trials=args.trials, steps=args.steps, patience=args.patience,
                              seed=args.seed)
    baselines = ("random", "hard") + (("greedy",) if args.with_greedy else ())
    summary, results = protocol.run_selection(
        cm, sizes, seed=args.seed, out_dir=out, split=args.split, selector=selector,
        baselines=baselines, random_draws=args.random_draws,
        log=lambda *a: print(*a, file=sys.stderr))

    print()
    print(protocol.format_summary(summary))
    ours = summary[summary.method == "oodselect"].set_index("n")
    rand = summary[summary.method == "random"].set_index("n")
    full = float(summary.loc[summary.method == "all", "r_test"].iloc[0])
    inverse = ours[ours.r_test < -0.3]
    print()
    print(f"all {cm.n_examples} OOD examples: r = {full:.3f} on the test models")
    if len(inverse):
        n = int(inverse.index.max())
        print(f"largest subset with accuracy on the inverse line (r < -0.3): n = {n} "
              f"({100 * n / cm.n_examples:.0f}% of the OOD set), r = "
              f"{inverse.loc[n, 'r_test']:.3f} vs random {rand.loc[n, 'r_test']:.3f}")
    else:
        print("no selected subset reaches r < -0.3 on the test models")
    best_n = int(ours.r_test.idxmin())
    k = results["sizes"].index(best_n)
    sel = results["selector"]
    top = sel.subsets_[k][:10]
    ids = cm.examples["id"].to_numpy()[top]
    print(f"most anti-correlated subset: n = {best_n}, r = {ours.loc[best_n, 'r_test']:.3f}; "
          f"top example ids: {', '.join(map(str, ids))}")
    comp = results["composition"].get(best_n)
    if comp is not None and len(comp):
        sig = comp[(comp.enrichment_lo > 1) | (comp.enrichment_hi < 1)]
        for _, row in sig.sort_values("enrichment", ascending=False).head(8).iterrows():
            print(f"  {row.attribute}={row.value}: {row.subset_prevalence:.2f} in subset vs "
                  f"{row.pool_prevalence:.2f} overall (x{row.enrichment:.2f}, 95% "
                  f"{row.enrichment_lo:.2f}-{row.enrichment_hi:.2f})")
    print(f"files in {out}: {', '.join(sorted(os.listdir(out)))}")
    return summary


if __name__ == "__main__":
    run_cli(main)
