"""Shared test builders: DomainBed-format records (a results.jsonl line as a dict or its
text), run folders (results.jsonl, done, predictions, side files), sweeps of runs, reading a
run's records back, the text tables of collect_results, classes registered for one test.

A record as train.py writes it: ``{"args": {...}, "hparams": {...}, "step": N,
"env{i}_{in,out}_{metric}": value, ...}``; a run folder holds results.jsonl (one record a
line) and, once finished, ``done``."""
import contextlib
import json
import os
import re
from pathlib import Path

import numpy as np

from domainbed.predictions import prediction_path

RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"


def run_args(dataset="Toy", algorithm="ERM", test_envs=(0,), trial_seed=0, hparams_seed=0,
             **more):
    """A record's ``args``: the five keys every reader groups by, then `more`."""
    return {"dataset": dataset, "algorithm": algorithm, "test_envs": list(test_envs),
            "trial_seed": trial_seed, "hparams_seed": hparams_seed, **more}


def env_values(values, metric="acc"):
    """``{env: (in, out)}`` as ``env{env}_in_{metric}`` / ``env{env}_out_{metric}`` keys, in
    environment order; an env's value None leaves its key out."""
    keys = {}
    for env, pair in sorted(values.items()):
        for split, value in zip(("in", "out"), pair):
            if value is not None:
                keys[f"env{env}_{split}_{metric}"] = value
    return keys


def record(step=0, args=None, hparams=None, accs=None, **fields):
    """One record: ``args`` (default `run_args()`), ``hparams`` (default lr 0.001), the step,
    `accs` ``{env: (in_acc, out_acc)}`` as accuracy keys, then `fields` as given."""
    rec = {"args": run_args() if args is None else args,
           "hparams": {"lr": 0.001} if hparams is None else hparams, "step": step}
    rec.update(env_values(accs or {}))
    rec.update(fields)
    return rec


def toy_record(step, test_envs=(0,), trial_seed=0, hparams_seed=0, **extra):
    """A record of a two-environment Toy run: accuracies 0.5/0.5 (env 0) and 0.7/0.6
    (env 1), the epoch beside the step, then `extra`."""
    return record(step, run_args(test_envs=test_envs, trial_seed=trial_seed,
                                 hparams_seed=hparams_seed),
                  accs={0: (0.5, 0.5), 1: (0.7, 0.6)}, **{"epoch": step / 10, **extra})


def record_line(rec, sort_keys=False):
    """A record as one results.jsonl line, newline included."""
    return json.dumps(rec, sort_keys=sort_keys) + "\n"


def _as_bytes(line):
    """A record (dict) or a line as written (str or bytes, newline added if missing)."""
    if isinstance(line, dict):
        return record_line(line).encode()
    data = line if isinstance(line, bytes) else line.encode()
    return data if data.endswith(b"\n") else data + b"\n"


def write_run(run_dir, records=(), done=True, tail="", predictions=None, files=None):
    """A run folder: results.jsonl holding `records` (dicts, or lines as written: str or
    bytes) then `tail` (text with no newline added, e.g. a torn last line), ``done`` when
    finished, ``predictions/step_NNNNNNN.npz`` for each ``{step: arrays}`` of `predictions`,
    and `files` ``{name: text}`` beside them. Returns the folder (a Path)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = b"".join(_as_bytes(r) for r in records)
    data += tail if isinstance(tail, bytes) else tail.encode()
    (run_dir / RESULTS_FILE).write_bytes(data)
    for name, text in (files or {}).items():
        (run_dir / name).write_text(text)
    for step, arrays in (predictions or {}).items():
        path = prediction_path(run_dir, step)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(path, **arrays)
    if done:
        (run_dir / DONE_FILE).write_text("done\n")
    return run_dir


def write_sweep(root, runs, **options):
    """A sweep folder: `runs` ``{run folder name: records}``, each written by `write_run`
    (with `options`). Returns the root (a Path)."""
    root = Path(root)
    for name, records in runs.items():
        write_run(root / name, records, **options)
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_runs(root, records, name="run{:03d}"):
    """A sweep of `records`, one run folder per distinct ``args`` (in first-seen order,
    folders named by `name`.format(i)). Returns the root (a Path)."""
    by_run = {}
    for r in records:
        by_run.setdefault(json.dumps(r["args"], sort_keys=True), []).append(r)
    return write_sweep(root, {name.format(i): rs for i, rs in enumerate(by_run.values())})


def read_records(run_dir):
    """The records of a run folder's results.jsonl, in order (blank lines skipped)."""
    with open(Path(run_dir) / RESULTS_FILE, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def rewrite_records(run_dir, change):
    """Rewrite a run's results.jsonl with `change(record)` (it returns the new record, or
    edits it in place and returns None)."""
    records = [change(r) or r for r in read_records(run_dir)]
    (Path(run_dir) / RESULTS_FILE).write_text("".join(record_line(r) for r in records))


def parse_text_tables(text):
    """``{table header: (column labels, {algorithm: [cells]})}`` from collect_results' text
    format: a ``-------- header`` line, the ``Algorithm ...`` column line, a row per
    algorithm; a blank line ends a table."""
    tables, current = {}, None
    for line in text.splitlines():
        if line.startswith("-------- "):
            current = line[len("-------- "):].strip()
            tables[current] = (None, {})
        elif current and line.strip():
            cells = re.split(r"\s{2,}", line.strip())
            if tables[current][0] is None:
                tables[current] = (cells[1:], {})
            else:
                tables[current][1][cells[0]] = cells[1:]
        elif not line.strip():
            current = None
    return tables


@contextlib.contextmanager
def registered(registry, name, cls, override=False):
    """`cls` registered as `name` in `registry` (a domainbed Registry) for the block, the
    name's previous class (if any) put back after it: other tests list every name."""
    previous = registry.get(name) if name in registry else None
    registry.register(name, override=override)(cls)
    try:
        yield cls
    finally:
        registry.unregister(name)
        if previous is not None:
            registry.register(name)(previous)
