"""Per-example predictions of run checkpoints (``RUN/predictions/step_*.npz``): reading
one checkpoint's arrays, the examples x checkpoints matrix the analyses read, and metrics
beyond accuracy computed from them afterwards into a side file, ``metrics.jsonl`` in the
run directory (one line per checkpoint with the same ``env{i}_{split}_{metric}`` keys a run
trained with ``--metrics`` writes into its records; results.jsonl is never touched)."""
from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from oodutils.errors import UserError, load_error_reason
from oodutils.fileio import atomic_write_text
from oodutils.metrics import METRICS, classification_metrics
from oodutils.untrusted import open_regular, parse_json, read_lines

if TYPE_CHECKING:
    import pandas as pd

Record = dict[str, Any]
PathLike = Union[str, "os.PathLike[str]"]
PREDICTIONS_DIR = "predictions"
_STEP_FILE = re.compile(r"^step_(\d+)\.npz$")


def prediction_path(run_dir: PathLike, step: int) -> str:
    return os.path.join(os.fspath(run_dir), PREDICTIONS_DIR, f"step_{int(step):07d}.npz")


def list_prediction_steps(run_dir: PathLike) -> list[int]:
    """The checkpoint steps that have a predictions file in `run_dir`, ascending."""
    directory = os.path.join(os.fspath(run_dir), PREDICTIONS_DIR)
    if not os.path.isdir(directory):
        return []
    steps = []
    for name in os.listdir(directory):
        match = _STEP_FILE.match(name)
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps)


def load_predictions(run_dir: PathLike, step: int) -> dict[str, np.ndarray]:
    """The predictions of one checkpoint: a dict of arrays (id, env, split, label, pred,
    correct, group, and logits when saved). Raises UserError when missing or corrupt."""
    path = prediction_path(run_dir, step)
    if not os.path.exists(path):
        steps = list_prediction_steps(run_dir)
        have = (f"steps with predictions: {', '.join(map(str, steps))}" if steps
                else "this run has no predictions")
        raise UserError(f"no predictions for step {step} in {os.fspath(run_dir)} ({have})")
    try:
        with open_regular(path) as f, np.load(f, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise UserError(f"corrupt predictions file {path}: {load_error_reason(e)}") from None
    lengths = {key: (len(a) if a.ndim else None) for key, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}: {n}" for k, n in sorted(lengths.items()))
        raise UserError(f"corrupt predictions file {path}: its arrays differ in length "
                        f"({shown})")
    return arrays


class PredictionMatrix:
    """Per-example predictions of many checkpoints, aligned by example id.

    Attributes:
        values: array (checkpoints x examples) of the requested field ("correct" by
            default: 0/1 as uint8; "pred"; or "logits" giving checkpoints x examples x
            classes).
        examples: pandas.DataFrame, one row per column (id, env, split, label, group),
            sorted by example id.
        checkpoints: the records (dicts) of the rows, in row order.
        skipped: records skipped because their checkpoint has no predictions file.
    """

    def __init__(self, values: np.ndarray, examples: pd.DataFrame,
                 checkpoints: Iterable[Record], skipped: int = 0) -> None:
        self.values, self.examples = values, examples
        self.checkpoints, self.skipped = list(checkpoints), int(skipped)

    def __repr__(self) -> str:
        return (f"PredictionMatrix({self.values.shape[0]} checkpoints x "
                f"{self.values.shape[1]} examples, skipped={self.skipped})")


def prediction_matrix(records: Iterable[Record], env: int,
                      splits: Sequence[int] = (0, 1), field: str = "correct"
                      ) -> PredictionMatrix:
    """The examples x checkpoints view: one row per record (checkpoint) whose predictions
    file exists, one column per example of environment `env` in `splits` (0 = in,
    1 = out, 2 = the UDA split), columns sorted by example id.

    Raises UserError when no record has predictions, when the environment has no example,
    or when checkpoints were scored on different examples (naming the runs), since
    columns must mean the same example in every row.
    """
    recs = list(getattr(records, "records", records))
    rows: list[np.ndarray] = []
    kept: list[Record] = []
    ref_ids: Any = None                # the first checkpoint's example ids
    ref_meta: dict[str, Any] = {}
    differ: dict[str, int] = {}
    skipped = 0
    have: dict[str, set[int]] = {}
    for r in sorted(recs, key=lambda r: (r["run_dir"], r["step"])):
        run_dir = r["run_dir"]
        if run_dir not in have:
            have[run_dir] = set(list_prediction_steps(run_dir))
        if r["step"] not in have[run_dir]:
            skipped += 1
            continue
        pred = load_predictions(run_dir, r["step"])
        if field not in pred:
            hint = " (run with --save_logits)" if field == "logits" else ""
            raise UserError(f"{prediction_path(run_dir, r['step'])} has no {field!r}{hint}")
        sel = (pred["env"] == env) & np.isin(pred["split"], list(splits))
        order = np.argsort(pred["id"][sel], kind="stable")
        ids = pred["id"][sel][order]
        if ref_ids is None:
            ref_ids = ids
            ref_meta = {k: pred[k][sel][order] for k in ("env", "split", "label", "group")
                        if k in pred}
        elif not np.array_equal(ids, ref_ids):
            differ.setdefault(run_dir, ids.size)
            continue
        value = pred[field][sel][order]
        rows.append(value.astype(np.uint8) if field == "correct" else value)
        kept.append(r)
    if differ:
        listed = "; ".join(f"{d} ({n} examples)" for d, n in list(differ.items())[:10])
        raise UserError(f"checkpoints are not scored on the same examples of env {env}: "
                        f"the first has {ref_ids.size}, but {len(differ)} run(s) differ: "
                        f"{listed}")
    if not rows:
        raise UserError(f"none of the {len(recs)} checkpoints has a predictions file")
    if ref_ids.size == 0:
        raise UserError(f"the predictions hold no example of environment {env} in splits "
                        f"{list(splits)}")
    import pandas as pd
    examples = pd.DataFrame({"id": ref_ids, **ref_meta})
    return PredictionMatrix(np.stack(rows), examples, kept, skipped)


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


def read_side_file(run_dir: str) -> dict[int, dict]:
    """{step: line} of a run's metrics.jsonl (`run_metrics`), read the no-follow way."""
    lines: dict[int, dict] = {}
    try:
        for line in read_lines(os.path.join(run_dir, SIDE_FILE), 1 << 20):
            entry = None if line is None else parse_json(line)
            if isinstance(entry, dict) and isinstance(entry.get("step"), int):
                lines[entry["step"]] = entry
    except OSError:
        pass
    return lines


def metric_names(keys: Iterable[str]) -> set[str]:
    """The metrics beyond accuracy among record keys `env{i}_in_{metric}` (the names
    `--metrics` writes: oodutils.metrics.METRICS, per-class `acc_class<k>`)."""
    found = set()
    for key in keys:
        match = re.fullmatch(r"env\d+_in_(\w+)", key)
        if match and (match.group(1) in METRICS and match.group(1) != "class_acc" or
                      re.fullmatch(r"acc_class\d+", match.group(1))):
            found.add(match.group(1))
    return found
