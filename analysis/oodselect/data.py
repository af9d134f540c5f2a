"""OODSelect inputs: the correctness matrix, model splits, and a planted test problem.

A :class:`CorrectnessMatrix` holds ``A`` (models x OOD examples, uint8, 1 = correct),
``y`` (each model's held-out ID accuracy), a ``models`` table (one row per model:
``run`` plus, from run directories, ``run_dir``, ``step``, ``arch``, ``algorithm``) and an
``examples`` table (one row per column of A: ``id`` and, when known, ``env``, ``split``,
``label``, ``group``, ``path``). Build it from run directories with :func:`from_runs`,
from arrays or an ``.npz`` with :func:`load_matrix` (keys ``A`` and ``y``, optional
``run``, ``arch``, ``example_id``, ``label``, ``env``, ``split``, ``group``, ``path``).
"""
from __future__ import annotations

import os
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.special import expit, ndtr

from domainbed.predictions import prediction_matrix
from domainbed.results.records import TABLE_FIELDS, Record, load_records
from oodutils.accuracy import check_accuracies
from oodutils.csv_out import csv_value
from oodutils.errors import UserError, load_error_reason
from oodutils.fileio import atomic_savez
from oodutils.log import get_logger
from oodutils.untrusted import open_input, open_regular

logger = get_logger(__name__)

EXAMPLE_COLUMNS = ("label", "env", "split", "group", "path")


@dataclass
class CorrectnessMatrix:
    """A correctness matrix `A` (models x OOD examples, 1 = correct), each model's ID
    accuracy `y`, a table per model (its run, architecture, ...) and per example (its
    id, label, environment, ...), and where it came from (`info`)."""
    A: np.ndarray
    y: np.ndarray
    models: pd.DataFrame
    examples: pd.DataFrame
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.A = np.asarray(self.A)
        self.y = np.asarray(self.y, dtype=np.float64)
        if self.A.ndim != 2:
            raise UserError(f"A must be a 2-d matrix (models x examples), got shape "
                            f"{self.A.shape}")
        M, N = self.A.shape
        if self.y.shape != (M,):
            raise UserError(f"y must hold one ID accuracy per model: A has {M} rows, "
                            f"y has shape {self.y.shape}")
        if M < 5 or N < 1:
            raise UserError(f"need at least 5 models and 1 example, got A of shape {M}x{N}")
        if not np.isin(self.A, (0, 1)).all():
            raise UserError("A must hold 0/1 correctness values")
        check_accuracies(self.y, "y (the ID accuracy of each model)")
        self.A = self.A.astype(np.uint8, copy=False)
        if len(self.models) != M or len(self.examples) != N:
            raise UserError("the model and example tables must match A's shape")
        if "id" in self.examples and self.examples["id"].duplicated().any():
            dup = self.examples["id"][self.examples["id"].duplicated()].iloc[0]
            raise UserError(f"example ids must be unique; id {dup} appears more than once")

    @property
    def n_models(self) -> int:
        """Rows of A."""
        return self.A.shape[0]

    @property
    def n_examples(self) -> int:
        """Columns of A."""
        return self.A.shape[1]


def from_arrays(A: ArrayLike, y: ArrayLike, run: ArrayLike | None = None,
                arch: ArrayLike | None = None, example_id: ArrayLike | None = None,
                **example_columns: ArrayLike | None) -> CorrectnessMatrix:
    """A CorrectnessMatrix from arrays; without `run` every model is its own run."""
    A = np.asarray(A)
    if A.ndim != 2:
        raise UserError(f"A must be a 2-d matrix (models x examples), got shape {A.shape}")
    M, N = A.shape
    models = pd.DataFrame({"run": np.arange(M) if run is None else np.asarray(run)})
    if arch is not None:
        models["arch"] = np.asarray(arch)
    examples = pd.DataFrame({"id": np.arange(N) if example_id is None
                             else np.asarray(example_id)})
    for key, value in example_columns.items():
        if value is not None:
            examples[key] = np.asarray(value)
    return CorrectnessMatrix(A, np.asarray(y), models, examples)


def load_matrix(path: str | os.PathLike[str]) -> CorrectnessMatrix:
    """Read a CorrectnessMatrix from an ``.npz`` holding at least ``A`` and ``y``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"matrix file {path!r} does not exist")
    try:   # a regular file that is no symlink: a FIFO is one line, never a hang
        with open_input(path, "matrix file") as f, np.load(f, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
        raise UserError(f"cannot read matrix file {path!r}: {load_error_reason(e)}") from None
    missing = [k for k in ("A", "y") if k not in arrays]
    if missing:
        raise UserError(f"matrix file {path!r} lacks {', '.join(missing)} (it holds "
                        f"{', '.join(sorted(arrays)) or 'nothing'}); expected A (models x "
                        "examples, 0/1) and y (ID accuracy per model)")
    extra = {k: arrays.get(k) for k in EXAMPLE_COLUMNS}
    cm = from_arrays(arrays["A"], arrays["y"], run=arrays.get("run"),
                     arch=arrays.get("arch"), example_id=arrays.get("example_id"), **extra)
    for key in ("run_dir", "step", "algorithm"):
        if key in arrays:
            cm.models[key] = arrays[key]
    cm.info["source"] = path
    return cm


def save_matrix(path: str | os.PathLike[str], cm: CorrectnessMatrix) -> None:
    """Write a CorrectnessMatrix as ``.npz`` (readable back by :func:`load_matrix`)."""
    arrays = {"A": cm.A, "y": cm.y, "example_id": cm.examples["id"].to_numpy()}
    for key in ("run", "arch", "run_dir", "step", "algorithm"):
        if key in cm.models:
            arrays[key] = cm.models[key].to_numpy().astype(str if key != "step" else np.int64)
    for key in EXAMPLE_COLUMNS:
        if key in cm.examples:
            col = cm.examples[key].to_numpy()
            arrays[key] = col.astype(str) if col.dtype == object else col
    atomic_savez(path, **arrays)


# ----------------------------------------------------------------- from run directories

def _pick(name: str, wanted: Any, available: Collection[Any]) -> Any:
    found = sorted(set(available), key=str)
    if wanted is None:
        if len(found) != 1:
            raise UserError(f"several {name}s in the records ({', '.join(map(str, found))});"
                            f" choose one with --{name.replace('_', '-')}")
        return found[0]
    if wanted not in found:
        raise UserError(f"no runs with {name} {wanted!r}; found: "
                        f"{', '.join(map(str, found)) or 'none'}")
    return wanted


def from_runs(input_dir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
              dataset: str | None = None, id_envs: Sequence[int] | None = None,
              ood_env: int | None = None, require_done: bool = True, steps: str = "all",
              quiet: bool = False) -> CorrectnessMatrix:
    """Build A and y from run directories (every checkpoint with predictions = a model).

    dataset: the dataset name (may be omitted when the records hold only one).
    ood_env: the OOD environment index; runs are kept when it is among their test_envs
    (may be omitted when all kept runs share one test env).
    id_envs: the ID environments whose ``env{i}_out_acc`` are averaged into y (default:
    the environments none of the kept runs tests on).
    steps: "all" checkpoints, or "last" (one model per run).
    A covers the OOD environment's in and out splits, columns sorted by example id.
    Raises UserError when models were scored on different OOD examples, naming the runs.
    """

    recs = load_records(input_dir, require_done=require_done, quiet=quiet,
                        fields=TABLE_FIELDS).records
    if not recs:
        raise UserError(f"no finished runs (results.jsonl + done) under {input_dir}")
    dataset = _pick("dataset", dataset, [r["args"].get("dataset") for r in recs])
    recs = [r for r in recs if r["args"].get("dataset") == dataset]
    test_envs = {tuple(r["args"].get("test_envs") or ()) for r in recs}
    if ood_env is None:
        ood_env = _pick("ood_env", None, [e for t in test_envs for e in t])
    ood_env = int(ood_env)
    recs = [r for r in recs if ood_env in (r["args"].get("test_envs") or ())]
    if not recs:
        raise UserError(f"no {dataset} runs test on environment {ood_env}; their test_envs"
                        f" are {sorted(test_envs)}")
    n_envs = len(recs[0]["args"].get("env_names") or []) or 1 + max(
        int(k[3:].split("_")[0]) for k in recs[0] if k.startswith("env") and
        k.endswith("_out_acc") and k[3:].split("_")[0].isdigit())
    tested = {e for r in recs for e in r["args"].get("test_envs") or ()}
    if id_envs is None:
        id_envs = [e for e in range(n_envs) if e not in tested]
        if not id_envs:
            raise UserError("every environment is a test environment of some run; "
                            "choose the ID environments with --id_envs")
    id_envs = [int(e) for e in id_envs]
    if ood_env in id_envs:
        raise UserError(f"environment {ood_env} cannot be both ID and OOD")
    clash = sorted({r["run_dir"] for r in recs
                    if set(id_envs) & set(r["args"].get("test_envs") or ())})
    if clash:
        raise UserError(f"ID environments {id_envs} include a test environment of "
                        f"{len(clash)} run(s): {', '.join(clash[:5])}")
    if steps == "last":
        last: dict[str, Record] = {}
        for r in recs:
            if r["run_dir"] not in last or r["step"] > last[r["run_dir"]]["step"]:
                last[r["run_dir"]] = r
        recs = list(last.values())

    keys = [f"env{i}_out_acc" for i in id_envs]
    for r in recs:
        absent = [k for k in keys if k not in r]
        if absent:
            raise UserError(f"{r['run_dir']} step {r['step']} lacks {', '.join(absent)} "
                            f"(y needs the ID envs' out splits: run with --eval_splits "
                            f"all or out)")
    view = prediction_matrix(recs, ood_env, splits=(0, 1))
    missing = view.skipped
    if missing and not quiet:
        logger.warning(f"warning: {missing} checkpoint(s) without a predictions file were "
                       f"skipped")
    A = view.values
    y = np.array([float(np.mean([r[k] for k in keys])) for r in view.checkpoints])
    models = pd.DataFrame([{"run": r["run_dir"], "run_dir": r["run_dir"], "step": int(r["step"]),
                            "arch": str((r.get("hparams") or {}).get("arch", "")),
                            "algorithm": r["args"].get("algorithm")}
                           for r in view.checkpoints])
    examples = view.examples
    paths = _example_paths(os.path.join(view.checkpoints[0]["run_dir"], "examples.csv"))
    if paths is not None:
        examples = examples.merge(paths, on="id", how="left")
    info = {"dataset": dataset, "id_envs": id_envs, "ood_env": ood_env,
            "n_runs": int(models["run"].nunique()), "skipped_checkpoints": missing,
            "source": os.fspath(input_dir) if isinstance(input_dir, (str, os.PathLike))
            else [os.fspath(d) for d in input_dir]}
    return CorrectnessMatrix(A, y, models, examples, info)


def _example_paths(path: str) -> pd.DataFrame | None:
    """The id and path columns of a run's examples.csv (written by the run, read as a file
    someone else may have planted: a regular file only, never a FIFO or a symlink), or
    None when there is none or it cannot be read (with a warning: subsets are then listed
    without file paths)."""
    try:
        with open_regular(path) as f:
            paths = pd.read_csv(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, pd.errors.ParserError) as e:
        logger.warning(f"warning: {path} not read ({type(e).__name__}); subsets are listed "
                       "without file paths")
        return None
    if not {"id", "path"} <= set(paths.columns):
        return None
    ids = pd.to_numeric(paths["id"], errors="coerce")
    keep = ids.notna() & (ids == ids.round())
    return pd.DataFrame({"id": ids[keep].astype("int64"),
                         "path": paths["path"][keep].map(csv_value)})


# ----------------------------------------------------------------------------- splits

def _assign_groups(groups: Sequence[Hashable] | np.ndarray, counts: np.ndarray,
                   fractions: np.ndarray, rng: np.random.Generator) -> dict[Any, int]:
    """Shuffle groups, then cut the cumulative model count at the split fractions."""
    order = rng.permutation(len(groups))
    total = counts.sum()
    cum = np.cumsum(counts[order]) - counts[order] / 2.0   # each group's midpoint
    bounds = np.cumsum(fractions)[:-1] * total
    which = np.searchsorted(bounds, cum, side="right")
    # Keep every split non-empty where there are groups enough.
    for split in range(len(fractions)):
        if not (which == split).any() and len(groups) >= len(fractions):
            donors = [s for s in range(len(fractions)) if (which == s).sum() > 1]
            donor = max(donors, key=lambda s: (which == s).sum())
            pos = np.flatnonzero(which == donor)
            which[pos[0] if split < donor else pos[-1]] = split
    return {groups[order[i]]: int(which[i]) for i in range(len(groups))}


def split_models(groups: ArrayLike, fractions: ArrayLike = (0.6, 0.2, 0.2), seed: int = 0,
                 min_models: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded train/val/test split of models, whole groups at a time.

    groups: one label per model (its run, so checkpoints of one run never straddle
    splits; pass ``np.arange(M)`` to split checkpoints independently).
    Returns (train_idx, val_idx, test_idx), sorted model indices.
    """
    groups = np.asarray(groups)
    uniq, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(uniq) < 3:
        raise UserError(f"a train/val/test split needs models from at least 3 runs; "
                        f"found {len(uniq)} (split checkpoints independently with "
                        "--split model)")
    shares = np.asarray(fractions, dtype=float)
    shares = shares / shares.sum()
    rng = np.random.default_rng(seed)
    where = _assign_groups(np.arange(len(uniq)), counts, shares, rng)
    label = np.array([where[g] for g in inverse])
    parts = (np.flatnonzero(label == 0), np.flatnonzero(label == 1), np.flatnonzero(label == 2))
    small = [name for name, p in zip(("train", "val", "test"), parts) if len(p) < min_models]
    if small:
        raise UserError(f"the {'/'.join(small)} split would hold fewer than {min_models} "
                        f"models ({[len(p) for p in parts]} of {len(groups)}); add models")
    return parts


def split_by_arch(archs: ArrayLike, groups: ArrayLike | None = None,
                  test_archs: Sequence[str] | None = None, fractions: ArrayLike = (0.6, 0.2, 0.2),
                  seed: int = 0, min_models: int = 3
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Architecture-disjoint split: each architecture lies only in train+val or only in
    test. test_archs: the architectures to test on (default: a seeded random choice of
    whole architectures holding about fractions[2] of the models). Train and val are
    split by `groups` (runs) among the remaining models."""
    archs = np.asarray(archs).astype(str)
    uniq, counts = np.unique(archs, return_counts=True)
    if len(uniq) < 2:
        raise UserError(f"an architecture-disjoint split needs at least 2 architectures; "
                        f"found {list(uniq)} (is 'arch' in the runs' hparams?)")
    shares = np.asarray(fractions, dtype=float) / np.sum(fractions)
    rng = np.random.default_rng(seed)
    if test_archs is None:
        where = _assign_groups(list(uniq), counts,
                               np.array([1 - shares[2], shares[2]]), rng)
        test_archs = [a for a, s in where.items() if s == 1]
    else:
        test_archs = [str(a) for a in test_archs]
        unknown = sorted(set(test_archs) - set(uniq))
        if unknown:
            raise UserError(f"unknown test architecture(s) {unknown}; found {list(uniq)}")
    is_test = np.isin(archs, test_archs)
    rest = np.flatnonzero(~is_test)
    grp = np.arange(len(archs)) if groups is None else np.asarray(groups)
    sub = grp[rest]
    uniq_g, inverse, cnt = np.unique(sub, return_inverse=True, return_counts=True)
    if len(uniq_g) < 2:
        raise UserError("the non-test architectures come from fewer than 2 runs")
    tv = shares[:2] / shares[:2].sum()
    where = _assign_groups(np.arange(len(uniq_g)), cnt, tv, rng)
    lab = np.array([where[g] for g in inverse])
    parts = (rest[lab == 0], rest[lab == 1], np.flatnonzero(is_test))
    small = [n for n, p in zip(("train", "val", "test"), parts) if len(p) < min_models]
    if small:
        raise UserError(f"the architecture-disjoint {'/'.join(small)} split would hold "
                        f"fewer than {min_models} models ({[len(p) for p in parts]})")
    return parts


# ---------------------------------------------------------------- planted test problem

def planted_problem(n_runs: int = 60, checkpoints: int = 5, n_aligned: int = 300,
                    n_conflict: int = 60, strength: float = 1.5, seed: int = 0
                    ) -> tuple[CorrectnessMatrix, np.ndarray]:
    """A synthetic sweep with a hidden subset on which accuracy falls as ID rises.

    Each run has a skill and a spurious reliance; its checkpoints improve over training.
    A model's probit ID accuracy is z = skill + reliance. On "aligned" examples the
    probability of being correct rises with z; on "conflicting" examples (the planted
    subset) it rises with skill - reliance, i.e. falls with the reliance that drives ID.
    Returns (CorrectnessMatrix, planted boolean mask over the examples).
    """
    rng = np.random.default_rng(seed)
    M = n_runs * checkpoints
    run = np.repeat(np.arange(n_runs), checkpoints)
    progress = np.tile(np.linspace(0.3, 1.0, checkpoints), n_runs)
    skill = rng.normal(0.0, 0.3, n_runs)[run] * progress
    reliance = rng.normal(0.0, 0.6, n_runs)[run] * progress + 0.4 * progress
    z = skill + reliance + 0.5
    y = ndtr(z + rng.normal(0, 0.05, M))
    N = n_aligned + n_conflict
    planted = np.zeros(N, dtype=bool)
    planted[rng.choice(N, n_conflict, replace=False)] = True
    difficulty = rng.normal(0.5, 1.0, N)
    drive = np.where(planted[None, :], (skill - 1.5 * reliance)[:, None], z[:, None])
    p = expit(difficulty[None, :] + strength * drive)
    A = (rng.random((M, N)) < p).astype(np.uint8)
    label = rng.integers(0, 3, N)
    attr = np.where(planted, rng.random(N) < 0.8, rng.random(N) < 0.3).astype(int)
    cm = from_arrays(A, y, run=run, arch=np.array(["cnn", "vit", "mlp", "rnn"])[run % 4],
                     label=label, env=np.full(N, 3), group=attr)
    cm.info["planted"] = int(n_conflict)
    return cm, planted
