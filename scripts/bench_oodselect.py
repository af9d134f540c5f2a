"""Time one OODSelect selection on a synthetic models x examples correctness matrix.

    python scripts/bench_oodselect.py                      # 1,000 x 50,000, 3,000 steps
    python scripts/bench_oodselect.py --models 300 --examples 5000 --steps 500

Fixed hyperparameters, one subset size, 60/20/20 model split; by default early stopping
is off (--patience = --steps), so all steps run: the figure is the full budget. Prints
the wall time, the time per step, and the test-model correlation reached.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from analysis.oodselect import Hparams, OODSelect, subset_correlation  # noqa: E402
from analysis.oodselect.data import split_models  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402


def synthetic(M, N, conflict=0.1, seed=0):
    """A x y with a planted conflicting tenth of the examples, built in float32 chunks."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1, M).astype(np.float32)
    y = 1 / (1 + np.exp(-(0.5 + z)))
    planted = rng.random(N) < conflict
    diff = rng.normal(0.5, 1, N).astype(np.float32)
    sign = np.where(planted, -1.0, 1.0).astype(np.float32)
    A = np.empty((M, N), dtype=np.uint8)
    for lo in range(0, M, 100):
        logit = diff[None, :] + sign[None, :] * z[lo:lo + 100, None]
        A[lo:lo + 100] = rng.random(logit.shape, dtype=np.float32) < 1 / (1 + np.exp(-logit))
    return A, y, planted


def main(argv=None):
    p = ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--models", type=int, default=1000)
    add_option(p, "--examples", type=int, default=50000)
    add_option(p, "--steps", type=int, default=3000)
    add_option(p, "--patience", type=int, default=None, help="default: --steps (no stop)")
    add_option(p, "--size", type=int, default=None, help="subset size (default N/10)")
    add_option(p, "--device", default="auto")
    add_option(p, "--threads", type=int, default=None)
    add_option(p, "--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    A, y, planted = synthetic(args.models, args.examples, seed=args.seed)
    tr, va, te = split_models(np.arange(args.models), seed=args.seed)
    n = args.size or max(1, args.examples // 10)
    print(f"matrix {args.models} x {args.examples} built in {time.time() - t0:.1f}s; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cuda={torch.cuda.is_available()}, load average {os.getloadavg()[0]:.1f}")
    sel = OODSelect(hparams=Hparams(), steps=args.steps,
                    patience=args.patience or args.steps, seed=args.seed, device=args.device)
    t0 = time.time()
    sel.fit(A[tr], y[tr], n, A[va], y[va])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.time() - t0
    steps = int(sel.n_steps_[0])
    sub = sel.subsets_[0]
    print(f"selection n={n}: {steps} steps in {wall:.1f}s ({1000 * wall / steps:.1f} ms/step)"
          f"; val r {sel.val_r_[0]:.3f}, test r "
          f"{subset_correlation(A[te], y[te], sub):.3f}, planted recall "
          f"{planted[sub].mean():.2f}")
    return wall


if __name__ == "__main__":
    main()
