"""Inputs of the accuracy-on-the-line analysis: accuracy CSVs and sweep directories.

Both become one :class:`Accuracies` table, one row per classifier (a checkpoint) and per
leave-one-domain-out split, with the classifier's accuracy on every environment:

    dataset  ood_env  model  run  step  algorithm  model_hparams  acc0  acc1 ...  acc0_g0 ...

``acc{i}`` is the accuracy on environment ``i`` (its ``out`` split by default),
``acc{i}_g{g}`` the accuracy on group ``g`` of it (only from sweeps of datasets with
groups). ``run`` names the training run a checkpoint belongs to (bootstraps resample whole
runs, since the checkpoints of a run are not independent models).

Accuracy CSV schema (the one of ``tests/data/aotl_reference``; see its README): columns
``x,y,train_env,algorithm,model_hparams,dataset,test_env``, one row per classifier and ID
environment; rows of one classifier sit at the same position of every ``train_env`` block.
Files may be gzip-compressed. Our exporter adds two optional trailing columns, ``run`` and
``step``, which the reader uses where present and other readers can ignore.
"""
from __future__ import annotations

import gzip
import os
import re
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from analysis.aotl.options import CHECKPOINTS, SPLITS
from domainbed.results.records import TABLE_FIELDS, load_records
from oodutils.accuracy import check_accuracies
from oodutils.csv_out import csv_value, frame_csv
from oodutils.errors import UnknownNameError, UserError
from oodutils.fileio import atomic_write_bytes, file_name_part, utf8_bytes
from oodutils.log import get_logger
from oodutils.untrusted import open_input

logger = get_logger(__name__)

CSV_COLUMNS = ["x", "y", "train_env", "algorithm", "model_hparams", "dataset", "test_env"]
REQUIRED_CSV_COLUMNS = ["x", "y", "train_env", "dataset", "test_env"]
META_COLUMNS = ["dataset", "ood_env", "model", "run", "step", "algorithm", "model_hparams"]

_ACC_RE = re.compile(r"^acc(\d+)$")
_GROUP_RE = re.compile(r"^acc(\d+)_g(\d+)$")
T = TypeVar("T")
PathLike = str | os.PathLike[str]


@dataclass
class Accuracies:
    """One row per (classifier, OOD environment); see the module docstring."""
    frame: pd.DataFrame
    env_names: dict = field(default_factory=dict)    # dataset -> list[str]
    group_names: dict = field(default_factory=dict)  # dataset -> list[str]
    notices: list = field(default_factory=list)

    def _cached(self, key: Hashable, make: Callable[[], T]) -> T:
        # Tables ask for the same subsets again and again; cache them per frame object.
        if getattr(self, "_cache_frame", None) is not self.frame:
            self._cache_frame = self.frame
            self._cache: dict[Hashable, Any] = {}
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def datasets(self) -> list[str]:
        return self._cached("datasets", lambda: list(dict.fromkeys(self.frame["dataset"])))

    def splits(self) -> list[tuple[str, int]]:
        """(dataset, ood_env) pairs, in order of appearance."""
        def make() -> list[tuple[str, int]]:
            pairs = self.frame[["dataset", "ood_env"]].drop_duplicates()
            return [(d, int(e)) for d, e in pairs.itertuples(index=False, name=None)]
        return self._cached("splits", make)

    def subset(self, dataset: str, ood_env: int) -> pd.DataFrame:
        """The rows of one split, without the columns it has no value in."""
        def make() -> pd.DataFrame:
            f = self.frame
            sub = f[(f["dataset"] == dataset) & (f["ood_env"] == ood_env)]
            return sub.loc[:, sub.notna().any(axis=0)]
        return self._cached(("subset", dataset, ood_env), make)

    def _columns(self, dataset: str) -> list[str]:
        def make() -> list[str]:
            sub = self.frame[self.frame["dataset"] == dataset]
            return [c for c in sub.columns if sub[c].notna().any()]
        return self._cached(("columns", dataset), make)

    def envs(self, dataset: str) -> list[int]:
        """Environment indices with accuracies for ``dataset``."""
        return sorted(int(m.group(1)) for c in self._columns(dataset) if (m := _ACC_RE.match(c)))

    def groups(self, dataset: str) -> list[int]:
        """Group indices with per-group accuracies for ``dataset``."""
        return sorted({int(m.group(2)) for c in self._columns(dataset)
                       if (m := _GROUP_RE.match(c))})

    def group_label(self, dataset: str, g: int) -> str:
        names = self.group_names.get(dataset) or []
        return str(names[g]) if g < len(names) else f"g{g}"

    def notice(self, message: str) -> None:
        self.notices.append(message)


def acc_col(env: int, group: int | None = None) -> str:
    return f"acc{env}" if group is None else f"acc{env}_g{group}"


def check_range(values: Any, what: str) -> None:
    """UserError unless every value is a finite accuracy in [0, 1] (none is fine)."""
    check_accuracies(values, what, allow_empty=True)


# ---------------------------------------------------------------------------- CSV files

def _read_one_csv(path: PathLike) -> pd.DataFrame:
    open_input(path, "accuracy CSV").close()   # a FIFO or symlink: one line, never a hang
    try:
        df = pd.read_csv(path, compression="infer")
    except (OSError, EOFError, ValueError, pd.errors.ParserError) as e:
        raise UserError(f"{path}: cannot read as an accuracy CSV ({e})") from None
    missing = [c for c in REQUIRED_CSV_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; an accuracy CSV needs "
                        f"{', '.join(CSV_COLUMNS)}")
    if df.empty:
        raise UserError(f"{path}: no rows")
    for c in df.columns:        # names our own CSVs escaped (=, +, -, @) read as written
        if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]):
            df[c] = df[c].map(csv_value)
    for c in ("x", "y"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
        check_range(df[c].to_numpy(), f"{path}: column {c}")
    for c in ("train_env", "test_env"):
        env = pd.to_numeric(df[c], errors="coerce")
        if env.isna().any() or (env != env.round()).any() or (env < 0).any():
            raise UserError(f"{path}: column {c} must hold environment indices (integers >= 0)")
        df[c] = env.astype(int)
    return df


def _csv_blocks_to_rows(df: pd.DataFrame, path: PathLike, file_index: int) -> pd.DataFrame:
    """One file's rows for one (dataset, test_env) -> one row per classifier."""
    dataset, ood = df["dataset"].iloc[0], int(df["test_env"].iloc[0])
    where = f"{path} ({dataset}, test_env {ood})"
    if (df["train_env"] == ood).any():
        raise UserError(f"{where}: rows with train_env == test_env")
    blocks = {int(e): b.reset_index(drop=True) for e, b in df.groupby("train_env", sort=True)}
    sizes = {e: len(b) for e, b in blocks.items()}
    if len(set(sizes.values())) != 1:
        raise UserError(f"{where}: the train_env blocks differ in length {sizes}; every "
                        "classifier needs one row per ID environment")
    first = next(iter(blocks.values()))
    for e, b in blocks.items():
        if not np.allclose(b["y"].to_numpy(), first["y"].to_numpy(), rtol=0, atol=1e-9):
            raise UserError(f"{where}: the OOD accuracy y differs between the train_env blocks "
                            f"at the same position (block {e}); rows are not aligned by classifier")
    n = len(first)
    prefix = f"f{file_index}:{dataset}:{ood}:"
    out = pd.DataFrame({
        "dataset": str(dataset), "ood_env": ood,
        "model": [f"{prefix}{i}" for i in range(n)],
        "run": (first["run"].astype(str).to_numpy() if "run" in first
                else [f"{prefix}{i}" for i in range(n)]),
        "step": first["step"].to_numpy(dtype=float) if "step" in first else np.nan,
        "algorithm": first["algorithm"].astype(str).to_numpy() if "algorithm" in first else "",
        "model_hparams": (first["model_hparams"].astype(str).to_numpy()
                          if "model_hparams" in first else ""),
    })
    for e, b in blocks.items():
        out[acc_col(e)] = b["x"].to_numpy(dtype=float)
    out[acc_col(ood)] = first["y"].to_numpy(dtype=float)
    return out


def read_accuracy_csvs(paths: Iterable[PathLike]) -> Accuracies:
    """Read accuracy CSV files (plain or .gz) in the shared schema."""
    parts = []
    for i, path in enumerate(paths):
        df = _read_one_csv(path)
        for _, sub in df.groupby(["dataset", "test_env"], sort=False):
            parts.append(_csv_blocks_to_rows(sub, path, i))
    if not parts:
        raise UserError("no accuracy CSV files given")
    return Accuracies(_finish_frame(pd.concat(parts, ignore_index=True)))


# ---------------------------------------------------------------------------- sweeps

def _load_records(path: PathLike) -> list[dict[str, Any]]:
    return load_records(path, fields=TABLE_FIELDS).records


def _dataset_labels(records: Sequence[dict[str, Any]]) -> list[str]:
    """Dataset name per record; runs on different data (fingerprints) never pool."""
    fps: dict[Any, set[Any]] = {}
    for r in records:
        a = r.get("args", {})
        fps.setdefault(a.get("dataset"), set()).add(a.get("data_fingerprint"))
    labels = []
    for r in records:
        a = r.get("args", {})
        name, fp = str(a.get("dataset")), a.get("data_fingerprint")
        labels.append(f"{name}@{str(fp)[:8]}" if len(fps[a.get("dataset")]) > 1 else name)
    return labels


def accuracies_from_records(records: Iterable[dict[str, Any]], split: str = "out",
                            checkpoints: str = "all",
                            algorithms: Collection[str] | None = None) -> Accuracies:
    """Records (dicts: a results.jsonl line plus ``run_dir``) -> :class:`Accuracies`.

    Runs with exactly one test environment give the points of that leave-one-domain-out
    split; others are left out and counted in a notice. ``checkpoints``: ``all`` (one point
    per checkpoint), ``last`` or ``best`` (per run, the checkpoint with the best
    training-domain validation accuracy: mean ``out`` accuracy over the ID environments).
    """
    if split not in SPLITS:
        raise UnknownNameError("split", split, SPLITS)
    if checkpoints not in CHECKPOINTS:
        raise UnknownNameError("checkpoint selection", checkpoints, CHECKPOINTS)
    records = list(records)
    if not records:
        raise UserError("no records found (empty sweep, or no finished run with a `done` file)")
    acc_re = re.compile(rf"^env(\d+)_{split}_acc$")
    grp_re = re.compile(rf"^env(\d+)_{split}_acc_g(\d+)$")
    val_re = re.compile(r"^env(\d+)_out_acc$")
    labels = _dataset_labels(records)
    rows: list[dict[str, Any]] = []
    runs_multi: set[str] = set()
    runs_zero: set[str] = set()
    runs_algo: set[str] = set()
    env_names: dict[str, list[str]] = {}
    group_names: dict[str, list[str]] = {}
    for rec, dataset in zip(records, labels):
        a = rec.get("args", {})
        run = str(rec.get("run_dir", a.get("output_dir", "")))
        test_envs = list(a.get("test_envs") or [])
        if len(test_envs) != 1:
            (runs_zero if not test_envs else runs_multi).add(run)
            continue
        if algorithms and a.get("algorithm") not in algorithms:
            runs_algo.add(run)
            continue
        ood = int(test_envs[0])
        row = {"dataset": dataset, "ood_env": ood, "run": run,
               "model": f"{run}@{rec.get('step')}", "step": rec.get("step"),
               "algorithm": str(a.get("algorithm", "")),
               "model_hparams": str(rec.get("hparams", "")), "_val": np.nan}
        vals = []
        for k, v in rec.items():
            if (m := acc_re.match(k)):
                row[acc_col(int(m.group(1)))] = v
            elif (m := grp_re.match(k)):
                row[acc_col(int(m.group(1)), int(m.group(2)))] = v
            if (m := val_re.match(k)) and int(m.group(1)) != ood and v is not None:
                vals.append(v)
        if vals:
            row["_val"] = float(np.mean(vals))
        rows.append(row)
        if a.get("env_names"):
            env_names.setdefault(dataset, list(a["env_names"]))
        if a.get("group_names"):
            group_names.setdefault(dataset, list(a["group_names"]))
    notices = []
    if runs_multi or runs_zero:
        notices.append(f"left out {len(runs_multi)} run(s) with more than one test environment "
                       f"and {len(runs_zero)} with none: accuracy on the line needs "
                       "leave-one-domain-out runs (exactly one test environment)")
    if runs_algo:
        notices.append(f"left out {len(runs_algo)} run(s) of other algorithms")
    if not rows:
        raise UserError("no run with exactly one test environment in the sweep"
                        + (f" ({notices[0]})" if notices else ""))
    frame = pd.DataFrame(rows)
    if not any(_ACC_RE.match(c) for c in frame.columns):
        raise UserError(f"the records have no env{{i}}_{split}_acc keys (the runs did not "
                        f"evaluate the {split} splits, see --eval_splits; a fit needs them)")
    if checkpoints != "all":
        frame = frame.sort_values(["run", "step"], kind="stable")
        if checkpoints == "last":
            frame = frame.groupby("run", sort=False).tail(1)
        else:
            if frame["_val"].isna().any():
                raise UserError("checkpoint selection 'best' needs env{i}_out_acc keys")
            frame = frame.loc[frame.groupby("run", sort=False)["_val"].idxmax()]
    frame = frame.drop(columns="_val")
    for c in frame.columns:
        if _ACC_RE.match(c) or _GROUP_RE.match(c):
            frame[c] = pd.to_numeric(frame[c], errors="coerce")
            vals = frame[c].to_numpy(dtype=float)
            check_range(vals[np.isfinite(vals)], f"records: {c.replace('acc', 'env')}")
    return Accuracies(_finish_frame(frame), env_names, group_names, notices)


def _finish_frame(frame: pd.DataFrame) -> pd.DataFrame:
    accs = sorted((c for c in frame.columns if _ACC_RE.match(c)),
                  key=lambda c: int(_ACC_RE.match(c).group(1)))  # type: ignore[union-attr]
    groups = sorted((c for c in frame.columns if _GROUP_RE.match(c)),
                    key=lambda c: tuple(int(x) for x in
                                        _GROUP_RE.match(c).groups()))  # type: ignore[union-attr]
    frame = frame[META_COLUMNS + accs + groups].reset_index(drop=True)
    frame["ood_env"] = frame["ood_env"].astype(int)
    return frame


# ---------------------------------------------------------------------------- dispatch

def _csv_files(directory: PathLike) -> list[Path]:
    files = sorted(p for p in Path(directory).rglob("*")
                   if p.is_file() and (p.name.endswith(".csv") or p.name.endswith(".csv.gz")))
    return files


def load_accuracies(paths: Iterable[PathLike], split: str = "out", checkpoints: str = "all",
                    algorithms: Collection[str] | None = None) -> Accuracies:
    """Sweep directories and/or accuracy CSV files (or directories of them) -> Accuracies.

    A directory holding any ``results.jsonl`` is read as a sweep; otherwise its ``*.csv``
    and ``*.csv.gz`` files are read as accuracy CSVs. ``split``/``checkpoints`` apply to
    sweeps (CSV files already hold one accuracy per classifier and environment).
    """
    given = [Path(p) for p in paths]
    if not given:
        raise UserError("no input path given")
    csvs: list[Path] = []
    sets: list[Accuracies] = []
    for p in given:
        if not p.exists():
            raise UserError(f"{p}: no such file or directory")
        if p.is_dir():
            if next(p.rglob("results.jsonl"), None) is not None:
                sets.append(accuracies_from_records(_load_records(p), split, checkpoints,
                                                    algorithms))
                continue
            found = _csv_files(p)
            if not found:
                raise UserError(f"{p}: neither a sweep directory (no results.jsonl) nor a "
                                "directory of accuracy CSV files")
            csvs += found
        else:
            csvs.append(p)
    if csvs:
        acc = read_accuracy_csvs(csvs)
        if algorithms:
            keep = acc.frame["algorithm"].isin(algorithms)
            acc.frame = acc.frame[keep].reset_index(drop=True)
            if acc.frame.empty:
                raise UserError(f"no classifier of algorithm(s) {', '.join(algorithms)}")
        sets.append(acc)
    return merge(sets)


def merge(sets: Sequence[Accuracies]) -> Accuracies:
    if len(sets) == 1:
        return sets[0]
    frame = _finish_frame(pd.concat([s.frame for s in sets], ignore_index=True))
    out = Accuracies(frame)
    for s in sets:
        for k, v in s.env_names.items():
            out.env_names.setdefault(k, v)
        for k, v in s.group_names.items():
            out.group_names.setdefault(k, v)
        out.notices += s.notices
    return out


# ---------------------------------------------------------------------------- export

def to_csv_frame(acc: Accuracies, dataset: str, ood_env: int) -> pd.DataFrame:
    """One split's accuracies in the shared CSV schema (plus ``run``, ``step``)."""
    sub = acc.subset(dataset, ood_env)
    cols = [acc_col(e) for e in acc.envs(dataset) if acc_col(e) in sub]
    sub = sub[sub[cols].notna().all(axis=1)]  # every block must hold the same classifiers
    parts = []
    for e in acc.envs(dataset):
        if e == ood_env or acc_col(e) not in sub:
            continue
        parts.append(pd.DataFrame({
            "x": sub[acc_col(e)].to_numpy(), "y": sub[acc_col(ood_env)].to_numpy(),
            "train_env": e, "algorithm": sub["algorithm"].to_numpy(),
            "model_hparams": sub["model_hparams"].to_numpy(), "dataset": dataset,
            "test_env": ood_env, "run": sub["run"].to_numpy(), "step": sub["step"].to_numpy()}))
    return pd.concat(parts, ignore_index=True)


def export_csv(acc: Accuracies, out_dir: PathLike, split: str = "out") -> list[Path]:
    """Write ``<out_dir>/<dataset>/env<k>_<split>_acc.csv.gz`` per split; returns the paths."""
    out_path = Path(out_dir)
    written = []
    for dataset, ood in acc.splits():
        frame = to_csv_frame(acc, dataset, ood)
        path = out_path / file_name_part(dataset) / f"env{ood}_{split}_acc.csv.gz"
        data = gzip.compress(utf8_bytes(frame_csv(frame)), mtime=0)
        atomic_write_bytes(path, data)
        written.append(path)
    return written


def warn(message: str) -> None:
    """Notices go to stderr, once each, so stdout stays a clean table."""
    logger.info(f"notice: {message}")


__all__ = ["Accuracies", "CSV_COLUMNS", "load_accuracies", "read_accuracy_csvs",
           "accuracies_from_records", "export_csv", "to_csv_frame", "check_range", "acc_col",
           "merge"]
