"""Metrics beyond accuracy computed afterwards, from a run's saved predictions (and its
logits, where the run saved them), into a side file: `metrics.jsonl` in the run directory,
one line per checkpoint with the same `env{i}_{split}_{metric}` keys a run trained with
`--metrics` writes into its records. results.jsonl is never touched."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from domainbed.results.records import list_prediction_steps, load_predictions
from oodutils.fileio import atomic_write_text
from oodutils.metrics import METRICS, classification_metrics

SIDE_FILE = "metrics.jsonl"
SPLIT_NAMES = {0: "in", 1: "out", 2: "uda"}


def checkpoint_metrics(arrays: dict[str, np.ndarray], num_classes: int,
                       names: Sequence[str]) -> dict[str, float]:
    """{env{i}_{split}_{metric}: value} of one checkpoint's predictions."""
    out: dict[str, float] = {}
    logits = arrays.get("logits")
    for env in np.unique(arrays["env"]):
        for code, split in SPLIT_NAMES.items():
            mask = (arrays["env"] == env) & (arrays["split"] == code)
            if not mask.any():
                continue
            values = classification_metrics(
                arrays["label"][mask], arrays["pred"][mask],
                None if logits is None else logits[mask].astype(np.float32),
                num_classes, names)
            out.update({f"env{int(env)}_{split}_{k}": v for k, v in values.items()})
    return out


def run_metrics(run_dir: str, num_classes: int,
                names: Sequence[str] = tuple(METRICS)) -> list[dict[str, Any]]:
    """One dict per checkpoint with predictions: `step` and the metrics; written to
    `run_dir/metrics.jsonl` (atomically) and returned."""
    lines = []
    for step in list_prediction_steps(run_dir):
        arrays = load_predictions(run_dir, step)
        lines.append({"step": step, **checkpoint_metrics(arrays, num_classes, names)})
    atomic_write_text(os.path.join(run_dir, SIDE_FILE),
                      "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return lines
