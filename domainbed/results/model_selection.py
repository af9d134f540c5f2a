"""Model selection over hyperparameters and checkpoints, with DomainBed's semantics, as
polars table operations.

Records are grouped as DomainBed groups them: by (trial_seed, dataset, algorithm,
test_env), a run with two test envs belonging to both groups (leave-one-domain-out needs
those runs). Inside a group the runs of one hyperparameter setting (same ``hparams_seed``
and hyperparameter values) form a candidate; a method gives each candidate a validation
and a test accuracy (at the candidate's best checkpoint, the first among equals in reading
order) and the sweep keeps the candidate with the best validation accuracy (the first
among equals in hyperparameter order).

Beyond DomainBed, runs on different data (data source, fingerprint, data seed, precision
in their args) are never pooled: such variants of one dataset get their own label, e.g.
``ColoredMNIST[data_seed=1]``.

Methods: DomainBed's three (training-domain validation, leave-one-domain-out,
test-domain oracle), worst-group selection, and SubpopBench's (val worst-group accuracy
and its attribute-unknown variants), each a class below.
"""
from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import polars as pl

from domainbed.results.grouping import (
    DATA_KEYS,
    GroupKey,
    Labels,
    dataset_labels,
    hparams_sort_key,
    num_envs,
    test_envs_of,
)
from domainbed.results.reader import Frame, frame_from_records
from oodutils.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from domainbed.results.records import Records

_WGA_KEY = re.compile(r"^env\d+_(in|out)_wga$")
Record = dict[str, Any]
RecordsLike = Union[Sequence[Record], "Records", Frame]
GROUP = list(GroupKey._fields)
KEYS = ["trial_seed", "dataset", "algorithm"]    # a group: these (as `gkey`) and test_env
CANDIDATE = ["gkey", "test_env", "hparams_rank"]


def has_worst_group(records: Iterable[Record]) -> bool:
    """Whether any record carries worst-group accuracies (env{i}_{in,out}_wga)."""
    return any(_WGA_KEY.match(k) for r in records for k in r)


def official_split_envs(record: Record) -> tuple[int, int] | None:
    """(val, test) env indices where env_names hold "val" and "test" (SubpopBench's)."""
    names = record["args"].get("env_names") or []
    if "val" in names and "test" in names:
        return names.index("val"), names.index("test")
    return None


def frame_of(records: RecordsLike) -> Frame:
    """The polars frame of a Records, a Frame or a list of record dicts."""
    if isinstance(records, Frame):
        return records
    frame = getattr(records, "frame", None)
    return frame if isinstance(frame, Frame) else frame_from_records(records)


def frame_labels(frame: Frame) -> Labels:
    """dataset_labels of a frame's blocks."""
    pairs = frame.blocks.select("dataset", "data_key").unique(maintain_order=True)
    stand_ins = [{"args": {"dataset": dataset, **dict(zip(DATA_KEYS, json.loads(key)))}}
                 for dataset, key in pairs.iter_rows()]   # (a list: dataset_labels keys by id)
    return dataset_labels(stand_ins)


def _label_of_blocks(frame: Frame, labels: Labels) -> pl.Series:
    pairs = frame.blocks.select("dataset", "data_key")
    known = pairs.unique(maintain_order=True)
    known = known.with_columns(label=pl.Series([labels.get((d, tuple(json.loads(k)))) for d, k
                                                in known.iter_rows()], dtype=pl.String))
    return pairs.join(known, on=["dataset", "data_key"], how="left", nulls_equal=True,
                      maintain_order="left")["label"]


def _hparams_ranks(blocks: pl.DataFrame) -> pl.Series:
    """Each block's place in the hyperparameter order (hparams_sort_key)."""
    keys = blocks.select("hparams_seed_text", "hparams_key")
    order = sorted(keys.unique().iter_rows(), key=hparams_sort_key)
    ranks = pl.DataFrame(order, schema=keys.schema, orient="row").with_columns(
        hparams_rank=pl.int_range(pl.len(), dtype=pl.Int64))
    return keys.join(ranks, on=keys.columns, how="left", nulls_equal=True,
                     maintain_order="left")["hparams_rank"]


def long_rows(records: RecordsLike, labels: Labels | None = None,
              block_columns: Sequence[str] = (), values: str = r"env.*"
              ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(one row per (record, test env) of the records that have a dataset, an algorithm
    and a trial seed: ``gkey`` (its trial_seed, dataset label and algorithm, numbered),
    ``test_env``, ``hparams_rank``, ``row`` (reading order), ``block``, ``n_test`` (how
    many test envs the record has), the record's values and these columns of its block;
    the table of KEYS by ``gkey``); `values`: the record keys kept (a regex). Built once
    a frame and labels (every env value, every block column asked), then selected."""
    frame = frame_of(records)
    if labels is None:
        labels = frame_labels(frame)
    key = ("long_rows", tuple(block_columns), tuple(sorted(labels.items(), key=repr)))
    if key not in frame.memo:
        frame.memo[key] = _long_rows(frame, labels, block_columns)
    wide, keys = frame.memo[key]
    return wide.drop(c for c in frame.rows.columns if c.startswith("env") and
                     c in wide.columns and not re.fullmatch(values, c)), keys


def _long_rows(frame: Frame, labels: Labels, block_columns: Sequence[str]
               ) -> tuple[pl.DataFrame, pl.DataFrame]:
    blocks = frame.blocks.select(
        "algorithm", "trial_seed", "test_envs", *block_columns,
        _label_of_blocks(frame, labels).alias("dataset"),
        _hparams_ranks(frame.blocks)).with_columns(
        block=pl.int_range(pl.len(), dtype=pl.Int64)).drop_nulls(KEYS)
    keys = blocks.select(KEYS).unique(maintain_order=True).with_columns(
        gkey=pl.int_range(pl.len(), dtype=pl.Int64))
    blocks = blocks.join(keys, on=KEYS, how="left", maintain_order="left").drop(KEYS)
    kept = [c for c in frame.rows.columns if c.startswith("env")]
    rows = frame.rows.select("block", "step", "n_envs", *kept) \
        .with_columns(row=pl.int_range(pl.len(), dtype=pl.Int64)) \
        .join(blocks, on="block", how="inner", maintain_order="left")
    return rows.with_columns(n_test=pl.col("test_envs").list.len(),
                             test_env=pl.col("test_envs")).explode("test_env") \
        .filter(pl.col("test_env").is_not_null()) \
        .with_columns(long=pl.int_range(pl.len(), dtype=pl.Int64)), keys


def _finite(expr: pl.Expr) -> pl.Expr:
    return pl.when(expr.is_finite()).then(expr).otherwise(None)


def env_value(rows: pl.DataFrame, index: pl.Expr, suffix: str) -> pl.Expr:
    """The finite value of ``env{index}_{suffix}`` of each row (null where absent)."""
    out: pl.Expr = pl.lit(None, pl.Float64)
    for column in rows.columns:
        match = re.fullmatch(rf"env(\d+)_{re.escape(suffix)}", column)
        if match:
            out = pl.when(index == int(match.group(1))).then(pl.col(column)).otherwise(out)
    return _finite(out)


def _first_best(table: pl.DataFrame, keys: list[str], order: str) -> pl.DataFrame:
    """Per `keys`, the row with the largest val_acc, the first by `order` among equals."""
    return table.sort(order).filter(pl.col("val_acc") == pl.col("val_acc").max().over(keys)) \
        .unique(keys, keep="first", maintain_order=True)


class SelectionMethod:
    """Strategy for choosing hyperparameters and checkpoint. Class-level, as DomainBed."""
    name: str = None  # type: ignore[assignment]    # as printed in table headers
    key: str = None  # type: ignore[assignment]     # as spelled on the command line
    metric = "accuracy"
    extra: tuple[str, ...] = ()                     # columns beyond select()'s own
    block_columns: tuple[str, ...] = ()             # what it reads of a block but keys
    values = r"env\d+_(in|out)_acc"                 # the record keys it reads

    def __init__(self) -> None:
        raise TypeError("selection methods are used through their class methods")

    @classmethod
    def candidate_choices(cls, rows: pl.DataFrame) -> pl.DataFrame:
        """From `long_rows`: per candidate its choice (CANDIDATE, val/test_acc, step, block)."""
        raise NotImplementedError

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        raise NotImplementedError

    @classmethod
    def required_keys(cls, record: Record) -> list[str]:
        """Keys a single-test-env record needs for this method to use it."""
        test_env = test_envs_of(record)[0]
        train = [i for i in range(num_envs(record)) if i != test_env]
        return cls._required(test_env, train)


class _TrainingDomainMethod(SelectionMethod):
    """Argmax over all checkpoints of a mean over the training envs' `out` splits."""
    val_suffix = "out_acc"
    test_suffix = "in_acc"
    values = r"env\d+_(in|out)_(acc|wga)"

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        return [f"env{i}_{cls.val_suffix}" for i in train_envs] + \
            [f"env{test_env}_{cls.test_suffix}"]

    @classmethod
    def candidate_choices(cls, rows: pl.DataFrame) -> pl.DataFrame:
        rows = rows.filter(pl.col("n_test") == 1)
        values = []
        for column in rows.columns:
            match = re.fullmatch(rf"env(\d+)_{cls.val_suffix}", column)
            if match:
                i = int(match.group(1))
                values.append(pl.when((pl.col("test_env") != i) & (pl.col("n_envs") > i))
                              .then(_finite(pl.col(column))).otherwise(None))
        if not values:
            return rows.clear().with_columns(val_acc=pl.lit(None, pl.Float64),
                                             test_acc=pl.lit(None, pl.Float64))
        count = pl.sum_horizontal([v.is_not_null().cast(pl.Int64) for v in values])
        table = rows.with_columns(
            val_acc=pl.when(count > 0).then(pl.sum_horizontal(values) / count),
            test_acc=env_value(rows, pl.col("test_env"), cls.test_suffix)) \
            .filter(pl.col("val_acc").is_not_null() & pl.col("test_acc").is_not_null())
        return _first_best(table, CANDIDATE, "row")


class IIDAccuracySelectionMethod(_TrainingDomainMethod):
    """Picks argmax(mean(env_out_acc for env in train_envs))."""
    name = "training-domain validation set"
    key = "training_domain"


class WorstGroupSelectionMethod(_TrainingDomainMethod):
    """Picks argmax(mean(env_out_wga for env in train_envs)); reports the test env's
    worst-group accuracy (env{test}_in_wga)."""
    name = "training-domain worst-group validation (worst-group test accuracy)"
    key = "worst_group"
    metric = "worst-group accuracy"
    val_suffix = "out_wga"
    test_suffix = "in_wga"


class OracleSelectionMethod(SelectionMethod):
    """Best test-env `out` accuracy over hyperparameters, at the last checkpoint only
    (no early stopping)."""
    name = "test-domain validation set (oracle)"
    key = "oracle"

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        return [f"env{test_env}_out_acc", f"env{test_env}_in_acc"]

    @classmethod
    def candidate_choices(cls, rows: pl.DataFrame) -> pl.DataFrame:
        singles = rows.filter(pl.col("n_test") == 1)     # (in reading order)
        last = singles.filter(pl.col("step") == pl.col("step").max().over(CANDIDATE)) \
            .unique(CANDIDATE, keep="last", maintain_order=True)
        return last.with_columns(
            val_acc=env_value(last, pl.col("test_env"), "out_acc"),
            test_acc=env_value(last, pl.col("test_env"), "in_acc")) \
            .filter(pl.col("val_acc").is_not_null() & pl.col("test_acc").is_not_null())


class LeaveOneOutSelectionMethod(SelectionMethod):
    """Picks (hparams, step) by leave-one-domain-out cross-validation: the validation
    accuracy of a step is the mean, over training envs v, of env{v}_in_acc in the run
    whose test envs are {test_env, v}. Needs those two-test-env runs."""
    name = "leave-one-domain-out cross-validation"
    key = "leave_one_out"
    values = r"env\d+_in_acc"

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        return [f"env{i}_in_acc" for i in train_envs] + [f"env{test_env}_in_acc"]

    @classmethod
    def candidate_choices(cls, rows: pl.DataFrame) -> pl.DataFrame:
        step_keys = [*CANDIDATE, "step"]
        single = pl.col("n_test") == 1
        rows = rows.with_columns(in_acc=env_value(rows, pl.col("test_env"), "in_acc"))
        steps = rows.group_by(step_keys).agg(
            first=pl.col("row").min(), n_envs=pl.col("n_envs").first(), singles=single.sum(),
            test_acc=pl.col("in_acc").filter(single).first(),
            single_row=pl.col("row").filter(single).first(),
            block=pl.col("block").filter(single).first()) \
            .filter((pl.col("singles") == 1) & (pl.col("n_envs") >= 2) &
                    pl.col("test_acc").is_not_null())
        envs = pl.col("test_envs")
        pairs = rows.filter(pl.col("n_test") == 2).with_columns(
            val_env=pl.when(envs.list.get(0) == pl.col("test_env")).then(envs.list.get(1))
            .otherwise(envs.list.get(0)))
        pairs = pairs.filter(pl.col("val_env") != pl.col("test_env")).select(
            *step_keys, "val_env", value=env_value(pairs, pl.col("val_env"), "in_acc"))
        # the last value of each validation env (in reading order), an env a column
        wide = pairs.pivot(on="val_env", index=step_keys, values="value",
                           aggregate_function="last") if pairs.height else \
            pairs.select(step_keys)
        held = sorted(int(c) for c in wide.columns if c not in step_keys)
        table = steps.join(wide, on=step_keys, how="left")
        n_envs = pl.col("n_envs")
        found = [(n_envs > v) & pl.col(str(v)).is_not_null() for v in held]
        total: pl.Expr = pl.lit(0.0)
        for v, present in zip(held, found):    # in env order, one after another
            total = total + pl.when(present).then(pl.col(str(v))).otherwise(0.0)
        count = pl.sum_horizontal([f.cast(pl.Int64) for f in found]) if found else pl.lit(0)
        needed = n_envs - (pl.col("test_env") < n_envs).cast(pl.Int64)
        table = table.filter(count == needed).with_columns(val_acc=total / (n_envs - 1))
        return _first_best(table.select(*steps.columns, "val_acc"), CANDIDATE, "first") \
            .with_columns(row=pl.col("single_row"))


class ValWorstGroupSelectionMethod(SelectionMethod):
    """SubpopBench's default selection: the hyperparameters and checkpoint with the best
    worst-group accuracy on the `val` environment (env{val}_in_wga); reports the `test`
    environment's worst-group accuracy (test_acc) and average accuracy (test_avg_acc),
    both on its `in` split. Only for runs that hold out both val and test."""
    name = "validation worst-group accuracy (SubpopBench)"
    key = "val_worst_group"
    metric = "worst-group accuracy"
    val_suffix = "wga"   # the `val` environment's `in`-split key the method selects by
    extra = ("test_avg_acc",)
    block_columns = ("env_names",)
    values = r"env\d+_in_.*"

    @classmethod
    def required_keys(cls, record: Record) -> list[str]:
        envs = official_split_envs(record)
        if envs is None or not set(envs) <= set(test_envs_of(record)):
            return []
        val, test = envs
        return [f"env{val}_in_{cls.val_suffix}", f"env{test}_in_wga", f"env{test}_in_acc"]

    @classmethod
    def candidate_choices(cls, rows: pl.DataFrame) -> pl.DataFrame:
        names = pl.col("env_names").fill_null([])
        val = names.list.eval(pl.element() == "val").list.arg_max()
        test = names.list.eval(pl.element() == "test").list.arg_max()
        rows = rows.with_columns(val_index=val.cast(pl.Int64), test_index=test.cast(pl.Int64)) \
            .filter(names.list.contains("val") & names.list.contains("test") &
                    pl.col("test_envs").list.contains(pl.col("val_index")) &
                    pl.col("test_envs").list.contains(pl.col("test_index")))
        table = rows.with_columns(
            val_acc=env_value(rows, pl.col("val_index"), f"in_{cls.val_suffix}"),
            test_acc=env_value(rows, pl.col("test_index"), "in_wga"),
            test_avg_acc=env_value(rows, pl.col("test_index"), "in_acc")) \
            .filter(pl.col("val_acc").is_not_null() & pl.col("test_acc").is_not_null())
        best = _first_best(table, CANDIDATE, "row")
        return best.filter(pl.col("test_env") == pl.col("test_index"))


class _ValLabelOnlyMethod(ValWorstGroupSelectionMethod):
    """SubpopBench's attribute-unknown selections: by a label-only score of `val` (from
    runs trained with `--metrics`), reported as val_worst_group reports."""


class ValAverageSelectionMethod(_ValLabelOnlyMethod):
    name = "validation average accuracy (SubpopBench, attributes unknown)"
    key = "val_avg"
    val_suffix = "acc"


class ValWorstClassSelectionMethod(_ValLabelOnlyMethod):
    name = "validation worst-class accuracy (SubpopBench, attributes unknown)"
    key = "val_worst_class"
    val_suffix = "worst_class_acc"


class ValBalancedSelectionMethod(_ValLabelOnlyMethod):
    name = "validation class-balanced accuracy (SubpopBench, attributes unknown)"
    key = "val_balanced"
    val_suffix = "balanced_acc"


class ValMacroF1SelectionMethod(_ValLabelOnlyMethod):
    name = "validation macro F1 (SubpopBench, attributes unknown)"
    key = "val_macro_f1"
    val_suffix = "macro_f1"


LABEL_ONLY_METHODS = (ValAverageSelectionMethod, ValWorstClassSelectionMethod,
                      ValBalancedSelectionMethod, ValMacroF1SelectionMethod)
SELECTION_METHODS: dict[str, type[SelectionMethod]] = {
    m.key: m for m in (IIDAccuracySelectionMethod, LeaveOneOutSelectionMethod,
                       OracleSelectionMethod, WorstGroupSelectionMethod,
                       ValWorstGroupSelectionMethod, *LABEL_ONLY_METHODS)
}
ALIASES = {"iid": "training_domain", "training_domain_validation": "training_domain",
           "loo": "leave_one_out", "test_domain": "oracle", "wga": "worst_group",
           "worst_group_accuracy": "worst_group",
           "subpopbench": "val_worst_group", "val_wga": "val_worst_group"}
DOMAINBED_METHODS = (IIDAccuracySelectionMethod, LeaveOneOutSelectionMethod,
                     OracleSelectionMethod)


def get_selection_method(name: str) -> type[SelectionMethod]:
    """A selection method class by its command-line name (or class name)."""
    key = ALIASES.get(name.lower().replace("-", "_"), name.lower().replace("-", "_"))
    if key in SELECTION_METHODS:
        return SELECTION_METHODS[key]
    for method in SELECTION_METHODS.values():
        if name == method.__name__:
            return method
    raise UserError(f"unknown selection method {name!r}; valid selection methods: "
                    f"{', '.join(SELECTION_METHODS)}")


def candidates(records: RecordsLike, method: type[SelectionMethod],
               labels: Labels | None = None) -> pl.DataFrame:
    """Every candidate `method` can choose, per group: GROUP columns, ``hparams_rank``,
    val_acc, test_acc, step, run_dir, hparams_seed, arithmetic, the setting's
    `hparams_key` (as its two columns) and the method's extra columns;
    groups in the order of their first record, candidates best first (the first in
    hyperparameter order among equals)."""
    rows, keys = long_rows(records, labels, method.block_columns, method.values)
    chosen = method.candidate_choices(rows).join(keys, on="gkey", how="left",
                                                 maintain_order="left")
    order = rows.group_by("gkey", "test_env").agg(group_first=pl.col("long").min()) \
        .join(keys, on="gkey", how="left").drop("gkey")
    about = frame_of(records).blocks.select(
        "run_dir", "hparams_seed", "arithmetic", "hparams_seed_text", "hparams_key"
    ).with_columns(block=pl.int_range(pl.len(), dtype=pl.Int64))
    columns = [*GROUP, "hparams_rank", "val_acc", "test_acc", "step", "run_dir",
               "hparams_seed", "arithmetic", "hparams_seed_text", "hparams_key", *method.extra]
    chosen = chosen.join(about, on="block", how="left", maintain_order="left")
    return chosen.select(columns).join(order, on=GROUP, how="left") \
        .sort("group_first", "val_acc", "hparams_rank", descending=[False, True, False],
              maintain_order=True).drop("group_first")


def select_table(records: RecordsLike, method: type[SelectionMethod],
                 labels: Labels | None = None) -> pl.DataFrame:
    """`select` as a polars table."""
    table = candidates(records, method, labels)
    counts = table.group_by(GROUP, maintain_order=True).agg(n_candidates=pl.len())
    best = table.group_by(GROUP, maintain_order=True).first().join(
        counts, on=GROUP, how="left", maintain_order="left")
    return best.select(*GROUP, "val_acc", "test_acc", "step", "run_dir", "hparams_seed",
                       "n_candidates", "arithmetic", *method.extra)


def select(records: RecordsLike, method: type[SelectionMethod], labels: Labels | None = None
           ) -> pd.DataFrame:
    """Run `method` on every group: a pandas DataFrame with one row per
    (trial_seed, dataset, algorithm, test_env) where a model could be selected, columns
    trial_seed, dataset, algorithm, test_env, val_acc, test_acc (= DomainBed's sweep
    accuracy), step, run_dir, hparams_seed, n_candidates, arithmetic."""
    import pandas as pd

    table = select_table(records, method, labels)
    return pd.DataFrame(table.to_dict(as_series=False), columns=table.columns)


def missing_split_notes(records: Sequence[Record], methods: Iterable[type[SelectionMethod]],
                        counts: Sequence[int] | None = None) -> list[str]:
    """One line per selection method that some records cannot serve because a split was
    not evaluated (--eval_splits): which keys are absent, in how many records.
    counts: how many records each of `records` stands for."""
    notes = []
    weights = counts if counts is not None else [1] * len(records)
    for method in methods:
        absent: collections.Counter[str] = collections.Counter()
        two_envs = issubclass(method, ValWorstGroupSelectionMethod)
        for record, weight in zip(records, weights):
            if not two_envs and len(record["args"].get("test_envs") or ()) != 1:
                continue
            keys = method.required_keys(record)
            if method is LeaveOneOutSelectionMethod:
                keys = keys[-1:]   # val keys live in the two-test-env runs
            absent.update({key: weight for key in keys if key not in record})
        if absent:
            names = ", ".join(sorted(absent))
            notes.append(f"note: {method.name}: {sum(absent.values())} missing values "
                         f"({names}): those splits were not evaluated (--eval_splits), so "
                         f"this method leaves the affected runs out")
    return notes
