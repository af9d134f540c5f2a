"""Time Algorithm 2 (ood_bench.estimator) on n + n d-dimensional features against the
scipy reference (ood_bench.reference: the official code's gaussian_kde steps).

    python scripts/bench_ood_bench.py                       # 10,000 + 10,000, 8-d, M = 10,000
    python scripts/bench_ood_bench.py --n 2000 --no_reference --threads 1

Features look like a trained environment classifier's (a smooth map of two latents into
d dimensions, two balanced classes whose colour-label agreement differs between the
sides). Prints both wall times, the speed-up and the two estimates (which must agree).
"""
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ood_bench.estimator import estimate_shifts  # noqa: E402
from ood_bench.reference import reference_estimate  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402


def features(n, d, agree, rng):
    w1, w2 = np.random.RandomState(123).randn(2, 16), np.random.RandomState(7).randn(16, d)
    y = np.repeat([0, 1], n // 2)
    c = np.where(rng.rand(len(y)) < agree, y, 1 - y)
    u = np.stack([2.0 * c - 1 + 0.3 * rng.randn(len(y)), rng.randn(len(y))], 1)
    return np.tanh(u @ w1) @ w2, y


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(ap, "--n", type=int, default=10000, help="features per side")
    add_option(ap, "--dim", type=int, default=8)
    add_option(ap, "--sample_size", type=int, default=10000)
    add_option(ap, "--threads", type=int, default=0, help="torch threads (0: default)")
    add_option(ap, "--device", default="cpu")
    add_option(ap, "--no_reference", action="store_true", help="skip the scipy reference")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    rng = np.random.RandomState(0)
    z_p, y_p = features(a.n, a.dim, 0.9, rng)
    z_q, y_q = features(a.n, a.dim, 0.3, rng)
    t = time.perf_counter()
    ours = estimate_shifts(z_p, y_p, z_q, y_q, sample_size=a.sample_size, seed=0,
                           device=a.device)
    t_ours = time.perf_counter() - t
    out = {"n_per_side": a.n, "dim": a.dim, "sample_size": a.sample_size,
           "torch_threads": torch.get_num_threads(), "device": a.device,
           "ours_seconds": round(t_ours, 2), "ours": {k: ours[k] for k in
                                                      ("diversity", "correlation")}}
    if not a.no_reference:
        t = time.perf_counter()
        ref = reference_estimate(z_p, y_p, z_q, y_q, sample_size=a.sample_size, seed=0)
        t_ref = time.perf_counter() - t
        out.update(scipy_seconds=round(t_ref, 2), scipy=ref,
                   speedup=round(t_ref / t_ours, 1),
                   max_abs_difference=max(abs(ours[k] - ref[k]) for k in ref))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
