"""ERM on procedural Spawrious: in-distribution vs out-of-distribution accuracy, and the
test-environment confusion matrix showing errors toward the class whose training
background is the test background.

    python scripts/spawrious_erm_demo.py --root /tmp/spawrious --per_cell 300 \
        --benchmarks o2o_easy m2m_hard --steps 2000 --output_dir /tmp/spawrious_erm

1. generates the images if ROOT lacks them (`python -m spawrious.generate --backend
   procedural`, resumable), 2. trains ERM with `python -m domainbed.scripts.train`
   (test env 0 = "Test"), 3. reads results.jsonl and the per-example predictions, picks
   the checkpoint by training-domain validation (mean out-split accuracy of the training
   environments), and prints ID accuracy (that mean), OOD accuracy (all test-env
   examples), the confusion matrix and the share of OOD errors that predict a class
   trained on the test image's background. Writes summary.json and summary.md.
"""
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from oodutils.cli import ArgumentParser, add_option, parse_json_object  # noqa: E402
from oodutils.errors import UserError, run_cli  # noqa: E402
from oodutils.fileio import atomic_write_json, atomic_write_text  # noqa: E402
from spawrious.constants import CLASS_LIST, LOCATIONS  # noqa: E402
from spawrious.splits import build_split, check_benchmark  # noqa: E402

DATASET_NAMES = {"o2o_easy": "SpawriousO2O_easy", "o2o_medium": "SpawriousO2O_medium",
                 "o2o_hard": "SpawriousO2O_hard", "m2m_easy": "SpawriousM2M_easy",
                 "m2m_medium": "SpawriousM2M_medium", "m2m_hard": "SpawriousM2M_hard"}
DEFAULT_HPARAMS = {"resnet18": True, "pretrained": False, "batch_size": 64, "lr": 1e-3}


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    result = subprocess.run(cmd, cwd=REPO)
    if result.returncode != 0:
        raise UserError(f"command failed with exit code {result.returncode}: {' '.join(cmd)}")


def trained_on(benchmark, per_cell):
    """{location index: set of labels trained on that background}."""
    out = {}
    for (env, breed, loc), k in build_split(benchmark, per_cell).counts().items():
        if env != "Test" and k:
            out.setdefault(LOCATIONS.index(loc), set()).add(CLASS_LIST.index(breed))
    return out


def analyse(run_dir, benchmark, per_cell):
    from domainbed.predictions import load_predictions
    records = [json.loads(line) for line in open(os.path.join(run_dir, "results.jsonl"))]
    train_envs = [1, 2]
    best = max(records, key=lambda r: np.mean([r[f"env{e}_out_acc"] for e in train_envs]))
    p = load_predictions(run_dir, best["step"])
    test = p["env"] == 0
    label, pred, loc = p["label"][test], p["pred"][test], p["group"][test] % len(LOCATIONS)
    confusion = np.zeros((4, 4), dtype=int)
    np.add.at(confusion, (label, pred), 1)
    spurious = trained_on(benchmark, per_cell)
    wrong = pred != label
    toward = np.array([pr in spurious.get(lo, set()) for pr, lo in zip(pred, loc)])
    return {
        "benchmark": benchmark, "step": int(best["step"]),
        "id_acc": float(np.mean([best[f"env{e}_out_acc"] for e in train_envs])),
        "ood_acc": float((pred == label).mean()),
        "ood_wga": float(min(best.get("env0_in_wga", 1.0), best.get("env0_out_wga", 1.0))),
        "errors_toward_background_class": float(toward[wrong].mean()) if wrong.any() else 0.0,
        "confusion": confusion.tolist(), "classes": list(CLASS_LIST),
        "last_step": {k: v for k, v in records[-1].items() if k.endswith("_acc") and "_g" not in k},
    }


def format_result(r):
    width = max(len(c) for c in r["classes"]) + 2
    lines = [f"## {r['benchmark']} (checkpoint {r['step']}, training-domain validation)",
             f"ID accuracy (training envs, held-out): {r['id_acc']:.3f}",
             f"OOD accuracy (Test env): {r['ood_acc']:.3f}   worst group: {r['ood_wga']:.3f}",
             f"OOD errors predicting a class trained on the test background: "
             f"{r['errors_toward_background_class']:.1%}", "",
             "Test-env confusion (rows: true class, columns: predicted):",
             " " * width + "".join(c[:9].rjust(10) for c in r["classes"])]
    for c, row in zip(r["classes"], r["confusion"]):
        lines.append(c.ljust(width) + "".join(str(v).rjust(10) for v in row))
    return "\n".join(lines)


def main(argv=None):
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(ap, "--root", required=True, help="data dir (images generated here if missing)")
    add_option(ap, "--per_cell", type=int, default=300)
    add_option(ap, "--size", type=int, default=224)
    add_option(ap, "--seed", type=int, default=0)
    add_option(ap, "--benchmarks", nargs="+", default=["o2o_easy", "m2m_hard"])
    add_option(ap, "--steps", type=int, default=2000)
    add_option(ap, "--checkpoint_freq", type=int, default=200)
    add_option(ap, "--hparams", default=json.dumps(DEFAULT_HPARAMS),
                    help="JSON for the train CLI (image_size is set from --size)")
    add_option(ap, "--output_dir", required=True)
    add_option(ap, "--train_args", default="", help="extra flags for domainbed.scripts.train")
    args = ap.parse_args(argv)
    benchmarks = [check_benchmark(b) for b in args.benchmarks]
    hparams = parse_json_object(args.hparams, "--hparams")
    hparams["image_size"] = args.size
    run([sys.executable, "-m", "spawrious.generate", "--backend", "procedural",
         "--output_dir", args.root,
         "--per_cell", str(args.per_cell), "--seed", str(args.seed), "--size", str(args.size)])
    os.makedirs(args.output_dir, exist_ok=True)
    results = []
    for b in benchmarks:
        run_dir = os.path.join(args.output_dir, b)
        run([sys.executable, "-m", "domainbed.scripts.train", "--data_dir", args.root,
             "--dataset", DATASET_NAMES[b], "--algorithm", "ERM", "--test_envs", "0",
             "--steps", str(args.steps), "--checkpoint_freq", str(args.checkpoint_freq),
             "--output_dir", run_dir, "--hparams", json.dumps(hparams)] + args.train_args.split())
        results.append(analyse(run_dir, b, args.per_cell))
        print(format_result(results[-1]), flush=True)
    atomic_write_json(os.path.join(args.output_dir, "summary.json"), results)
    atomic_write_text(os.path.join(args.output_dir, "summary.md"),
                      "\n\n".join(format_result(r) for r in results) + "\n")
    return 0


if __name__ == "__main__":
    run_cli(main)
