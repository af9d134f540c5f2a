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
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Union

from domainbed.results import discovery, reader
from domainbed.results.cache import Cache
from domainbed.results.reader import Assembler, Frame, frame_from_records, subset
from oodutils.errors import UserError
from oodutils.log import get_logger

if TYPE_CHECKING:
    import pandas as pd

logger = get_logger(__name__)

Record = dict[str, Any]           # one results.jsonl line, plus "run_dir"
PathLike = Union[str, "os.PathLike[str]"]

RESULTS_FILE, DONE_FILE = reader.RESULTS_FILE, reader.DONE_FILE
MAX_NOTES_SHOWN = 20
# What the results tables, the leaderboard and the analyses read of a record (with every
# ``env*`` key): load_records(fields=TABLE_FIELDS) keeps only these
TABLE_FIELDS = ("args", "hparams", "step", "epoch")


class Records:
    """The records read from one or more input directories: ``frame`` (polars tables,
    ``reader.Frame``), ``records`` (dicts, each a results.jsonl line plus ``"run_dir"``,
    built from the frame when first asked for), ``skipped_lines`` (corrupt or truncated
    lines), ``skipped_runs`` (no ``done`` marker, or an unreadable results.jsonl),
    ``run_dirs`` (kept, in reading order), ``input_dirs``, ``notes`` (one line per skipped
    line or file, naming it and why)."""

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


def _checked_dirs(input_dir: PathLike | Sequence[PathLike]) -> list[str]:
    many: Sequence[Any] = input_dir if not isinstance(input_dir, (str, bytes, os.PathLike)) \
        else [input_dir]
    dirs = [os.fspath(d) for d in many]
    if not dirs:
        raise UserError("no input directory given")
    for top in dirs:
        if not os.path.isdir(top):
            what = "does not exist" if not os.path.exists(top) else "is not a directory"
            raise UserError(f"input directory {top!r} {what}")
    return dirs


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
        with ThreadPoolExecutor(1) as pool:   # (the cache loads while the sweep is walked)
            loading = pool.submit(Cache(top).load) if use_cache and full is None else None
            walked = discovery.walk(top)   # a path that is not UTF-8 fits no table nor page
            cache = loading.result() if loading is not None else None
        unnamed = [w[0] for w in walked
                   if not w[0].isascii() and reader.LONE_SURROGATE.search(w[0])]
        walked = [w for w in walked if w[0] not in unnamed]
        notes += [f"{d.encode('utf-8', 'backslashreplace').decode()}: skipped, its folder "
                  f"name is not valid UTF-8 (rename the folder)" for d in unnamed]
        runs = [d for d, done, _ in walked if done or not require_done]
        skipped_runs += len(unnamed) + len(walked) - len(runs)
        positions = list(range(position, position + len(runs)))
        position += len(runs)
        if cache is not None and cache.warning:
            logger.warning(cache.warning)
            notes.append(cache.warning)
        base = top if top.endswith(os.sep) else top + os.sep
        rels = {d: d[len(base):] if d != top else "" for d in runs}
        keys = [k for _, done, k in walked if done or not require_done]
        taken = cache.take([rels[d] for d in runs], keys) if cache is not None else None
        hit = set(taken[1]) if taken is not None else set()
        if taken is not None:
            into.add(Frame(taken[0].rows, taken[0].blocks.drop("at")),
                     [positions[a] for a in taken[0].blocks["at"].to_list()])
        misses = [i for i in range(len(runs)) if i not in hit]
        reads = reader.read_runs([runs[i] for i in misses], [positions[i] for i in misses],
                                 into, fields, full)
        read_of = {r.run_dir: r for r in reads}
        for run_dir in runs:
            found = read_of.get(run_dir)
            if found is not None and found.error is not None:
                skipped_runs += 1
                notes.append(f"{os.path.join(run_dir, RESULTS_FILE)}: unreadable "
                             f"({found.error})")
                continue
            kept_dirs.append(run_dir)
            if found is not None:
                skipped_lines += len(found.notes)
                notes += found.notes
        if cache is not None and (misses or cache.warning):
            whole = into.frame()
            cache.save(subset(whole, whole.blocks["run_dir"].is_in(runs)), rels,
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


def only_arithmetic(loaded: Records, name: str) -> Records:
    """The records of the runs computed by arithmetic `name` (``args.arithmetic``; records
    without it count as ``single``); a UserError naming the ones there are if none is."""
    found = loaded.frame.blocks["arithmetic"]
    if not (found == name).any():
        raise UserError(f"--arithmetic {name!r}: no run was computed by it (found: "
                        f"{', '.join(sorted(set(found.to_list()))) or 'no run'})")
    return Records(None, loaded.skipped_lines, loaded.skipped_runs, loaded.run_dirs,
                   loaded.input_dirs, loaded.notes, frame=subset(loaded.frame, found == name))


def _drop_empty(frame: Frame) -> Frame:
    """The frame without env columns that hold no value (a key no record has)."""
    empty = [c for c in frame.rows.columns if c not in reader.ROW_SCHEMA and
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
