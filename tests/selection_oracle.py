"""The record-by-record model selection the package's polars selection
(domainbed.results.model_selection) is checked against: DomainBed's semantics, one record
at a time.

Records (dicts, as read by ``domainbed.results.records``) are grouped as DomainBed groups them:
by (trial_seed, dataset, algorithm, test_env), a run with two test envs belonging to
both groups (leave-one-domain-out needs those runs). Inside a group the runs of one
hyperparameter setting (same ``hparams_seed`` and hyperparameter values) form a candidate;
a method gives each candidate a validation and a test accuracy and the sweep keeps the
test accuracy of the candidate with the best validation accuracy.

Beyond DomainBed, runs on different data (data source, fingerprint, data seed,
precision in their args) are never pooled: such variants of one dataset get their own
label, e.g. ``ColoredMNIST[data_seed=1]``.

Methods: IIDAccuracySelectionMethod (training-domain validation set),
LeaveOneOutSelectionMethod (leave-one-domain-out cross-validation),
OracleSelectionMethod (test-domain validation set, last checkpoint) and
WorstGroupSelectionMethod (best mean worst-group accuracy on the training domains'
validation splits, reporting worst-group accuracy on the test domain) and
ValWorstGroupSelectionMethod (SubpopBench's: best worst-group accuracy on the `val`
environment of datasets whose environments are official splits; reports the `test`
environment's worst-group and average accuracy).
"""
from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from domainbed.results.grouping import (
    GroupKey,
    Labels,
    dataset_labels,
    group_keys,
    hparams_key,
    hparams_sort_key,
    num_envs,
    test_envs_of,
)

_WGA_KEY = re.compile(r"^env\d+_(in|out)_wga$")
Record = dict[str, Any]          # one results.jsonl line, with its run_dir
Choice = dict[str, Any]          # val_acc, test_acc, step, run_dir of a chosen checkpoint


def _value(record: Mapping[str, Any], key: str) -> float | None:
    """record[key] as a finite float, or None."""
    value = record.get(key)
    if type(value) is float:            # the common case, answered without float()
        return value if value - value == 0 else None   # inf - inf and nan - nan are nan
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _mean(values: list[float]) -> float:
    """np.mean of a list, to the bit: under 8 values numpy adds them in order, as sum()
    does, and divides by their count (no array built for the few envs of a record)."""
    return sum(values) / len(values) if len(values) < 8 else float(np.mean(values))


def single_test_env_records(records: Iterable[Record]) -> list[Record]:
    """The records with exactly one test env (DomainBed's get_test_records)."""
    return [r for r in records if len(r["args"].get("test_envs") or ()) == 1]


def has_worst_group(records: Iterable[Record]) -> bool:
    """Whether any record carries worst-group accuracies (env{i}_{in,out}_wga)."""
    keys: set[str] = set()
    for r in records:
        keys.update(r)
    return any(_WGA_KEY.match(k) for k in keys)


def group_records(records: Sequence[Record], labels: Labels | None = None
                  ) -> dict[GroupKey, list[Record]]:
    """{GroupKey: [records]}; a record with several test envs is in each of their groups.
    Records whose args lack dataset/algorithm/trial_seed/test_envs are left out."""
    labels = dataset_labels(records) if labels is None else labels
    groups: dict[GroupKey, list[Record]] = collections.defaultdict(list)
    keys_of: dict[int, list[GroupKey]] = {}   # id(args) -> its groups (args shared by a run)
    for r in records:
        args = r["args"]
        keys = keys_of.get(id(args))
        if keys is None:
            keys = keys_of[id(args)] = group_keys(r, labels)
        for key in keys:
            groups[key].append(r)
    return dict(groups)


class SelectionMethod:
    """Strategy for choosing hyperparameters and checkpoint. Class-level, as DomainBed."""
    # every method sets both; the base class has none
    name: str = None  # type: ignore[assignment]    # as printed in table headers
    key: str = None  # type: ignore[assignment]     # as spelled on the command line
    metric = "accuracy"

    def __init__(self) -> None:
        raise TypeError("selection methods are used through their class methods")

    @classmethod
    def run_acc(cls, run_records: Sequence[Record]) -> Choice | None:
        """Records of one hyperparameter setting (one group) -> {val_acc, test_acc,
        step, run_dir} of the chosen checkpoint, or None when none can be chosen."""
        raise NotImplementedError

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        """The keys `required_keys` names, given the test env and the training envs."""
        raise NotImplementedError


    @classmethod
    def hparams_accs(cls, records: Sequence[Record]) -> list[tuple[Choice, list[Record]]]:
        """Records of one group -> [(run_acc, run_records)], best val_acc first."""
        by_hparams: dict[tuple[str, str], list[Record]] = collections.defaultdict(list)
        for r in records:
            by_hparams[hparams_key(r)].append(r)
        accs = []
        for key in sorted(by_hparams, key=hparams_sort_key):
            acc = cls.run_acc(by_hparams[key])
            if acc is not None:
                accs.append((acc, by_hparams[key]))
        return sorted(accs, key=lambda a: a[0]["val_acc"], reverse=True)

    @classmethod
    def required_keys(cls, record: Record) -> list[str]:
        """Keys a single-test-env record needs for this method to use it."""
        test_env = test_envs_of(record)[0]
        train = [i for i in range(num_envs(record)) if i != test_env]
        return cls._required(test_env, train)

    @classmethod
    def sweep_acc(cls, records: Sequence[Record]) -> float | None:
        """Records of one group -> test accuracy of the selected model, or None."""
        accs = cls.hparams_accs(records)
        return accs[0][0]["test_acc"] if accs else None

    @classmethod
    def _choice(cls, val_acc: float | None, test_acc: float | None, record: Record
                ) -> Choice | None:
        if val_acc is None or test_acc is None:
            return None
        return {"val_acc": float(val_acc), "test_acc": float(test_acc),
                "step": record.get("step"), "run_dir": record.get("run_dir")}


class _TrainingDomainMethod(SelectionMethod):
    """Argmax over all checkpoints of a mean over the training envs' `out` splits."""
    val_suffix = "out_acc"
    test_suffix = "in_acc"

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        return [f"env{i}_{cls.val_suffix}" for i in train_envs] + \
            [f"env{test_env}_{cls.test_suffix}"]

    @classmethod
    def _step_acc(cls, record: Record) -> Choice | None:
        test_env = test_envs_of(record)[0]
        found = [_value(record, f"env{i}_{cls.val_suffix}")
                 for i in range(num_envs(record)) if i != test_env]
        vals = [v for v in found if v is not None]
        if not vals:
            return None
        return cls._choice(_mean(vals),
                           _value(record, f"env{test_env}_{cls.test_suffix}"), record)

    @classmethod
    def run_acc(cls, run_records: Sequence[Record]) -> Choice | None:
        best = None
        for record in single_test_env_records(run_records):
            acc = cls._step_acc(record)
            if acc is not None and (best is None or acc["val_acc"] > best["val_acc"]):
                best = acc
        return best




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
    def run_acc(cls, run_records: Sequence[Record]) -> Choice | None:
        singles = single_test_env_records(run_records)
        if not singles:
            return None
        test_env = test_envs_of(singles[0])[0]
        last = sorted(singles, key=lambda r: r.get("step", 0))[-1]
        return cls._choice(_value(last, f"env{test_env}_out_acc"),
                           _value(last, f"env{test_env}_in_acc"), last)


class LeaveOneOutSelectionMethod(SelectionMethod):
    """Picks (hparams, step) by leave-one-domain-out cross-validation: the validation
    accuracy of a step is the mean, over training envs v, of env{v}_in_acc in the run
    whose test envs are {test_env, v}. Needs those two-test-env runs."""
    name = "leave-one-domain-out cross-validation"
    key = "leave_one_out"

    @classmethod
    def _required(cls, test_env: int, train_envs: list[int]) -> list[str]:
        # of the two-test-env runs, and the test
        return [f"env{i}_in_acc" for i in train_envs] + [f"env{test_env}_in_acc"]

    @classmethod
    def _step_acc(cls, records: Sequence[Record]) -> Choice | None:
        tests = single_test_env_records(records)
        if len(tests) != 1:
            return None
        test = tests[0]
        test_env = test_envs_of(test)[0]
        n_envs = num_envs(records[0])
        if n_envs < 2:
            return None
        val_accs: list[float | None] = [None] * n_envs
        for r in records:
            envs = test_envs_of(r)
            if len(envs) != 2 or test_env not in envs:
                continue
            val_env = (set(envs) - {test_env}).pop()
            if 0 <= val_env < n_envs:
                val_accs[val_env] = _value(r, f"env{val_env}_in_acc")
        others = val_accs[:test_env] + val_accs[test_env + 1:]
        held_out = [v for v in others if v is not None]
        if len(held_out) != len(others):
            return None
        return cls._choice(sum(held_out) / (n_envs - 1),
                           _value(test, f"env{test_env}_in_acc"), test)


    @classmethod
    def run_acc(cls, run_records: Sequence[Record]) -> Choice | None:
        by_step: dict[Any, list[Record]] = collections.defaultdict(list)
        for r in run_records:
            by_step[r.get("step")].append(r)
        best = None
        for step in by_step:
            acc = cls._step_acc(by_step[step])
            if acc is not None and (best is None or acc["val_acc"] > best["val_acc"]):
                best = acc
        return best


def official_split_envs(record: Record) -> tuple[int, int] | None:
    """(val, test) environment indices of a dataset whose environments are official splits
    (SubpopBench framing: env_names holding "val" and "test"), else None."""
    names = record["args"].get("env_names") or []
    if "val" in names and "test" in names:
        return names.index("val"), names.index("test")
    return None


class ValWorstGroupSelectionMethod(SelectionMethod):
    """SubpopBench's default selection: the hyperparameters and checkpoint with the best
    worst-group accuracy on the `val` environment (env{val}_in_wga: val and test are both held
    out, and `in` is their larger part); reports the `test` environment's worst-group accuracy
    (test_acc) and average accuracy (test_avg_acc), both on its `in` split. Only for runs
    that hold out both val and test."""
    name = "validation worst-group accuracy (SubpopBench)"
    key = "val_worst_group"
    metric = "worst-group accuracy"
    val_suffix = "wga"   # the `val` environment's `in`-split key the method selects by

    @classmethod
    def _step_acc(cls, record: Record) -> Choice | None:
        envs = official_split_envs(record)
        if envs is None or not set(envs) <= set(test_envs_of(record)):
            return None
        val, test = envs
        choice = cls._choice(_value(record, f"env{val}_in_{cls.val_suffix}"),
                             _value(record, f"env{test}_in_wga"), record)
        if choice is not None:
            choice["test_avg_acc"] = _value(record, f"env{test}_in_acc")
        return choice

    @classmethod
    def required_keys(cls, record: Record) -> list[str]:
        envs = official_split_envs(record)
        if envs is None or not set(envs) <= set(test_envs_of(record)):
            return []
        val, test = envs
        return [f"env{val}_in_{cls.val_suffix}", f"env{test}_in_wga", f"env{test}_in_acc"]

    @classmethod
    def run_acc(cls, run_records: Sequence[Record]) -> Choice | None:
        best = None
        for record in run_records:
            acc = cls._step_acc(record)
            if acc is not None and (best is None or acc["val_acc"] > best["val_acc"]):
                best = acc
        return best


class _ValLabelOnlyMethod(ValWorstGroupSelectionMethod):
    """SubpopBench's attribute-unknown selections: pick by a label-only score of the `val`
    environment (no group labels needed to select); report, like val_worst_group, the
    `test` environment's worst-group and average accuracy. The per-class scores come from
    runs trained with `--metrics` (worst_class_acc, balanced_acc, macro_f1)."""


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


def _select_records(record_list: Sequence[Record], method: type[SelectionMethod],
                    labels: Labels) -> tuple[list[dict[str, Any]], list[str]]:
    """select()'s rows and extra columns, one record at a time."""
    rows: list[dict[str, Any]] = []
    extra: list[str] = []
    for key, group in group_records(record_list, labels).items():
        accs = method.hparams_accs(group)
        if not accs:
            continue
        best, run_records = accs[0]
        if issubclass(method, ValWorstGroupSelectionMethod) and \
                key.test_env != official_split_envs(run_records[0])[1]:  # type: ignore[index]
            continue  # one row per run: the test env's (its val env is not a test result)
        rows.append({**key._asdict(), "val_acc": best["val_acc"],
                     "test_acc": best["test_acc"], "step": best["step"],
                     "run_dir": best["run_dir"],
                     "hparams_seed": run_records[0]["args"].get("hparams_seed"),
                     "n_candidates": len(accs),
                     **{k: v for k, v in best.items() if k not in _CHOICE_KEYS}})
        extra += [k for k in best if k not in _CHOICE_KEYS and k not in extra]
    return rows, extra


_CHOICE_KEYS = ("val_acc", "test_acc", "step", "run_dir")


def select_rows(records: Sequence[Record], method: type[SelectionMethod],
                labels: Labels | None = None) -> list[dict[str, Any]]:
    """select()'s rows, one record at a time."""
    return _select_records(records, method, dataset_labels(records) if labels is None
                           else labels)[0]


ORACLES = {m.key: m for m in (IIDAccuracySelectionMethod, LeaveOneOutSelectionMethod,
                              OracleSelectionMethod, WorstGroupSelectionMethod,
                              ValWorstGroupSelectionMethod, ValAverageSelectionMethod,
                              ValWorstClassSelectionMethod, ValBalancedSelectionMethod,
                              ValMacroF1SelectionMethod)}
