"""The report of a sweep as DomainBed's collect_results lays it out: one table per dataset
and selection method, the averages, the worst-group sections. collect_results and the
leaderboard both build their tables here, from records alone."""
from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from domainbed.registry import DATASETS, get_dataset_class
from domainbed.results import column_selection, model_selection
from domainbed.results import tables as reporting
from domainbed.results.columns import ColumnTable
from domainbed.results.run_keys import (
    ALGORITHM,
    DATASET,
    ENV_NAMES,
    TEST_ENVS,
    distinct_rows,
    first_seen,
)
from oodutils.errors import UserError
from oodutils.log import get_logger

if TYPE_CHECKING:
    import pandas as pd

    from domainbed.results.model_selection import SelectionMethod
    from domainbed.results.records import Records

logger = get_logger(__name__)
Record = dict[str, Any]
RecordsOrTable = Union[list[Record], ColumnTable]

# DomainBed's own orders for its datasets and algorithms; other names follow, sorted.
DOMAINBED_DATASETS = [
    "Debug28", "Debug224", "ColoredMNIST", "RotatedMNIST", "VLCS", "PACS", "OfficeHome",
    "TerraIncognita", "DomainNet", "SVIRO", "WILDSCamelyon", "WILDSFMoW", "CMNISTMod",
    "SpawriousO2O_easy", "SpawriousO2O_medium", "SpawriousO2O_hard",
    "SpawriousM2M_easy", "SpawriousM2M_medium", "SpawriousM2M_hard"]
DOMAINBED_ALGORITHMS = [
    "ERM", "ERMPlusPlus", "Fish", "IRM", "GroupDRO", "Mixup", "MLDG", "CORAL", "MMD", "DANN",
    "CDANN", "MTL", "SagNet", "ARM", "VREx", "RSC", "SD", "ANDMask", "SANDMask", "IGA",
    "SelfReg", "Fishr", "TRM", "IB_ERM", "IB_IRM", "CAD", "CondCAD", "Transfer",
    "CausIRL_CORAL", "CausIRL_MMD", "EQRM", "RDM", "ADRMX", "URM"]


def order_names(names: Iterable[str], canonical: Sequence[str]) -> list[str]:
    names = set(names)
    known = [n for n in canonical if n in names]
    return known + sorted((n for n in names if n not in canonical), key=str)


def registered_environments(dataset: str | None) -> list[str] | None:
    """ENVIRONMENTS of a registered dataset class, or None (unknown, not importable, or a
    ``folder:``/``csv:`` dataset whose files are no longer there). A built-in dataset's
    are read from its module's source (importing it costs seconds: torch)."""
    try:
        declared = DATASETS.declared(str(dataset), "ENVIRONMENTS")
        if isinstance(declared, list):
            return declared
    except LookupError:
        pass
    try:
        return list(get_dataset_class(dataset).ENVIRONMENTS or [])  # type: ignore[arg-type]
    except (UserError, ImportError):  # UnknownNameError is a UserError
        return None
    except Exception as e:  # a broken dataset module must not stop a results table
        logger.warning(f"warning: could not read the environments of dataset {dataset!r} "
                       f"from the registry ({type(e).__name__}: {e}); using env indices")
        return None


class DatasetInfo:
    """What the tables need to know about one dataset (label) from its records."""

    def __init__(self, label: str, records: list[Record]) -> None:
        self.label = label
        self.name = records[0]["args"].get("dataset")
        self.n_envs = max(model_selection.num_envs(r) for r in records)
        self.has_worst_group = model_selection.has_worst_group(records)
        self.env_names = self._env_names(r["args"].get("env_names") for r in records)
        self.official_splits = "val" in self.env_names and "test" in self.env_names

    @classmethod
    def of(cls, label: str, name: Any, n_envs: int, has_worst_group: bool,
           env_names: Iterable[Any]) -> DatasetInfo:
        """The info from what was worked out elsewhere (a table's distinct keys);
        env_names: the records' env_names values, in reading order."""
        info = cls.__new__(cls)
        info.label, info.name, info.n_envs = label, name, n_envs
        info.has_worst_group = has_worst_group
        info.env_names = info._env_names(env_names)
        info.official_splits = "val" in info.env_names and "test" in info.env_names
        return info

    def _env_names(self, found: Iterable[Any]) -> list[str]:
        for names in found:
            if isinstance(names, list) and len(names) == self.n_envs:
                return [str(n) for n in names]
        names = registered_environments(self.name)
        if names and len(names) == self.n_envs:
            return [str(n) for n in names]
        return [str(i) for i in range(self.n_envs)]


def dataset_infos(records: Iterable[Record], labels: dict) -> dict[str, DatasetInfo]:
    by_label = collections.defaultdict(list)
    label_of: dict[int, str] = {}     # id(args) -> label: a run's records share one args
    for r in records:
        if r["args"].get("dataset") is not None:
            label = label_of.get(id(r["args"]))
            if label is None:
                label = label_of[id(r["args"])] = model_selection.dataset_label(r, labels)
            by_label[label].append(r)
    return _ordered({label: DatasetInfo(label, rs) for label, rs in by_label.items()})


def _ordered(infos: dict[str, DatasetInfo]) -> dict[str, DatasetInfo]:
    base_order = order_names({i.name for i in infos.values()}, DOMAINBED_DATASETS)
    ordered = sorted(infos.values(), key=lambda i: (base_order.index(i.name), i.label))
    return {i.label: i for i in ordered}


def table_infos(table: ColumnTable, labels: dict) -> dict[str, DatasetInfo]:
    """dataset_infos of a table's records, from the blocks' key codes and layouts."""
    keys = table.keys
    label_codes, names = column_selection.block_labels(table, labels)
    n_envs = column_selection.block_env_counts(table)
    wga_layouts = np.array([model_selection.has_worst_group([dict.fromkeys(k)])
                            for k, _ in table.store.layouts], dtype=bool)
    infos = {}
    for code, label in enumerate(names):
        if label is None:
            continue
        blocks = np.flatnonzero(label_codes == code)
        env_codes = keys.column(ENV_NAMES)[blocks]
        _, first = first_seen(env_codes)
        env_values = [keys.values[ENV_NAMES][c] for c in env_codes[first]]
        infos[label] = DatasetInfo.of(label, keys.value(DATASET, int(blocks[0])),
                                      int(n_envs[blocks].max()),
                                      bool(wga_layouts[table.layout[blocks]].any()),
                                      env_values)
    return _ordered(infos)


def table_split_notes(table: ColumnTable, methods: Sequence[type[SelectionMethod]]
                      ) -> list[str]:
    """model_selection.missing_split_notes of a table's records, from one stand-in record
    per distinct (test envs, env_names, key layout), weighted by its records."""
    keys = table.keys
    shapes = np.stack([keys.column(TEST_ENVS), keys.column(ENV_NAMES), table.layout],
                      axis=1) if table.n_blocks else np.zeros((0, 3), dtype=np.int64)
    if not len(shapes):
        return []
    combos, inverse, _ = distinct_rows(shapes)
    weights = np.bincount(inverse, weights=table.rows, minlength=len(combos))
    stand_ins = []
    for test_envs, env_names, layout in combos.tolist():
        record = dict.fromkeys(table.store.layouts[layout][0])
        record["args"] = {"test_envs": keys.values[TEST_ENVS][test_envs],
                          "env_names": keys.values[ENV_NAMES][env_names]}
        stand_ins.append(record)
    return model_selection.missing_split_notes(stand_ins, methods,
                                               [int(w) for w in weights])


def build_section(records: list[Record] | ColumnTable, method: type[SelectionMethod],
                  infos: dict[str, DatasetInfo], algorithms: Sequence[str], labels: dict,
                  selected: pd.DataFrame | None = None,
                  metric: str | None = None) -> reporting.Section:
    """One Section: a table per dataset in `infos`, then the averages table.
    `selected`: model_selection.select's frame for these records, when already computed.
    `metric`: report that metric of the selected checkpoints instead of accuracy."""
    if selected is None and metric is None:
        rows, _ = model_selection.select_rows(records, method, labels)
        selected_rows: Iterable[Any] = [_Chosen(r) for r in rows]
    else:
        if selected is None:
            selected = model_selection.select(records, method, labels)
        if metric is not None:
            listed = records.records if isinstance(records, ColumnTable) else records
            selected = with_metric(selected, listed, metric)
        selected_rows = selected.itertuples(index=False)
    what = method.name if metric is None else f"{method.name}, metric: {metric} (x100)"
    accs = collections.defaultdict(list)       # (dataset, algorithm, test_env) -> accs
    for row in selected_rows:
        accs[(row.dataset, row.algorithm, row.test_env)].append((row.trial_seed,
                                                                  row.test_acc))
    tables = []
    for info in infos.values():
        envs = list(range(info.n_envs))
        cells = [[reporting.summarize(a for _, a in accs[(info.label, alg, e)])
                  for e in envs] for alg in algorithms]
        tables.append(reporting.Table(
            title=f"Dataset: {info.label}, model selection method: {what}",
            heading=info.label, columns=info.env_names, rows=list(algorithms),
            cells=cells, avg=[reporting.row_average(c) for c in cells],
            colwidth=20, env_indices=envs))

    avg_cells = []
    for alg in algorithms:
        row = []
        for info in infos.values():
            by_trial = collections.defaultdict(list)
            for e in range(info.n_envs):
                for trial_seed, acc in accs[(info.label, alg, e)]:
                    by_trial[trial_seed].append(acc)
            row.append(reporting.summarize(
                sum(v) / len(v) for v in by_trial.values()))
        avg_cells.append(row)
    tables.append(reporting.Table(
        title=f"Averages, model selection method: {what}", heading="Averages",
        columns=list(infos), rows=list(algorithms), cells=avg_cells,
        avg=[reporting.row_average(c) for c in avg_cells], colwidth=25))
    return reporting.Section(method.name, tables, method.key, metric=metric)


class _Chosen:
    """A selected row's values as attributes (as DataFrame.itertuples gives them)."""
    __slots__ = ("dataset", "algorithm", "test_env", "trial_seed", "test_acc")

    def __init__(self, row: dict[str, Any]) -> None:
        for name in self.__slots__:
            setattr(self, name, row[name])


def build_val_worst_group_section(records: RecordsOrTable, infos: dict[str, DatasetInfo],
                                  labels: dict, method: type[SelectionMethod] | None = None
                                  ) -> reporting.Section | None:
    """SubpopBench's selection (best val worst-group accuracy, or with `method` one of the
    attribute-unknown, label-only scores of the val environment) for datasets whose
    environments are official splits: a worst-group and an average test accuracy table
    (columns: datasets)."""
    method = method or model_selection.ValWorstGroupSelectionMethod
    infos = {k: i for k, i in infos.items() if i.official_splits and i.has_worst_group}
    if not infos:
        logger.warning("warning: no dataset with val/test environments and worst-group "
                       f"accuracies; no {method.key} tables")
        return None
    records = with_labels(records, labels, infos)
    algorithms = algorithms_of(records)
    selected = model_selection.select(records, method, labels)
    tables = []
    for column, what in (("test_acc", "worst-group"), ("test_avg_acc", "average")):
        accs = collections.defaultdict(list)
        for row in selected.itertuples(index=False):
            accs[(row.dataset, row.algorithm)].append(getattr(row, column))
        cells = [[reporting.summarize(a for a in accs[(label, alg)] if a == a)
                  for label in infos] for alg in algorithms]
        tables.append(reporting.Table(
            title=f"Test {what} accuracy, model selection method: {method.name}",
            heading=f"Test {what} accuracy", columns=list(infos), rows=algorithms,
            cells=cells, avg=[reporting.row_average(c) for c in cells], colwidth=20))
    return reporting.Section(method.name, tables, method.key)


def metric_value(record: Record, side: dict, test_env: int, metric: str) -> float | None:
    """The test environment's `in` split value of `metric` at this checkpoint: from the
    record (trained with --metrics) or the run's metrics.jsonl (domainbed-metrics)."""
    key = f"env{test_env}_in_{metric}"
    value = record.get(key, side.get(key))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _side_file(run_dir: str) -> dict[int, dict]:
    import json
    import os
    path = os.path.join(run_dir, "metrics.jsonl")
    lines: dict[int, dict] = {}
    if not os.path.isfile(path) or os.path.islink(path):
        return lines
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("step"), int):
                lines[entry["step"]] = entry
    return lines


LOWER_IS_BETTER = ("nll", "ece", "brier")   # losses and errors: the smallest is best


def metric_names(keys: Iterable[str]) -> set[str]:
    """The metrics beyond accuracy among record keys `env{i}_in_{metric}` (the names
    `--metrics` writes: oodutils.metrics.METRICS, per-class `acc_class<k>`)."""
    import re

    from oodutils.metrics import METRICS
    found = set()
    for key in keys:
        match = re.fullmatch(r"env\d+_in_(\w+)", key)
        if match and (match.group(1) in METRICS and match.group(1) != "class_acc" or
                      re.fullmatch(r"acc_class\d+", match.group(1))):
            found.add(match.group(1))
    return found


def metrics_in(records: list[Record], labels: dict) -> dict[str, set[str]]:
    """{metric: the dataset labels with it} for the metrics beyond accuracy that the
    records (trained with --metrics) or their runs' metrics.jsonl (domainbed-metrics)
    carry; in METRICS' order, then acc_class<k> by k."""
    from oodutils.metrics import METRICS
    found: dict[str, set[str]] = collections.defaultdict(set)
    sides: dict[str, set[str]] = {}
    for r in records:
        run_dir = str(r.get("run_dir") or "")
        if run_dir and run_dir not in sides:
            sides[run_dir] = metric_names(k for line in _side_file(run_dir).values()
                                          for k in line)
        label = model_selection.dataset_label(r, labels)
        for name in metric_names(r) | sides.get(run_dir, set()):
            found[name].add(label)
    order = [m for m in METRICS if m in found]
    order += sorted((m for m in found if m not in METRICS), key=lambda m: int(m[9:]))
    return {m: found[m] for m in order}


def with_metric(selected: pd.DataFrame, records: list[Record], metric: str) -> pd.DataFrame:
    """The selection frame with `test_acc` replaced by `metric` of the same checkpoints;
    cells without that metric are left out (their tables show X)."""
    by_checkpoint = {(r.get("run_dir"), r.get("step")): r for r in records}
    sides: dict[str, dict] = {}
    values = []
    for row in selected.itertuples(index=False):
        record = by_checkpoint.get((row.run_dir, row.step), {})
        if row.run_dir not in sides:
            sides[row.run_dir] = _side_file(row.run_dir) if row.run_dir else {}
        values.append(metric_value(record, sides[row.run_dir].get(row.step, {}),
                                   int(row.test_env), metric))
    out = selected.assign(test_acc=values)
    missing = out["test_acc"].isna().sum()
    if missing:
        logger.warning(f"warning: {missing} selected checkpoint(s) have no {metric!r} "
                       f"(train with --metrics {metric}, or run domainbed-metrics); "
                       f"their cells are X")
    return out[out["test_acc"].notna()]


def build_report(records: Records | list[Record],
                 methods: Sequence[type[SelectionMethod]] | None = None,
                 metric: str | None = None) -> reporting.Report:
    """Records -> reporting.Report. `methods`: selection method classes; default
    DomainBed's three, plus worst-group selection when any record has worst-group
    accuracies. Worst-group tables cover only the datasets that have them."""
    with model_selection.shared_keys():
        return _build_report(records, methods, metric)


def _build_report(records: Records | list[Record],
                  methods: Sequence[type[SelectionMethod]] | None,
                  metric: str | None) -> reporting.Report:
    table = model_selection.table_of(records)
    labels = column_selection.table_labels(table)
    infos = table_infos(table, labels)
    if methods is None:
        defaults: list[type[SelectionMethod]] = list(model_selection.DOMAINBED_METHODS)
        if any(i.has_worst_group for i in infos.values()):
            defaults.append(model_selection.WorstGroupSelectionMethod)
        if any(i.official_splits and i.has_worst_group for i in infos.values()):
            defaults.append(model_selection.ValWorstGroupSelectionMethod)
        methods = defaults
    for note in table_split_notes(table, methods):
        logger.warning(note)
    sections = []
    for method in methods:
        if issubclass(method, model_selection.ValWorstGroupSelectionMethod):
            section = build_val_worst_group_section(table, infos, labels, method)
            sections += [section] if section else []
            continue
        if metric is not None and method.metric != "accuracy":
            logger.warning(f"warning: --metric applies to accuracy-based selection; no "
                           f"{method.name} tables")
            continue
        inputs = section_inputs(table, method, infos, labels)
        if inputs is None:
            logger.warning("warning: no records carry worst-group accuracies (env*_wga); "
                           "no worst-group tables")
            continue
        sections.append(build_section(inputs[0], method, inputs[1], inputs[2], labels,
                                      metric=metric))
    return reporting.Report(len(table), sections)


def with_labels(records: RecordsOrTable, labels: dict, infos: Iterable[str]
                ) -> RecordsOrTable:
    """The records (or the blocks of a table) whose dataset label is one of `infos`."""
    keep = set(infos)
    if isinstance(records, ColumnTable):
        codes, names = column_selection.block_labels(records, labels)
        wanted = np.array([name in keep for name in names], dtype=bool)
        return records.subset(np.flatnonzero(wanted[codes]) if len(names) else codes)
    return [r for r in records if model_selection.dataset_label(r, labels) in keep]


def algorithms_of(records: RecordsOrTable) -> list[str]:
    """The algorithms of the records, DomainBed's first, in its order."""
    if isinstance(records, ColumnTable):
        keys = records.keys
        found = {keys.values[ALGORITHM][c] for c in np.unique(keys.column(ALGORITHM))}
    else:
        found = {r["args"].get("algorithm") for r in records}
    return order_names({a for a in found if a is not None}, DOMAINBED_ALGORITHMS)


def section_inputs(records: RecordsOrTable, method: type[SelectionMethod],
                   infos: dict[str, DatasetInfo], labels: dict
                   ) -> tuple[RecordsOrTable, dict[str, DatasetInfo], list[str]] | None:
    """(records, infos, algorithms) that `method`'s section covers, or None when it
    covers nothing (worst-group selection without worst-group accuracies). `records`: a
    list of record dicts or a ColumnTable (then the records are its blocks)."""
    section_infos, section_records = infos, records
    if method is model_selection.WorstGroupSelectionMethod:
        section_infos = {k: i for k, i in infos.items() if i.has_worst_group}
        if not section_infos:
            return None
        section_records = with_labels(records, labels, section_infos)
    return section_records, section_infos, algorithms_of(section_records)
