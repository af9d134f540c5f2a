"""Train the two reference models behind the K of Bell et al. 2024 ("Reassessing the
Validity of Spurious Correlations Benchmarks") for one dataset.

    python scripts/train_k_reference.py --dataset Waterbirds --data_dir data/ \\
        --output_dir kref/ --test_envs 1 --trial_seeds 0 1 2

Runs the ordinary training CLI (``python -m domainbed.scripts.train``) twice per trial seed:
ERM, and the group-reweighted ERM (``ReweightedERM``: each example weighted by the inverse
size of its group) or, with ``--reference GroupDRO`` or when ReweightedERM is not registered,
GroupDRO. Both get the same hyperparameters (Adam, lr 1e-3 by default, as the paper) and save
logits at every checkpoint; ``python -m analysis.validity`` then picks each run's checkpoint
with the lowest validation NLL ("until validation loss convergence") and computes K:

    python -m analysis.validity report --input_dir sweep/ --k_dir kref/

Layout: OUTPUT_DIR/<dataset>_env<test envs>/<algorithm>_seed<trial seed>/ (a run directory).
Extra arguments after ``--`` go to the training CLI unchanged.
"""
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from oodutils.cli import ArgumentParser, add_option, parse_json_object  # noqa: E402
from oodutils.errors import UserError, run_cli  # noqa: E402

REFERENCES = ("ReweightedERM", "GroupDRO")


def registered(name):
    from domainbed.registry import ALGORITHMS
    return name in ALGORITHMS


def resolve_reference(requested):
    """The reference algorithm to train: the requested one, falling back from ReweightedERM
    to GroupDRO (with a warning) when ReweightedERM is not registered."""
    if registered(requested):
        return requested
    if requested == "ReweightedERM" and registered("GroupDRO"):
        print("warning: algorithm ReweightedERM is not registered; using GroupDRO as the K "
              "reference (K_GroupDRO)", file=sys.stderr)
        return "GroupDRO"
    from domainbed.registry import ALGORITHMS
    raise UserError(f"reference algorithm {requested!r} is not registered; registered: "
                    f"{', '.join(ALGORITHMS.names())}")


def commands(args, reference):
    """[(run_dir, argv)] of every training run, ERM first for each seed."""
    hparams = parse_json_object(args.hparams, "--hparams")
    hparams = {"lr": args.lr, **hparams}
    envs = "_".join(map(str, args.test_envs))
    out = []
    for seed in args.trial_seeds:
        for algorithm in ("ERM", reference):
            run_dir = os.path.join(args.output_dir, f"{args.dataset}_env{envs}",
                                   f"{algorithm}_seed{seed}")
            argv = [args.python, "-m", "domainbed.scripts.train",
                    "--dataset", args.dataset, "--algorithm", algorithm,
                    "--data_dir", args.data_dir, "--output_dir", run_dir,
                    "--test_envs", *map(str, args.test_envs),
                    "--trial_seed", str(seed), "--seed", str(seed),
                    "--hparams_seed", "0", "--data_seed", str(args.data_seed),
                    "--hparams", json.dumps(hparams, sort_keys=True), "--save_logits",
                    "--skip_model_save"]
            if args.steps is not None:
                argv += ["--steps", str(args.steps)]
            if args.checkpoint_freq is not None:
                argv += ["--checkpoint_freq", str(args.checkpoint_freq)]
            out.append((run_dir, argv + list(args.train_args)))
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(p, "--dataset", required=True)
    add_option(p, "--data_dir", default="./domainbed/data/")
    add_option(p, "--output_dir", required=True)
    add_option(p, "--test_envs", type=int, nargs="+", required=True)
    add_option(p, "--trial_seeds", type=int, nargs="+", default=[0])
    add_option(p, "--data_seed", type=int, default=0)
    add_option(p, "--reference", default="ReweightedERM", choices=REFERENCES)
    add_option(p, "--lr", type=float, default=1e-3, help="Adam learning rate (both models)")
    add_option(p, "--hparams", help="JSON hyperparameters for both models (override --lr)")
    add_option(p, "--steps", type=int, help="training steps (default: the dataset's)")
    add_option(p, "--checkpoint_freq", type=int,
                   help="checkpoint (and logits) every N steps (default: the dataset's)")
    add_option(p, "--python", default=sys.executable, help="interpreter for the runs")
    add_option(p, "--dry_run", action="store_true", help="print the commands only")
    args = p.parse_args(argv)
    args.train_args = train_args
    if args.lr <= 0:
        raise UserError("--lr must be positive")
    reference = resolve_reference(args.reference)
    runs = commands(args, reference)
    for run_dir, cmd in runs:
        print(shlex.join(cmd), flush=True)
        if args.dry_run:
            continue
        proc = subprocess.run(cmd, cwd=ROOT)
        if proc.returncode != 0:
            raise UserError(f"training run {run_dir} failed (exit code {proc.returncode}); "
                            f"see {os.path.join(run_dir, 'err.txt')}")
    if not args.dry_run:
        print(f"K reference runs ({'ERM'} and {reference}) in {args.output_dir}; next:\n"
              f"  python -m analysis.validity report --input_dir SWEEP --k_dir "
              f"{args.output_dir}")
    return 0


if __name__ == "__main__":
    run_cli(main)
