"""A DomainBed-format sweep of any size, built from DomainBed's test sweep: what the
collect_results benchmark (scripts/bench_collect.py) and the records tests read.

    python scripts/sweep_replica.py --runs 100000 --output_dir /tmp/big_sweep

Replica r of the test sweep's 40 runs gets its own dataset (one of DomainBed's four-domain
datasets), algorithm, trial seed, hparams seed and learning rate, and accuracies moved by
a seeded jitter that never reaches 0 or 1, so every run is distinct, selection has real
choices to make and no two candidates tie (DomainBed and we break exact ties differently).
Each run has `--checkpoints` lines (DomainBed's full protocol: 5,000 steps, a checkpoint every 300,
17 lines; the default 12 gives about 12 kB a run, 1.2 GB for 100,000 runs). Lines are
written as DomainBed writes them (json.dumps, sort_keys=True), with a ``done`` marker.
"""
import argparse
import json
import os
import random
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEMPLATE = os.path.join(ROOT, "tests", "data", "domainbed_test_sweep", "test_sweep_data")
DATASETS = ("VLCS", "PACS", "OfficeHome", "TerraIncognita")
ALGORITHMS = ("ERM", "IRM", "GroupDRO", "Mixup", "CORAL", "MMD", "DANN", "VREx")
TRIALS_PER_DATASET = 3


def template_runs(template_dir=TEMPLATE):
    """The first line of every run of the test sweep, by run, sorted by directory name."""
    runs = []
    for name in sorted(os.listdir(template_dir)):
        path = os.path.join(template_dir, name, "results.jsonl")
        if os.path.isfile(path):
            with open(path) as f:
                runs.append([json.loads(line) for line in f if line.strip()])
    return runs


def replica_line(record, replica, step, rng):
    """One checkpoint line of `record`'s run in replica `replica`, at `step`."""
    record = json.loads(json.dumps(record))
    args, hparams = record["args"], record["hparams"]
    per_cell = len(DATASETS) * len(ALGORITHMS)
    args["dataset"] = DATASETS[replica % len(DATASETS)]
    args["algorithm"] = ALGORITHMS[(replica // len(DATASETS)) % len(ALGORITHMS)]
    args["trial_seed"] += 2 * ((replica // per_cell) % TRIALS_PER_DATASET)
    args["hparams_seed"] += 2 * (replica // (per_cell * TRIALS_PER_DATASET))
    args["output_dir"] = f"sweep/{replica:06d}_{os.path.basename(args['output_dir'])}"
    hparams["lr"] = hparams["lr"] * (1 + (args["hparams_seed"] // 2) / 1000)
    for key in record:
        if key.startswith("env") and key.endswith("_acc"):
            record[key] = _jitter(record[key], rng.uniform(-0.05, 0.05))
    record["step"] = step
    record["epoch"] = step / 100
    return json.dumps(record, sort_keys=True)


def _jitter(acc, u):
    """`acc` moved by the fraction `u` of its distance to 1 (u > 0) or to 0: it stays inside
    (0, 1), so no two runs tie at a bound (DomainBed breaks ties the other way round)."""
    return acc + u * (1 - acc) if u > 0 else acc * (1 + u)


def build_sweep(output_dir, runs, checkpoints=12, template_dir=TEMPLATE, seed=0):
    """Write `runs` run directories under `output_dir`; returns the bytes of records."""
    templates = template_runs(template_dir)
    rng = random.Random(seed)
    written = 0
    os.makedirs(output_dir, exist_ok=True)
    for index in range(runs):
        replica, template = divmod(index, len(templates))
        lines = templates[template]
        run_dir = os.path.join(output_dir, f"{replica:06d}_{template:02d}")
        os.makedirs(run_dir, exist_ok=True)
        text = "".join(replica_line(lines[i % len(lines)], replica, 100 * i, rng) + "\n"
                       for i in range(checkpoints))
        with open(os.path.join(run_dir, "results.jsonl"), "w") as f:
            f.write(text)
        with open(os.path.join(run_dir, "done"), "w") as f:
            f.write("done")
        written += len(text)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    size = build_sweep(args.output_dir, args.runs, args.checkpoints)
    print(f"{args.runs} runs, {size / 1e6:.0f} MB of records in {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
