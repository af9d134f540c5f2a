"""The report of a sweep as DomainBed's collect_results lays it out: one table per dataset
and selection method, the averages, the worst-group sections. collect_results and the
leaderboard both build their tables here, from records alone."""
from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Union

import polars as pl

from domainbed.predictions import metric_names, read_side_file
from domainbed.registry import DATASETS, get_dataset_class
from domainbed.results import grouping, model_selection
from domainbed.results import tables as reporting
from domainbed.results.reader import Frame, subset
from oodutils.errors import UserError
from oodutils.log import get_logger
from oodutils.metrics import METRICS

if TYPE_CHECKING:
    import pandas as pd

    from domainbed.results.model_selection import SelectionMethod
    from domainbed.results.records import Records

logger = get_logger(__name__)
Record = dict[str, Any]
RecordsOrTable = Union[list[Record], Frame]

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


@dataclasses.dataclass
class DatasetInfo:
    """What the tables need to know about one dataset (label) from its records."""
    label: str
    name: Any
    n_envs: int
    has_worst_group: bool
    env_names: list[str]

    @property
    def official_splits(self) -> bool:
        return "val" in self.env_names and "test" in self.env_names

    @classmethod
    def of(cls, label: str, name: Any, n_envs: int, has_worst_group: bool,
           env_names: Iterable[Any]) -> DatasetInfo:
        """The info of a label from its records' env_names values (in reading order):
        the first of the right length, else the registered ones, else indices."""
        names = next((n for n in env_names if isinstance(n, list) and len(n) == n_envs),
                     None) or registered_environments(name)
        shown = [str(n) for n in names] if names and len(names) == n_envs else \
            [str(i) for i in range(n_envs)]
        return cls(label, name, n_envs, has_worst_group, shown)


def dataset_infos(records: Iterable[Record] | Frame, labels: dict) -> dict[str, DatasetInfo]:
    """{label: DatasetInfo} of the records (dicts, or a Frame), in DomainBed's order."""
    frame = model_selection.frame_of(records if isinstance(records, Frame) else list(records))
    return table_infos(frame, labels)


def _ordered(infos: dict[str, DatasetInfo]) -> dict[str, DatasetInfo]:
    base_order = order_names({i.name for i in infos.values()}, DOMAINBED_DATASETS)
    ordered = sorted(infos.values(), key=lambda i: (base_order.index(i.name), i.label))
    return {i.label: i for i in ordered}


def _labelled(frame: Frame, labels: dict) -> pl.DataFrame:
    """The rows with their block's dataset, label and env_names."""
    blocks = frame.blocks.select(
        "dataset", "env_names", "algorithm",
        model_selection._label_of_blocks(frame, labels)).with_columns(
        block=pl.int_range(pl.len(), dtype=pl.Int64))
    return frame.rows.join(blocks, on="block", how="left", maintain_order="left")


def table_infos(frame: Frame, labels: dict) -> dict[str, DatasetInfo]:
    """dataset_infos of a frame's records."""
    rows = _labelled(frame, labels).filter(pl.col("dataset").is_not_null())
    wga = [c for c in rows.columns if model_selection._WGA_KEY.match(c)]
    per_label = rows.group_by("label", maintain_order=True).agg(
        name=pl.col("dataset").first(), n_envs=pl.col("n_envs").max(),
        wga=pl.any_horizontal([pl.col(c).is_not_null().any() for c in wga])
        if wga else pl.lit(False),
        env_names=pl.col("env_names").unique(maintain_order=True))
    infos = {}
    for label, name, n_envs, wga_found, env_names in per_label.iter_rows():
        infos[label] = DatasetInfo.of(label, name, int(n_envs), bool(wga_found), env_names)
    return _ordered(infos)


def table_split_notes(frame: Frame, methods: Sequence[type[SelectionMethod]]) -> list[str]:
    """model_selection.missing_split_notes of a frame's records, from one stand-in record
    per distinct (test envs, env_names, keys holding a value), weighted by its records."""
    envs = [c for c in frame.rows.columns if c.startswith("env")]
    if not frame.rows.height:
        return []
    blocks = frame.blocks.select("test_envs", "env_names").with_columns(
        block=pl.int_range(pl.len(), dtype=pl.Int64))
    shapes = frame.rows.select("block", *[pl.col(c).is_not_null() for c in envs]) \
        .join(blocks, on="block", how="left").drop("block") \
        .group_by(pl.all(), maintain_order=True).agg(weight=pl.len())
    stand_ins, weights = [], []
    for row in shapes.iter_rows(named=True):
        record: Record = {c: None for c in envs if row[c]}
        record["args"] = {"test_envs": row["test_envs"], "env_names": row["env_names"]}
        stand_ins.append(record)
        weights.append(int(row["weight"]))
    return model_selection.missing_split_notes(stand_ins, methods, weights)


def build_section(records: RecordsOrTable, method: type[SelectionMethod],
                  infos: dict[str, DatasetInfo], algorithms: Sequence[str], labels: dict,
                  selected: pd.DataFrame | None = None,
                  metric: str | None = None) -> reporting.Section:
    """One Section: a table per dataset in `infos`, then the averages table.
    `selected`: model_selection.select's frame for these records, when already computed.
    `metric`: report that metric of the selected checkpoints instead of accuracy."""
    if selected is None:
        chosen = model_selection.select_table(records, method, labels)
    else:
        chosen = pl.from_pandas(selected) if len(selected) else \
            model_selection.select_table(records, method, labels).clear()
    if metric is not None:
        chosen = with_metric(chosen, records, metric)
    what = method.name if metric is None else f"{method.name}, metric: {metric} (x100)"
    accs = collections.defaultdict(list)       # (dataset, algorithm, test_env) -> accs
    arithmetic = collections.defaultdict(set)  # dataset -> the arithmetics it reports
    for dataset, algorithm, test_env, trial, acc, computed in chosen.select(
            "dataset", "algorithm", "test_env", "trial_seed", "test_acc",
            "arithmetic").iter_rows():
        accs[(dataset, algorithm, test_env)].append((trial, acc))
        arithmetic[dataset].add(computed)
    tables = []
    for info in infos.values():
        envs = list(range(info.n_envs))
        cells = [[reporting.summarize(a for _, a in accs[(info.label, alg, e)])
                  for e in envs] for alg in algorithms]
        tables.append(reporting.Table(
            title=f"Dataset: {info.label}, model selection method: {what}",
            heading=info.label, columns=info.env_names, rows=list(algorithms),
            cells=cells, avg=[reporting.row_average(c) for c in cells],
            colwidth=20, env_indices=envs, notes=mixed_note(arithmetic[info.label])))

    avg_cells = []
    for alg in algorithms:
        row: list[reporting.Cell | None] = []
        for info in infos.values():
            by_trial = collections.defaultdict(list)
            for e in range(info.n_envs):
                for trial_seed, acc in accs[(info.label, alg, e)]:
                    by_trial[trial_seed].append(acc)
            row.append(reporting.summarize(
                sum(v) / len(v) for v in by_trial.values()))
        avg_cells.append(row)
    every = set().union(*arithmetic.values()) if arithmetic else set()
    tables.append(reporting.Table(
        title=f"Averages, model selection method: {what}", heading="Averages",
        columns=list(infos), rows=list(algorithms), cells=avg_cells,
        avg=[reporting.row_average(c) for c in avg_cells], colwidth=25,
        notes=mixed_note(every)))
    return reporting.Section(method.name, tables, method.key, metric=metric)


def mixed_note(arithmetics: Iterable[str]) -> list[str]:
    """The line under a table whose selected runs were computed by several arithmetics
    (``args.arithmetic``; records without it count as ``single``), or none."""
    found = sorted(set(arithmetics))
    if len(found) < 2:
        return []
    return [f"note: this table mixes runs computed by different arithmetics "
            f"({', '.join(found)}); --arithmetic NAME keeps one"]


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
    selected = model_selection.select_table(records, method, labels)
    tables = []
    for column, what in (("test_acc", "worst-group"), ("test_avg_acc", "average")):
        accs = collections.defaultdict(list)
        for dataset, algorithm, value in selected.select("dataset", "algorithm",
                                                         column).iter_rows():
            accs[(dataset, algorithm)].append(float("nan") if value is None else value)
        cells = [[reporting.summarize(a for a in accs[(label, alg)] if a == a)
                  for label in infos] for alg in algorithms]
        tables.append(reporting.Table(
            title=f"Test {what} accuracy, model selection method: {method.name}",
            heading=f"Test {what} accuracy", columns=list(infos), rows=algorithms,
            cells=cells, avg=[reporting.row_average(c) for c in cells], colwidth=20))
    return reporting.Section(method.name, tables, method.key)


LOWER_IS_BETTER = ("nll", "ece", "brier")   # losses and errors: the smallest is best


def metrics_in(records: RecordsOrTable, labels: dict) -> dict[str, set[str]]:
    """{metric: the dataset labels with it} for the metrics beyond accuracy that the
    records (trained with --metrics) or their runs' metrics.jsonl (domainbed-metrics)
    carry; in METRICS' order, then acc_class<k> by k."""
    frame = model_selection.frame_of(records)
    rows = _labelled(frame, labels).join(
        frame.blocks.select("run_dir").with_columns(block=pl.int_range(pl.len(),
                                                                        dtype=pl.Int64)),
        on="block", how="left")
    found: dict[str, set[str]] = collections.defaultdict(set)
    for column in rows.columns:
        for name in metric_names([column]):
            found[name].update(rows.filter(pl.col(column).is_not_null())["label"].unique()
                               .drop_nulls().to_list())
    for run_dir, label in rows.select("run_dir", "label").unique(maintain_order=True) \
            .iter_rows():
        if run_dir and label is not None:
            for name in metric_names(k for line in read_side_file(run_dir).values()
                                     for k in line):
                found[name].add(label)
    order = [m for m in METRICS if m in found]
    order += sorted((m for m in found if m not in METRICS), key=lambda m: int(m[9:]))
    return {m: found[m] for m in order}


def with_metric(selected: pl.DataFrame, records: RecordsOrTable, metric: str
                ) -> pl.DataFrame:
    """The selection table with `test_acc` replaced by `metric` of the same checkpoints
    (the record's value, else the run's metrics.jsonl's); cells without it are left out
    (their tables show X)."""
    frame = model_selection.frame_of(records)
    wanted = [c for c in frame.rows.columns if re.fullmatch(rf"env\d+_in_{metric}", c)]
    rows = frame.rows.join(frame.blocks.select("run_dir").with_columns(
        block=pl.int_range(pl.len(), dtype=pl.Int64)), on="block", how="left") \
        .select("run_dir", "step", *wanted).unique(["run_dir", "step"], keep="last",
                                                   maintain_order=True)
    joined = selected.drop([c for c in wanted if c in selected.columns]).join(
        rows, on=["run_dir", "step"], how="left", maintain_order="left")
    values = joined.with_columns(model_selection.env_value(
        joined, pl.col("test_env"), f"in_{metric}").alias("_value"))["_value"]
    sides: dict[str, dict] = {}
    filled = []
    for value, run_dir, step, env in zip(values.to_list(),
                                         joined["run_dir"].to_list(), joined["step"].to_list(),
                                         joined["test_env"].to_list()):
        if value is None and run_dir:
            if run_dir not in sides:
                sides[run_dir] = read_side_file(run_dir)
            side = sides[run_dir].get(step, {}).get(f"env{env}_in_{metric}")
            value = float(side) if isinstance(side, (int, float)) and \
                not isinstance(side, bool) else None
        filled.append(value)
    out = selected.with_columns(test_acc=pl.Series(filled, dtype=pl.Float64))
    missing = out["test_acc"].null_count()
    if missing:
        logger.warning(f"warning: {missing} selected checkpoint(s) have no {metric!r} "
                       f"(train with --metrics {metric}, or run domainbed-metrics); "
                       f"their cells are X")
    return out.filter(pl.col("test_acc").is_not_null())


def build_report(records: Records | list[Record] | Frame,
                 methods: Sequence[type[SelectionMethod]] | None = None,
                 metric: str | None = None) -> reporting.Report:
    """Records -> reporting.Report. `methods`: selection method classes; default
    DomainBed's three, plus worst-group selection when any record has worst-group
    accuracies. Worst-group tables cover only the datasets that have them."""
    frame = model_selection.frame_of(records)
    labels = model_selection.frame_labels(frame)
    infos = table_infos(frame, labels)
    if methods is None:
        defaults: list[type[SelectionMethod]] = list(model_selection.DOMAINBED_METHODS)
        if any(i.has_worst_group for i in infos.values()):
            defaults.append(model_selection.WorstGroupSelectionMethod)
        if any(i.official_splits and i.has_worst_group for i in infos.values()):
            defaults.append(model_selection.ValWorstGroupSelectionMethod)
        methods = defaults
    for note in table_split_notes(frame, methods):
        logger.warning(note)
    sections = []
    for method in methods:
        if issubclass(method, model_selection.ValWorstGroupSelectionMethod):
            section = build_val_worst_group_section(frame, infos, labels, method)
            sections += [section] if section else []
            continue
        if metric is not None and method.metric != "accuracy":
            logger.warning(f"warning: --metric applies to accuracy-based selection; no "
                           f"{method.name} tables")
            continue
        inputs = section_inputs(frame, method, infos, labels)
        if inputs is None:
            logger.warning("warning: no records carry worst-group accuracies (env*_wga); "
                           "no worst-group tables")
            continue
        sections.append(build_section(inputs[0], method, inputs[1], inputs[2], labels,
                                      metric=metric))
    return reporting.Report(frame.rows.height, sections)


def with_labels(records: RecordsOrTable, labels: dict, infos: Iterable[str]
                ) -> RecordsOrTable:
    """The records (or the blocks of a frame) whose dataset label is one of `infos`."""
    keep = set(infos)
    if isinstance(records, Frame):
        return subset(records, model_selection._label_of_blocks(records, labels)
                      .is_in(list(keep)).fill_null(False))
    return [r for r in records if grouping.dataset_label(r, labels) in keep]


def algorithms_of(records: RecordsOrTable) -> list[str]:
    """The algorithms of the records, DomainBed's first, in its order."""
    if isinstance(records, Frame):
        found = set(records.blocks["algorithm"].drop_nulls().to_list())
    else:
        found = {r["args"].get("algorithm") for r in records}
    return order_names({a for a in found if a is not None}, DOMAINBED_ALGORITHMS)


def section_inputs(records: RecordsOrTable, method: type[SelectionMethod],
                   infos: dict[str, DatasetInfo], labels: dict
                   ) -> tuple[RecordsOrTable, dict[str, DatasetInfo], list[str]] | None:
    """(records, infos, algorithms) that `method`'s section covers, or None when it
    covers nothing (worst-group selection without worst-group accuracies)."""
    section_infos, section_records = infos, records
    if method is model_selection.WorstGroupSelectionMethod:
        section_infos = {k: i for k, i in infos.items() if i.has_worst_group}
        if not section_infos:
            return None
        section_records = with_labels(records, labels, section_infos)
    return section_records, section_infos, algorithms_of(section_records)
