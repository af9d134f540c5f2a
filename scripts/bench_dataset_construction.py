"""Time dataset construction (the loader's work before the first training step) per family.

    python scripts/bench_dataset_construction.py                  # fixtures in a temp dir
    python scripts/bench_dataset_construction.py --scale 4 --repeats 5
    python scripts/bench_dataset_construction.py --data_dir /data  # + real data where present
    python scripts/bench_dataset_construction.py --civil_rows 448000  # CivilComments-sized csv
    python scripts/bench_dataset_construction.py --mnli_rows 100000  # MultiNLI feature files

Fixtures are written in each benchmark's real layout by tests/dataset_fixtures.py (sizes
below, times --scale). With --data_dir, every dataset whose files are found there is timed
too. Text datasets use the hashed bag of words; their token ids are cached after the first
build (what a sweep's later runs see): "cold" is the first build with an empty cache, the
other column the median of --repeats builds after it. --civil_rows N also writes a synthetic
csv of N comments in WILDS' layout (the real file has 448,000) and times the three
CivilComments constructions on it; --mnli_rows N writes MultiNLI feature files of N pairs
(the real ones hold 412,349) and times MultiNLI ("cold": unpickling and decoding the token
ids; then the decoded texts come from the cache).
"""
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from domainbed.registry import get_dataset_class  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402
from oodutils.errors import UserError  # noqa: E402
from tests import dataset_fixtures as fx  # noqa: E402

IMAGE = {"image_size": 8}
BOW = {"text_featurizer": "bow", "text_max_length": 64}


def build_fixtures(root, scale):
    sizes = {}
    rows = fx.write_waterbirds(root, per_cell=25 * scale)
    sizes["Waterbirds"] = sizes["WILDSWaterbirds"] = len(rows)
    sizes["CelebA"] = fx.write_celeba(root, {(s, b, m): 25 * scale for s in (0, 1, 2)
                                             for b in (0, 1) for m in (0, 1)})
    sizes["MetaShift"] = fx.write_metashift(root, per_folder=75 * scale)
    spec = fx.default_civil_spec(per_cell=25 * scale)
    fx.write_civilcomments(root, spec)
    write_large_mnli(root, 60 * scale)
    sizes["MultiNLI"] = 60 * scale
    sizes["CivilComments"] = sizes["CivilCommentsIdentity"] = len(spec)
    sizes["WILDSCivilComments"] = len(spec)
    sizes["NICO_Mixed"] = sum(fx.write_nico(root).values())
    sizes["WILDSCamelyon"] = fx.write_camelyon(root, per_hospital=60 * scale)
    sizes["WILDSFMoW"] = fx.write_fmow(root, per_region=50 * scale)
    return sizes


def time_build(name, data_dir, hparams, test_envs, repeats):
    """(cold seconds or None, median warm seconds, examples)."""
    cls = get_dataset_class(name)
    cold = None
    if "text_featurizer" in hparams:
        os.environ["DOMAINBED_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-cache-")
        start = time.perf_counter()
        cls(data_dir, test_envs, hparams)
        cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dataset = cls(data_dir, test_envs, hparams)
        times.append(time.perf_counter() - start)
    return cold, statistics.median(times), sum(len(e) for e in dataset)


def write_large_civil(root, n):
    rng = np.random.RandomState(0)
    splits = rng.choice(["train", "val", "test"], size=n, p=[0.6, 0.1, 0.3])
    present = rng.rand(n, len(fx.IDENTITIES)) < 0.06
    spec = [(s, int(t), [a for a, p in zip(fx.IDENTITIES, row) if p])
            for s, t, row in zip(splits, rng.rand(n) < 0.08, present)]
    fx.write_civilcomments(root, spec)


def write_large_mnli(root, n):
    rng = np.random.RandomState(0)
    words = "the a man woman plays sings guitar piano not never happily outside".split()
    spec = [(int(s), int(y), int(neg), " ".join(rng.choice(words, 12)),
             " ".join(rng.choice(words, 8)) + (" not" if neg else ""))
            for s, y, neg in zip(rng.choice(3, n), rng.choice(3, n), rng.rand(n) < 0.2)]
    fx.write_multinli(root, spec)


CASES = [  # name, hparams, test envs
    ("Waterbirds", IMAGE, [1, 2]), ("WILDSWaterbirds", IMAGE, [1]), ("CelebA", IMAGE, [1, 2]),
    ("MetaShift", IMAGE, [1, 2]), ("NICO_Mixed", IMAGE, [2, 3]),
    ("WILDSCamelyon", IMAGE, [4]), ("WILDSFMoW", IMAGE, [5]),
    ("CivilComments", BOW, [1, 2]), ("CivilCommentsIdentity", BOW, [0]),
    ("WILDSCivilComments", BOW, [4]), ("MultiNLI", BOW, [1, 2]),
]


def main():
    p = ArgumentParser(description=__doc__.splitlines()[0])
    add_option(p, "--scale", type=int, default=1)
    add_option(p, "--repeats", type=int, default=3)
    add_option(p, "--data_dir", default=None, help="also time real data found here")
    add_option(p, "--civil_rows", type=int, default=0,
                   help="also time CivilComments on a synthetic csv of this many comments")
    add_option(p, "--mnli_rows", type=int, default=0,
                   help="also time MultiNLI on synthetic feature files of this many pairs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        build_fixtures(root, args.scale)
        targets = [("fixture", root, CASES)]
        if args.civil_rows:
            large = os.path.join(root, "large")
            write_large_civil(large, args.civil_rows)
            targets.append((f"{args.civil_rows} csv", large, CASES[-3:]))
        if args.mnli_rows:
            mnli = os.path.join(root, "mnli")
            write_large_mnli(mnli, args.mnli_rows)
            targets.append((f"{args.mnli_rows} pairs", mnli, [("MultiNLI", BOW, [1, 2])]))
        if args.data_dir:
            targets.append(("real", args.data_dir, CASES))
        print(f"{'dataset':24s} {'data':12s} {'examples':>9s} {'cold s':>8s} {'seconds':>8s}")
        for label, data_dir, cases in targets:
            for name, hparams, test_envs in cases:
                try:
                    cold, seconds, n = time_build(name, data_dir, hparams, test_envs,
                                                  args.repeats)
                except UserError as e:
                    if label == "real":
                        print(f"{name:24s} {label:12s} {'-':>9s}  ({str(e)[:70]}...)")
                        continue
                    raise
                cold = "-" if cold is None else f"{cold:.3f}"
                print(f"{name:24s} {label:12s} {n:9d} {cold:>8s} {seconds:8.3f}", flush=True)


if __name__ == "__main__":
    main()
