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

import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from domainbed.results import parallel_read
from domainbed.results.columns import ColumnTable, Part, TableBuilder, file_parts
from domainbed.results.lines import (
    MAX_LINE_BYTES,
    parse_run_lines,
    parse_whole_file,
    whole_file_part,
)
from domainbed.results.record_index import RecordIndex, index_cap, is_regular, stat_key
from oodutils.errors import UserError, load_error_reason
from oodutils.log import get_logger
from oodutils.untrusted import open_regular, read_lines

if TYPE_CHECKING:
    import pandas as pd

logger = get_logger(__name__)

Record = dict[str, Any]           # one results.jsonl line, plus "run_dir"
PathLike = Union[str, "os.PathLike[str]"]

RESULTS_FILE = "results.jsonl"
DONE_FILE = "done"
PREDICTIONS_DIR = "predictions"
_STEP_FILE = re.compile(r"^step_(\d+)\.npz$")
MAX_NOTES_SHOWN = 20
# What the results tables, the leaderboard and the analyses read of a record (with every
# ``env*`` key): load_records(fields=TABLE_FIELDS) keeps only these
TABLE_FIELDS = ("args", "hparams", "step", "epoch")


class Records:
    """The records read from one or more input directories.

    Attributes:
        records: list of dicts, each a results.jsonl line plus ``"run_dir"``.
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
                 table: ColumnTable | None = None) -> None:
        self._records = list(records) if records is not None else None
        self._table = table
        self.notes = list(notes)
        self.skipped_lines = int(skipped_lines)
        self.skipped_runs = int(skipped_runs)
        self.run_dirs = list(run_dirs)
        self.input_dirs = list(input_dirs)

    @property
    def records(self) -> list[Record]:
        """The record dicts (built from the column table on first use)."""
        if self._records is None:
            self._records = self.table.records
        return self._records

    @records.setter
    def records(self, records: Iterable[Record]) -> None:
        self._records, self._table = list(records), None

    @property
    def table(self) -> ColumnTable:
        """The records column-wise (``domainbed.results.columns``)."""
        if self._table is None:
            self._table = ColumnTable.from_records(self._records or [])
        return self._table

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else len(self.table)

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


def _as_dir_list(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(input_dir, (str, bytes, os.PathLike)):
        return [os.fspath(input_dir)]
    dirs = [os.fspath(d) for d in input_dir]
    if not dirs:
        raise UserError("no input directory given")
    return dirs


def find_run_dirs(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    """Every directory holding a results.jsonl under `input_dir` (itself included),
    sorted by path. Raises UserError when `input_dir` is not a directory."""
    found = []
    for top in _as_dir_list(input_dir):
        if not os.path.isdir(top):
            what = "does not exist" if not os.path.exists(top) else "is not a directory"
            raise UserError(f"input directory {top!r} {what}")
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            dirnames[:] = [d for d in dirnames if d != PREDICTIONS_DIR]
            if RESULTS_FILE in filenames:
                found.append(dirpath)
    return found


WHOLE_FILE_BYTES = 16 << 20   # a results.jsonl up to this size is parsed at once


def read_run(run_dir: str, notes: list[str] | None = None,
             fields: Sequence[str] | None = None) -> tuple[list[Record], int]:
    """(records, skipped_lines) of one run directory; raises OSError when unreadable (not a
    regular file included). Each skipped line adds a note naming it to `notes`."""
    path = os.path.join(run_dir, RESULTS_FILE)
    with open_regular(path) as f:
        data = f.read(WHOLE_FILE_BYTES + 1)
    found = parse_whole_file(data, fields) if len(data) <= WHOLE_FILE_BYTES else None
    if found is not None:
        records, skipped = found, 0
    else:
        records, skipped = parse_run_lines(path, read_lines(path, MAX_LINE_BYTES), notes,
                                           fields)
    for record in records:
        record["run_dir"] = run_dir
    return records, skipped


def read_run_parts(run_dir: str, notes: list[str] | None = None,
                   fields: Sequence[str] | None = None) -> tuple[list[Part], int]:
    """(parts, skipped_lines) of one run directory, as `read_run` reads it, column-wise:
    a file of the usual shape straight into one Part (no record dicts)."""
    with open_regular(os.path.join(run_dir, RESULTS_FILE)) as f:
        data = f.read(WHOLE_FILE_BYTES + 1)
    part = whole_file_part(data, fields) if len(data) <= WHOLE_FILE_BYTES else None
    if part is not None:
        return [part], 0
    records, skipped = read_run(run_dir, notes, fields)
    for record in records:
        del record["run_dir"]    # a block's run_dir is the block's, not a key
    return file_parts(records), skipped


def load_records(input_dir: PathLike | Sequence[PathLike], require_done: bool = True,
                 quiet: bool = False, fields: Sequence[str] | None = None,
                 use_index: bool = True) -> Records:
    """Read every run under `input_dir` (a path, or a list of paths) into a Records.

    require_done: skip runs without a ``done`` marker (still running, or killed).
    quiet: do not log the skip warning (it stays available as ``Records.warning()``).
    fields: ``TABLE_FIELDS`` keeps only the keys the tables, the leaderboard and the
    analyses read; then an index of each input directory's records
    (``domainbed.results.record_index``, unless `use_index` is False) serves the files that
    have not changed since it was written. None keeps every key and reads every file.
    Lines that do not fit the records schema (``domainbed.results.schema``) and files that
    are not regular files are skipped, each with a note (``Records.notes``).
    Raises UserError when an input directory is missing.
    """
    dirs = _as_dir_list(input_dir)
    found = [(top, find_run_dirs(top)) for top in dirs]
    reader = _Reader(fields, use_index and fields is not None and
                     tuple(fields) == TABLE_FIELDS, require_done)
    for top, run_dirs in found:
        reader.read_tree(top, run_dirs)
    result = Records(None, reader.skipped_lines, reader.skipped_runs, reader.kept_dirs, dirs,
                     reader.notes, table=reader.builder.finish())
    logger.debug(f"read {len(result)} records from {len(reader.kept_dirs)} run(s) "
                 f"under {', '.join(map(str, dirs))}")
    message = result.warning()
    if message and not quiet:
        logger.warning(message)
    return result


class _Reader:
    """What load_records gathers, one input directory at a time."""

    def __init__(self, fields: Sequence[str] | None, indexed: bool, require_done: bool
                 ) -> None:
        self.fields, self.indexed, self.require_done = fields, indexed, require_done
        self.builder = TableBuilder()
        self.kept_dirs: list[str] = []
        self.notes: list[str] = []
        self.skipped_lines = self.skipped_runs = 0

    def read_tree(self, top: str, run_dirs: list[str]) -> None:
        """Read the runs `run_dirs` found under `top`, through its index when indexed."""
        runs: list[tuple[str, os.stat_result | None]] = []
        for run_dir in run_dirs:
            if self.require_done and not os.path.exists(os.path.join(run_dir, DONE_FILE)):
                self.skipped_runs += 1
                continue
            try:
                runs.append((run_dir, os.lstat(os.path.join(run_dir, RESULTS_FILE))))
            except OSError:
                runs.append((run_dir, None))
        index = None
        if self.indexed:
            sizes = [st.st_size for _, st in runs if st is not None]
            index = RecordIndex(top).load(index_cap(sizes))
            self.notes += index.notes
        keys = [stat_key(st) if st is not None and is_regular(st) else None
                for _, st in runs]
        inside = top + os.sep     # os.walk's paths start so: no relpath per run needed
        rels = [run_dir[len(inside):] if run_dir.startswith(inside) and
                os.sep + os.pardir not in run_dir else os.path.relpath(run_dir, top)
                for run_dir, _ in runs]
        hits = [index.lookup(rel, key) if index is not None and key is not None else None
                for rel, key in zip(rels, keys)]
        misses = [run_dir for (run_dir, _), hit in zip(runs, hits) if hit is None]
        read = parallel_read.read_all(read_run_parts, misses, self.fields)
        for (run_dir, _), rel, key, hit in zip(runs, rels, keys, hits):
            if hit is None:
                parts, notes, error = next(read)
                path = os.path.join(run_dir, RESULTS_FILE)
                if error is not None:
                    self.skipped_runs += 1
                    self.notes.append(f"{path}: unreadable ({error})")
                    continue
                hit = parts, [note[len(path) + 1:] for note in notes]
                if index is not None and key is not None:
                    index.store(rel, key, *hit)
            self._add_run(run_dir, *hit)
        if index is not None:
            index.save()

    def _add_run(self, run_dir: str, parts: list[Part], line_notes: list[str]) -> None:
        path = os.path.join(run_dir, RESULTS_FILE)
        self.notes += [f"{path} {note}" for note in line_notes]
        self.skipped_lines += len(line_notes)
        for part in parts:
            self.builder.add_part(run_dir, part)
        self.kept_dirs.append(run_dir)


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
