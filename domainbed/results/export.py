"""Keep the models a selection method picks (DomainBed #33): for every selection method and
table cell (dataset, algorithm, test environment, trial), the checkpoint the method chose,
hard-linked (or copied) out of its run directory with its hyperparameters, step and
scores, and one `manifest.json` for the lot.

A run keeps `model.pkl` (its last step), `model_step{N}.pkl` with
`--save_model_every_checkpoint`, and `model_best.pkl` (+ `model_best.json` naming its step)
with `--save_best_model`; a chosen step none of these holds is listed with the reason.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from typing import Any

from domainbed.results import model_selection as ms
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_json

Record = dict[str, Any]
MANIFEST = "manifest.json"
FORMAT = "domainbed-selected-models/1"


def _component(text: Any) -> str:
    """A path component from a name out of someone's records: no separators, no dots
    alone, nothing but letters, digits, '-', '_', '.', '=' and '[]'."""
    slug = re.sub(r"[^A-Za-z0-9_.=\[\]-]+", "_", str(text)).strip("._") or "_"
    return slug[:100]


def model_file_for(run_dir: str, step: int, last_step: int) -> str | None:
    """The file of `run_dir` that holds the model of `step`, or None."""
    candidates = [os.path.join(run_dir, f"model_step{step}.pkl")]
    best_meta = os.path.join(run_dir, "model_best.json")
    if os.path.isfile(best_meta):
        try:
            with open(best_meta) as f:
                if int(json.load(f).get("step", -1)) == int(step):
                    candidates.append(os.path.join(run_dir, "model_best.pkl"))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    if int(step) == int(last_step):
        candidates.append(os.path.join(run_dir, "model.pkl"))
    for path in candidates:
        if os.path.isfile(path) and not os.path.islink(path):
            return path
    return None


def _link_or_copy(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target):
        os.unlink(target)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def export_selected(records: list[Record], methods: Sequence[type[ms.SelectionMethod]],
                    output_dir: str) -> dict[str, Any]:
    """Write the chosen models and `output_dir/manifest.json`; return the manifest."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UserError(f"--export_selected {output_dir!r} is a file, not a directory")
    labels = ms.dataset_labels(records)
    last_step: dict[str, int] = {}
    hparams: dict[str, dict] = {}
    for r in records:
        run = r.get("run_dir")
        if isinstance(r.get("step"), int) and run is not None:
            last_step[run] = max(last_step.get(run, r["step"]), r["step"])
            hparams[run] = r.get("hparams") or {}
    entries = []
    for method in methods:
        selected = ms.select(records, method, labels)
        for row in selected.itertuples(index=False):
            cell = os.path.join(_component(method.key), _component(row.dataset),
                                _component(row.algorithm),
                                f"env{int(row.test_env)}_trial{_component(row.trial_seed)}")
            entry = {"method": method.key, "dataset": row.dataset,
                     "algorithm": row.algorithm, "test_env": int(row.test_env),
                     "trial_seed": row.trial_seed, "run_dir": row.run_dir,
                     "step": None if row.step is None else int(row.step),
                     "val_acc": float(row.val_acc), "test_acc": float(row.test_acc),
                     "hparams": hparams.get(row.run_dir, {}), "model": None,
                     "reason": None}
            source = model_file_for(row.run_dir, row.step, last_step.get(row.run_dir, -1)) \
                if row.step is not None else None
            if source is None:
                entry["reason"] = (f"the run kept no model of step {row.step} (train with "
                                   f"--save_model_every_checkpoint or --save_best_model)")
            else:
                _link_or_copy(source, os.path.join(output_dir, cell, "model.pkl"))
                entry["model"] = os.path.join(cell, "model.pkl")
                atomic_write_json(os.path.join(output_dir, cell, "selection.json"), entry)
            entries.append(entry)
    manifest = {"format": FORMAT, "entries": entries}
    os.makedirs(output_dir, exist_ok=True)
    atomic_write_json(os.path.join(output_dir, MANIFEST), manifest)
    return manifest
