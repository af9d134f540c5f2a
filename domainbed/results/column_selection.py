"""Model selection over a ColumnTable with numpy: the same choices as the per-record
methods of ``model_selection`` (training-domain validation and its worst-group variant,
leave-one-domain-out, oracle), to the bit, without a Python step per checkpoint.

The per-record semantics kept here, one by one:
* a value is a finite number, else none (missing, null, NaN, infinite, not a number);
* training-domain validation: the mean of the training envs' validation values that
  exist (added in env order, divided by their count; np.mean from 8 values on), a
  checkpoint without a test value is no candidate; the first best checkpoint wins;
* oracle: the last checkpoint by step (the last read among equal steps);
* leave-one-domain-out: per step (in order of first appearance), exactly one single-test-env
  record, every other env's value from the last two-test-env record holding it out;
* across hyperparameter settings: the best validation value, ties to the first setting in
  hparams_sort_key order; groups in order of first appearance.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from domainbed.results.columns import ColumnTable
from domainbed.results.grouping import (
    GroupKey,
    Labels,
    cached_hparams_key,
    group_keys,
    hparams_sort_key,
)

Row = dict[str, Any]
_NO = -1


class Candidates:
    """Who competes with whom: the groups, the hyperparameter settings and the candidates
    (group, setting) of a table's blocks, numbered in order of first appearance."""

    def __init__(self, table: ColumnTable, labels: Labels) -> None:
        self.groups: list[GroupKey] = []
        group_ids: dict[GroupKey, int] = {}
        setting_ids: dict[tuple[str, str], int] = {}
        candidate_ids: dict[tuple[int, int], int] = {}
        self.candidate_group: list[int] = []
        self.candidate_setting: list[int] = []
        self.candidate_first_block: list[int] = []
        self.block_candidates: list[list[tuple[int, int]]] = []   # [(test_env, candidate)]
        n_blocks = len(table.blocks)
        self.single_env = np.full(n_blocks, _NO, dtype=np.int64)
        self.single_candidate = np.full(n_blocks, _NO, dtype=np.int64)
        self.n_envs = np.zeros(n_blocks, dtype=np.int64)
        keys_of: dict[int, list[GroupKey]] = {}
        for index, block in enumerate(table.blocks):
            record = {"args": block.args, "hparams": block.hparams}
            keys = keys_of.get(id(block.args))
            if keys is None:
                keys = keys_of[id(block.args)] = group_keys(record, labels)
            self.n_envs[index] = _num_envs(block.args, table.keys(block))
            setting = setting_ids.setdefault(cached_hparams_key(record), len(setting_ids))
            pairs = []
            for key in keys:
                group = group_ids.get(key)
                if group is None:
                    group = group_ids[key] = len(self.groups)
                    self.groups.append(key)
                candidate = candidate_ids.get((group, setting))
                if candidate is None:
                    candidate = candidate_ids[(group, setting)] = len(candidate_ids)
                    self.candidate_group.append(group)
                    self.candidate_setting.append(setting)
                    self.candidate_first_block.append(index)
                pairs.append((key.test_env, candidate))
            self.block_candidates.append(pairs)
            test_envs = block.args.get("test_envs") or []
            if len(test_envs) == 1 and pairs:
                self.single_env[index], self.single_candidate[index] = pairs[0]
        order = sorted(setting_ids, key=hparams_sort_key)   # stable: first seen first
        rank = np.empty(len(order), dtype=np.int64)
        rank[[setting_ids[k] for k in order]] = np.arange(len(order))
        self.candidate_rank = rank[np.asarray(self.candidate_setting, dtype=np.int64)] \
            if self.candidate_setting else np.zeros(0, dtype=np.int64)
        self.candidate_group_array = np.asarray(self.candidate_group, dtype=np.int64)


def _num_envs(args: dict, keys: tuple[str, ...]) -> int:
    """model_selection.num_envs of a record with these args and keys."""
    names = args.get("env_names")
    if names:
        return len(names)
    count = 0
    while f"env{count}_out_acc" in keys:
        count += 1
    return count


def candidates_of(table: ColumnTable, labels: Labels) -> Candidates:
    """The table's Candidates for these labels, worked out once."""
    cached = table.cache.get("candidates")
    if cached is None or cached[0] is not labels:
        cached = table.cache["candidates"] = (labels, Candidates(table, labels))
    return cached[1]


def _first_per(keys: np.ndarray, *then: np.ndarray) -> np.ndarray:
    """Positions of the first element of each `keys` value, after sorting by `keys`
    then by `then` (most significant first)."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((*reversed(then), keys))
    sorted_keys = keys[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return order[first]


def _finite(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values)


def _per_row(table: ColumnTable, per_block: np.ndarray, fill: int = _NO) -> np.ndarray:
    """A per-block array spread over the global rows (fill where a row is in no block)."""
    blocks = table.block_of_rows()
    out = np.where(blocks >= 0, per_block[np.maximum(blocks, 0)], fill) \
        if len(per_block) else np.full(len(blocks), fill, dtype=np.int64)
    return out


def _values_at(table: ColumnTable, rows: np.ndarray, envs: np.ndarray, template: str
               ) -> np.ndarray:
    """The value of key `template.format(envs[i])` at global row `rows[i]` (NaN where
    envs[i] is -1 or the row has no number there)."""
    out = np.full(len(rows), np.nan)
    for env in np.unique(envs[envs >= 0]):
        mask = envs == env
        out[mask] = table.store.column(template.format(int(env)))[rows[mask]]
    return out


def training_domain(table: ColumnTable, labels: Labels, val_suffix: str, test_suffix: str
                    ) -> list[Row]:
    """Training-domain validation (IIDAccuracySelectionMethod, WorstGroupSelectionMethod)."""
    cands = candidates_of(table, labels)
    test_env = _per_row(table, cands.single_env)
    candidate = _per_row(table, cands.single_candidate)
    n_envs = _per_row(table, cands.n_envs, 0)
    total = np.zeros(table.store.n_rows)
    count = np.zeros(table.store.n_rows, dtype=np.int64)
    max_envs = int(cands.n_envs.max()) if len(cands.n_envs) else 0
    for env in range(max_envs):
        value = table.store.column(f"env{env}_{val_suffix}")
        use = (test_env != env) & (env < n_envs) & _finite(value)
        total = total + np.where(use, value, 0.0)
        count += use
    val = np.divide(total, count, out=np.full(len(total), np.nan), where=count > 0)
    all_rows = np.arange(table.store.n_rows)
    test = _values_at(table, all_rows, test_env, "env{}_" + test_suffix)
    valid = (candidate >= 0) & (count > 0) & _finite(test)
    for row in np.flatnonzero(valid & (count >= 8)):   # np.mean adds 8 or more pairwise
        val[row] = _np_mean(table, int(row), int(test_env[row]), int(n_envs[row]),
                            val_suffix)
    rows = np.flatnonzero(valid)
    best = rows[_first_per(candidate[rows], -val[rows], rows)]
    return _choose(table, cands, candidate[best], val[best], test[best], best)


def _np_mean(table: ColumnTable, row: int, test_env: int, n_envs: int, suffix: str
             ) -> float:
    values = [float(table.store.column(f"env{i}_{suffix}")[row]) for i in range(n_envs)
              if i != test_env]
    return float(np.mean([v for v in values if np.isfinite(v)]))


def oracle(table: ColumnTable, labels: Labels) -> list[Row]:
    """The test env's validation value at each setting's last checkpoint."""
    cands = candidates_of(table, labels)
    test_env = _per_row(table, cands.single_env)
    candidate = _per_row(table, cands.single_candidate)
    step = table.store.column("step")
    rows = np.flatnonzero(candidate >= 0)
    last = rows[_first_per(candidate[rows], -step[rows], -rows)]
    val = _values_at(table, last, test_env[last], "env{}_out_acc")
    test = _values_at(table, last, test_env[last], "env{}_in_acc")
    keep = _finite(val) & _finite(test)
    return _choose(table, cands, candidate[last][keep], val[keep], test[keep], last[keep])


def leave_one_out(table: ColumnTable, labels: Labels) -> list[Row]:
    """Leave-one-domain-out cross-validation (module docstring)."""
    cands = candidates_of(table, labels)
    entries = _loo_entries(table, cands)
    if entries is None:
        return []
    row, candidate, kind, other = entries
    step = table.store.column("step")[row]
    order = np.lexsort((row, step, candidate))
    row, candidate, kind, other, step = (a[order] for a in (row, candidate, kind, other, step))
    new_cell = np.ones(len(row), dtype=bool)
    new_cell[1:] = (candidate[1:] != candidate[:-1]) | (step[1:] != step[:-1])
    cell = np.cumsum(new_cell) - 1
    starts = np.flatnonzero(new_cell)
    cell_candidate, cell_first_row = candidate[starts], row[starts]
    test_env = np.asarray([cands.groups[g].test_env for g in cands.candidate_group],
                          dtype=np.int64)[cell_candidate]
    blocks = table.block_of_rows()
    n_envs = cands.n_envs[blocks[cell_first_row]]
    singles = np.bincount(cell[kind == 0], minlength=len(starts))
    single_row = np.zeros(len(starts), dtype=np.int64)
    single_row[cell[kind == 0]] = row[kind == 0]
    test = _values_at(table, single_row, np.where(singles == 1, test_env, _NO),
                      "env{}_in_acc")
    val = _held_out_mean(table, cell, row, kind, other, n_envs, test_env, len(starts))
    valid = (n_envs >= 2) & (singles == 1) & _finite(val) & _finite(test)
    cells = np.flatnonzero(valid)
    best = cells[_first_per(cell_candidate[cells], -val[cells], cell_first_row[cells])]
    return _choose(table, cands, cell_candidate[best], val[best], test[best],
                   single_row[best])


def _loo_entries(table: ColumnTable, cands: Candidates
                 ) -> tuple[np.ndarray, ...] | None:
    """(row, candidate, kind, other env) of every record in every candidate it belongs to:
    kind 0 a single-test-env record, 1 a two-test-env record (other: its other env), 2 any
    other."""
    starts, sizes, candidates, kinds, others = [], [], [], [], []
    for block, pairs in zip(table.blocks, cands.block_candidates):
        envs = block.args.get("test_envs") or []
        for test_env, candidate in pairs:
            rest = set(envs) - {test_env}
            kind = 0 if len(envs) == 1 else 1 if len(envs) == 2 and len(rest) == 1 else 2
            starts.append(block.start)
            sizes.append(block.rows)
            candidates.append(candidate)
            kinds.append(kind)
            others.append(rest.pop() if kind == 1 else _NO)
    if not starts:
        return None
    size = np.asarray(sizes, dtype=np.int64)
    first = np.repeat(np.asarray(starts, dtype=np.int64) - np.cumsum(size) + size, size)
    row = np.arange(int(size.sum()), dtype=np.int64) + first
    spread = [np.repeat(np.asarray(a, dtype=np.int64), size)
              for a in (candidates, kinds, others)]
    return (row, *spread)


def _held_out_mean(table: ColumnTable, cell: np.ndarray, row: np.ndarray, kind: np.ndarray,
                   other: np.ndarray, n_envs: np.ndarray, test_env: np.ndarray,
                   n_cells: int) -> np.ndarray:
    """Per cell, the mean over the other envs v of env{v}_in_acc in the last two-test-env
    record holding v out (NaN where one is missing)."""
    pair = kind == 1
    pair = pair & (other < n_envs[cell])
    p_cell, p_row, p_other = cell[pair], row[pair], other[pair]
    # the last record per (cell, other env): entries are in row order inside a cell
    last = _first_per(p_cell * (int(other.max(initial=0)) + 1) + p_other, -p_row)
    max_envs = int(n_envs.max(initial=0))
    values = np.full((n_cells, max(max_envs, 1)), np.nan)
    values[p_cell[last], p_other[last]] = _values_at(table, p_row[last], p_other[last],
                                                     "env{}_in_acc")
    total = np.zeros(n_cells)
    complete = np.ones(n_cells, dtype=bool)
    for env in range(max_envs):
        needed = (env < n_envs) & (env != test_env)
        complete &= ~needed | _finite(values[:, env])
        total = total + np.where(needed, values[:, env], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / (n_envs - 1)
    return np.where(complete & (n_envs >= 2), mean, np.nan)


def _choose(table: ColumnTable, cands: Candidates, candidate: np.ndarray, val: np.ndarray,
            test: np.ndarray, rows: np.ndarray) -> list[Row]:
    """Per group, the best candidate (ties: the first setting in hparams_sort_key order):
    select()'s rows, groups in order of first appearance."""
    if len(candidate) == 0:
        return []
    group = cands.candidate_group_array[candidate]
    best = _first_per(group, -val, cands.candidate_rank[candidate])
    counts = np.bincount(group, minlength=len(cands.groups))
    blocks = table.block_of_rows()
    chosen = []
    for i in best[np.argsort(group[best], kind="stable")]:
        key = cands.groups[int(group[i])]
        block = table.blocks[int(blocks[rows[i]])]
        first = table.blocks[cands.candidate_first_block[int(candidate[i])]]
        chosen.append({**key._asdict(), "val_acc": float(val[i]), "test_acc": float(test[i]),
                       "step": _step(table, block, int(rows[i])), "run_dir": block.run_dir,
                       "hparams_seed": first.args.get("hparams_seed"),
                       "n_candidates": int(counts[group[i]])})
    return chosen


def _step(table: ColumnTable, block: Any, row: int) -> Any:
    """The record's own step value (an int; a block that keeps its dicts has it there)."""
    if block.records is not None:
        return block.records[row - block.start].get("step")
    return int(table.store.column("step")[row])
