"""Reading run records: results.jsonl lines, one per checkpoint, and per-example predictions.

Reads both our run directories and DomainBed's (no ``data_*`` keys, no groups). A run
directory is any directory holding a ``results.jsonl``, at any depth under the input.

    records = load_records("sweep_out")        # Records
    records.records                           # list of dicts, one per checkpoint
    frame = records_to_frame(records)          # pandas.DataFrame, one row per checkpoint

Records come from shared directories and are not trusted: only regular files are read
(never through a symlink, never a FIFO or device), a line at most ``MAX_LINE_BYTES`` long,
and each record must fit ``domainbed.results.schema``. Corrupt, truncated or ill-typed
lines, unreadable files and (with ``require_done=True``) runs without a ``done`` marker are
skipped and counted, with a warning naming each (``Records.notes``); they never stop the
read.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import polars as pl

from domainbed.results import reader
from domainbed.results.cache import Cache
from domainbed.results.reader import (  # noqa: F401 - also this module's API
    MAX_LINE_BYTES,
    Assembler,
    Frame,
    frame_from_records,
)
from oodutils.errors import UserError, load_error_reason
from oodutils.log import get_logger
from oodutils.untrusted import open_regular

if TYPE_CHECKING:
    import pandas as pd

logger = get_logger(__name__)

Record = dict[str, Any]           # one results.jsonl line, plus "run_dir"
PathLike = Union[str, "os.PathLike[str]"]

RESULTS_FILE = reader.RESULTS_FILE
DONE_FILE = reader.DONE_FILE
PREDICTIONS_DIR = reader.PREDICTIONS_DIR
_STEP_FILE = re.compile(r"^step_(\d+)\.npz$")
MAX_NOTES_SHOWN = 20
# What the results tables, the leaderboard and the analyses read of a record (with every
# ``env*`` key): load_records(fields=TABLE_FIELDS) keeps only these
TABLE_FIELDS = ("args", "hparams", "step", "epoch")


class Records:
    """The records read from one or more input directories.

    Attributes:
        frame: the records as polars tables (``domainbed.results.reader.Frame``).
        records: list of dicts, each a results.jsonl line plus ``"run_dir"`` (built from
            the frame when first asked for).
        skipped_lines: number of corrupt or truncated results.jsonl lines skipped.
        skipped_runs: number of run directories skipped (no ``done`` marker, or an
            unreadable results.jsonl).
        run_dirs: the run directories whose records were kept, in reading order.
        input_dirs: the directories that were searched.
        notes: one line per skipped line or unreadable file, naming it and why.
    """

    def __init__(self, records: Iterable[Record] | None = None, skipped_lines: int = 0,
                 skipped_runs: int = 0, run_dirs: Iterable[str] = (),
                 input_dirs: Iterable[str] = (), notes: Iterable[str] = (),
                 frame: Frame | None = None) -> None:
        self._records = list(records) if records is not None else None
        self._frame = frame
        self.notes = list(notes)
        self.skipped_lines = int(skipped_lines)
        self.skipped_runs = int(skipped_runs)
        self.run_dirs = list(run_dirs)
        self.input_dirs = list(input_dirs)

    @property
    def records(self) -> list[Record]:
        if self._records is None:
            self._records = frame_records(self.frame)
        return self._records

    @records.setter
    def records(self, records: Iterable[Record]) -> None:
        self._records, self._frame = list(records), None

    @property
    def frame(self) -> Frame:
        if self._frame is None:
            self._frame = frame_from_records(self._records or [])
        return self._frame

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else self.frame.rows.height

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __getitem__(self, index: int) -> Record:
        return self.records[index]

    def __repr__(self) -> str:
        return (f"Records({len(self)} records from {len(self.run_dirs)} runs, "
                f"skipped_lines={self.skipped_lines}, skipped_runs={self.skipped_runs})")

    def to_frame(self) -> pd.DataFrame:
        """One row per checkpoint (see `records_to_frame`): a pandas DataFrame."""
        return records_to_frame(self.records)

    def skip_summary(self) -> str | None:
        """What was skipped, in words ("2 corrupt ... lines and 1 run without ..."), or
        None when nothing was."""
        parts = []
        if self.skipped_lines:
            parts.append(f"{self.skipped_lines} corrupt or truncated results.jsonl "
                         f"line{'s' if self.skipped_lines != 1 else ''}")
        if self.skipped_runs:
            parts.append(f"{self.skipped_runs} run{'s' if self.skipped_runs != 1 else ''}"
                         f" without a '{DONE_FILE}' marker or with an unreadable "
                         f"{RESULTS_FILE}")
        return " and ".join(parts) or None

    def shown_notes(self, limit: int = MAX_NOTES_SHOWN) -> list[str]:
        """The first `limit` notes, and how many more there are, for a warning or a page."""
        more = len(self.notes) - limit
        return self.notes[:limit] + ([f"... and {more} more"] if more > 0 else [])

    def warning(self) -> str | None:
        """The one-line skip warning naming the first skipped lines and files, or None
        when nothing was skipped."""
        summary = self.skip_summary()
        if summary is None:
            return None
        named = f" ({'; '.join(self.shown_notes(5))})" if self.notes else ""
        return f"warning: skipped {summary} under {', '.join(self.input_dirs)}{named}"


def frame_records(frame: Frame) -> list[Record]:
    """The record dicts of a frame: args and hparams parsed once per block (shared by its
    records), then step, epoch and each env value the record holds."""
    blocks = frame.blocks
    args = [json.loads(t) for t in blocks["args_text"].to_list()]
    hparams = [None if t is None else json.loads(t) for t in blocks["hparams_text"].to_list()]
    run_dirs = blocks["run_dir"].to_list()
    names = [c for c in frame.rows.columns if c not in ("block", "n_envs")]
    records = []
    for row in frame.rows.select("block", *names).iter_rows():
        block = row[0]
        record: Record = {"args": args[block]}
        if hparams[block] is not None:
            record["hparams"] = hparams[block]
        record.update((k, v) for k, v in zip(names, row[1:]) if v is not None)
        record["run_dir"] = run_dirs[block]
        records.append(record)
    return records


def _as_dir_list(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(input_dir, (str, bytes, os.PathLike)):
        return [os.fspath(input_dir)]  # type: ignore[arg-type]
    dirs = [os.fspath(d) for d in input_dir]
    if not dirs:
        raise UserError("no input directory given")
    return dirs


def _checked_dirs(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    dirs = _as_dir_list(input_dir)
    for top in dirs:
        if not os.path.isdir(top):
            what = "does not exist" if not os.path.exists(top) else "is not a directory"
            raise UserError(f"input directory {top!r} {what}")
    return dirs


def find_run_dirs(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    """Every directory holding a results.jsonl under `input_dir` (itself included), in
    os.walk's order (sorted). Raises UserError when `input_dir` is not a directory."""
    return [run_dir for top in _checked_dirs(input_dir) for run_dir, _ in reader.walk(top)]


def _file_key(run_dir: str) -> tuple[int, int, int] | None:
    """(size, mtime_ns, inode) of a run's results.jsonl where it is a regular file."""
    try:
        st = os.lstat(os.path.join(run_dir, RESULTS_FILE))
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino) if (st.st_mode & 0o170000) == 0o100000 \
        else None


def load_records(input_dir: PathLike | Sequence[PathLike], require_done: bool = True,
                 quiet: bool = False, fields: Sequence[str] | None = None,
                 use_cache: bool = True) -> Records:
    """Read every run under `input_dir` (a path, or a list of paths) into a Records.

    require_done: skip runs without a ``done`` marker (still running, or killed).
    quiet: do not log the skip warning (it stays available as ``Records.warning()``).
    fields: ``TABLE_FIELDS`` keeps only the keys the tables, the leaderboard and the
    analyses read, read by the fast reader and through each input directory's records
    cache (``domainbed.results.cache``, unless `use_cache` is False); None keeps every
    key, every file read line by line.
    Lines that do not fit the records schema (``domainbed.results.schema``) and files that
    are not regular files are skipped, each with a note (``Records.notes``).
    Raises UserError when an input directory is missing.
    """
    dirs = _checked_dirs(input_dir)
    into = Assembler()
    full: list[Record] | None = None if fields is not None else []
    notes: list[str] = []
    skipped_lines = skipped_runs = 0
    kept_dirs: list[str] = []
    position = 0
    for top in dirs:
        walked = reader.walk(top)
        runs = [d for d, done in walked if done or not require_done]
        skipped_runs += len(walked) - len(runs)
        positions = list(range(position, position + len(runs)))
        position += len(runs)
        cache = Cache(top).load() if use_cache and full is None else None
        if cache is not None and cache.warning:
            logger.warning(cache.warning)
            notes.append(cache.warning)
        base = top if top.endswith(os.sep) else top + os.sep
        rels = {d: d[len(base):] if d != top else "" for d in runs}
        keys = [_file_key(d) for d in runs] if cache is not None else []
        taken = cache.take([rels[d] for d in runs], keys) if cache is not None else None
        hit: set[int] = set()
        if taken is not None:
            frame, hit_list = taken
            hit = set(hit_list)
            into.add(Frame(frame.rows, frame.blocks.drop("at")),
                     [positions[a] for a in frame.blocks["at"].to_list()])
        misses = [i for i in range(len(runs)) if i not in hit]
        reads = reader.read_runs([runs[i] for i in misses], [positions[i] for i in misses],
                                 into, fields, full)
        read_of = {r.run_dir: r for r in reads}
        for i, run_dir in enumerate(runs):
            found = read_of.get(run_dir)
            if found is None:
                kept_dirs.append(run_dir)
                continue
            path = os.path.join(run_dir, RESULTS_FILE)
            if found.error is not None:
                skipped_runs += 1
                notes.append(f"{path}: unreadable ({found.error})")
                continue
            kept_dirs.append(run_dir)
            skipped_lines += len(found.notes)
            notes += found.notes
        if cache is not None and (misses or cache.warning):
            whole = into.frame()
            cache.save(_frame_of(whole, set(runs)), rels,
                       {**{runs[i]: keys[i] for i in hit},
                        **{r.run_dir: r.key for r in reads if r.error is None}})
    result = Records(full, skipped_lines, skipped_runs, kept_dirs, dirs, notes,
                     frame=None if full is not None else _drop_empty(into.frame()))
    logger.debug(f"read {len(result)} records from {len(kept_dirs)} run(s) "
                 f"under {', '.join(map(str, dirs))}")
    message = result.warning()
    if message and not quiet:
        logger.warning(message)
    return result


def _frame_of(frame: Frame, run_dirs: set[str]) -> Frame:
    """The blocks of these runs and their rows (blocks numbered again from 0)."""
    blocks = frame.blocks.with_columns(old=pl.int_range(pl.len(), dtype=pl.Int64)) \
        .filter(pl.col("run_dir").is_in(list(run_dirs)))
    if blocks.height == frame.blocks.height:
        return frame
    number = blocks.select(block=pl.col("old"), new=pl.int_range(pl.len(), dtype=pl.Int64))
    rows = frame.rows.join(number, on="block", how="inner", maintain_order="left") \
        .with_columns(block=pl.col("new")).drop("new")
    return Frame(rows, blocks.drop("old"))


def _drop_empty(frame: Frame) -> Frame:
    """The frame without env columns that hold no value (a key no record has)."""
    empty = [c for c in frame.rows.columns if c.startswith("env") and
             frame.rows[c].null_count() == frame.rows.height]
    blocks = frame.blocks.drop([c for c in ("run",) if c in frame.blocks.columns])
    return Frame(frame.rows.drop(empty), blocks)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def records_to_frame(records: Records | Iterable[Record]) -> pd.DataFrame:
    """One row per checkpoint (a Records, or a list of record dicts).

    Columns: ``run_dir``, ``dataset``, ``algorithm``, ``test_envs`` (tuple),
    ``trial_seed``, ``hparams_seed`` (shortcuts for the args), then every arg as
    ``args.<name>``, every hyperparameter as ``hparams.<name>``, then the record's own
    keys as they are (``step``, ``epoch``, ``env0_in_acc``, ``loss``, ...). Lists become
    tuples so that every column can be grouped on.
    """
    import pandas as pd

    rows = []
    for record in getattr(records, "records", records):
        args = record.get("args") or {}
        hparams = record.get("hparams") or {}
        row = {
            "run_dir": record.get("run_dir"),
            "dataset": args.get("dataset"),
            "algorithm": args.get("algorithm"),
            "test_envs": _hashable(args.get("test_envs")),
            "trial_seed": args.get("trial_seed"),
            "hparams_seed": args.get("hparams_seed"),
        }
        for key, value in args.items():
            row[f"args.{key}"] = _hashable(value)
        for key, value in hparams.items():
            row[f"hparams.{key}"] = _hashable(value)
        for key, value in record.items():
            if key not in ("args", "hparams", "run_dir"):
                row[key] = _hashable(value)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=["run_dir", "dataset", "algorithm", "test_envs",
                                     "trial_seed", "hparams_seed"])
    return pd.DataFrame(rows)


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


def prediction_matrix(records: Records | Iterable[Record], env: int,
                      splits: Sequence[int] = (0, 1), field: str = "correct"
                      ) -> PredictionMatrix:
    """The examples x checkpoints view: one row per record (checkpoint) whose predictions
    file exists, one column per example of environment `env` in `splits` (0 = in,
    1 = out, 2 = the UDA split), columns sorted by example id.

    Raises UserError when no record has predictions, when the environment has no example,
    or when checkpoints were scored on different examples (naming the runs), since
    columns must mean the same example in every row.
    """
    recs = records.records if isinstance(records, Records) else list(records)
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
