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

from domainbed.results.columns import ColumnTable, concat_ranges, exclusive_cumsum
from domainbed.results.grouping import (
    GroupKey,
    Labels,
    dataset_label,
    dataset_labels,
    group_keys,
    hparams_sort_key,
)
from domainbed.results.run_keys import (
    ALGORITHM,
    DATA_KEY,
    DATASET,
    ENV_NAMES,
    HPARAMS_KEY,
    HPARAMS_SEED,
    TEST_ENVS,
    TRIAL_SEED,
    RunKeys,
    distinct_rows,
    first_seen,
)

Row = dict[str, Any]
_NO = -1


class Candidates:
    """Who competes with whom: the groups, the hyperparameter settings and the candidates
    (group, setting) of a table's blocks, numbered in order of first appearance. Worked out
    on the blocks' key codes (``run_keys``): the grouping helpers run once per distinct
    (dataset, data, algorithm, trial seed, test envs), numpy spreads their answers.

    Entries: one per (block, group it belongs to), in block order: `entry_block`,
    `entry_test_env`, `entry_candidate`, `entry_kind` (0: the block's only test env; 1: one
    of two, `entry_other` the other; 2: any other)."""

    def __init__(self, table: ColumnTable, labels: Labels) -> None:
        keys = table.keys
        fields = (DATASET, DATA_KEY, ALGORITHM, TRIAL_SEED, TEST_ENVS)
        combos, combo_of = keys.distinct(fields)
        self.groups: list[GroupKey] = []
        group_ids: dict[GroupKey, int] = {}
        flat: list[tuple[int, int, int, int]] = []    # (test_env, group, kind, other)
        combo_sizes, combo_single = [], []
        for combo in combos:
            args = keys.args_view(combo, fields)
            envs = list(args.get("test_envs") or [])
            found = group_keys({"args": args}, labels)
            for key in found:
                group = group_ids.setdefault(key, len(self.groups))
                if group == len(self.groups):
                    self.groups.append(key)
                rest = set(envs) - {key.test_env}
                kind = 0 if len(envs) == 1 else 1 if len(envs) == 2 and len(rest) == 1 else 2
                flat.append((key.test_env, group, kind, rest.pop() if kind == 1 else _NO))
            combo_sizes.append(len(found))
            combo_single.append(len(envs) == 1 and bool(found))
        sizes = np.asarray(combo_sizes, dtype=np.int64)[combo_of] if len(combos) else \
            np.zeros(table.n_blocks, dtype=np.int64)
        entry_first = exclusive_cumsum(sizes)
        self.entry_block = np.repeat(np.arange(table.n_blocks), sizes)
        combo_start = exclusive_cumsum(np.asarray(combo_sizes, dtype=np.int64))
        flat_at = (combo_start[combo_of][self.entry_block] if len(self.entry_block) else
                   np.zeros(0, dtype=np.int64)) + \
            np.arange(len(self.entry_block)) - np.repeat(entry_first, sizes)
        columns = np.asarray(flat, dtype=np.int64).reshape(-1, 4)[flat_at]
        self.entry_test_env, entry_group, self.entry_kind, self.entry_other = columns.T
        setting, setting_first = _first_seen_codes(keys.column(HPARAMS_KEY))
        entry_setting = setting[self.entry_block]
        self.entry_candidate, first_entry = _first_seen_codes(
            entry_group * len(setting_first) + entry_setting)
        self.candidate_group_array = entry_group[first_entry]
        self.candidate_first_block = self.entry_block[first_entry]
        self.single_env = np.full(table.n_blocks, _NO, dtype=np.int64)
        self.single_candidate = np.full(table.n_blocks, _NO, dtype=np.int64)
        single = np.flatnonzero(np.asarray(combo_single, dtype=bool)[combo_of]) \
            if len(combos) else np.zeros(0, dtype=np.int64)
        self.single_env[single] = self.entry_test_env[entry_first[single]]
        self.single_candidate[single] = self.entry_candidate[entry_first[single]]
        self.n_envs = block_env_counts(table)
        self.candidate_rank = _setting_ranks(keys, setting_first)[entry_setting[first_entry]]


def _first_seen_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, firsts): each value's number among the distinct values, numbered in order
    of first appearance, and where each number first appears."""
    return first_seen(values)


def _setting_ranks(keys: RunKeys, setting_first: np.ndarray) -> np.ndarray:
    """Each setting's place in hparams_sort_key order (ties: first seen first);
    setting_first: the block where each setting first appears."""
    n_settings = len(setting_first)
    codes = keys.column(HPARAMS_KEY)[setting_first]
    values = keys.values[HPARAMS_KEY]
    order = sorted(range(n_settings), key=lambda s: hparams_sort_key(values[codes[s]]))
    rank = np.empty(n_settings, dtype=np.int64)
    rank[order] = np.arange(n_settings)
    return rank


def block_env_counts(table: ColumnTable) -> np.ndarray:
    """model_selection.num_envs of each block's records: from its env_names, else its
    ``env<i>_out_acc`` keys (worked out once per distinct pair)."""
    found = table.cache.get("n_envs")
    if found is None:
        pairs = np.stack([table.keys.column(ENV_NAMES), table.layout], axis=1) \
            if table.n_blocks else np.zeros((0, 2), dtype=np.int64)
        combos, inverse = _distinct_rows(pairs)
        counts = np.array([_num_envs(table.keys.values[ENV_NAMES][names],
                                     table.store.layouts[layout][0])
                           for names, layout in combos.tolist()], dtype=np.int64)
        found = table.cache["n_envs"] = counts[inverse] if len(combos) else \
            np.zeros(0, dtype=np.int64)
    return found


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    combos, inverse, _ = distinct_rows(rows)
    return combos, inverse


def _num_envs(names: Any, keys: tuple[str, ...]) -> int:
    """model_selection.num_envs of a record with these env_names and keys."""
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
    then by `then` (most significant first; the position breaks what ties remain)."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    if len(then) == 2 and not any(t.dtype.kind == "f" and np.isnan(t).any() for t in then):
        return _first_per_by_segments(keys, *then)
    order = np.lexsort((*reversed(then), keys))
    sorted_keys = keys[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return order[first]


def _first_per_by_segments(keys: np.ndarray, primary: np.ndarray, secondary: np.ndarray
                           ) -> np.ndarray:
    """`_first_per` without NaN: each run of equal consecutive keys reduced to its best
    (a run's rows are one block's, as a rule), then one stable sort of those by key and
    per key the smallest primary, among those the smallest secondary, among those the
    first."""
    runs = _best_per_run(keys, primary, secondary)
    order = runs[np.argsort(keys[runs], kind="stable")]
    return order[_best_per_run(keys[order], primary[order], secondary[order])]


def _best_per_run(keys: np.ndarray, primary: np.ndarray, secondary: np.ndarray
                  ) -> np.ndarray:
    """Per run of equal consecutive keys, the position of its element with the smallest
    primary, among those the smallest secondary, among those the first."""
    new = np.ones(len(keys), dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(new)
    segment = np.cumsum(new) - 1
    tie = primary == np.minimum.reduceat(primary, starts)[segment]
    second = np.where(tie, secondary.astype(np.float64), np.inf)
    best = np.flatnonzero(tie & (second == np.minimum.reduceat(second, starts)[segment]))
    keep = np.ones(len(best), dtype=bool)
    keep[1:] = segment[best][1:] != segment[best][:-1]
    return best[keep]


def _finite(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values)


def _values_at(table: ColumnTable, rows: np.ndarray, envs: np.ndarray, template: str
               ) -> np.ndarray:
    """The value of key `template.format(envs[i])` at global row `rows[i]` (NaN where
    envs[i] is -1 or the row has no number there)."""
    count = int(envs.max(initial=-1)) + 1
    return table.store.values_at(rows, [template.format(env) for env in range(count)], envs)


class _SingleRows:
    """The rows of the blocks with one test env and a candidate: their global `rows`, and
    per row its block's `test_env`, `candidate` and `n_envs` (the rows the training-domain
    and oracle methods choose among)."""

    def __init__(self, table: ColumnTable, cands: Candidates) -> None:
        blocks = np.flatnonzero(cands.single_candidate >= 0)
        sizes = table.rows[blocks]
        self.rows = concat_ranges(table.start[blocks], sizes)
        self.test_env, self.candidate, self.n_envs = (
            np.repeat(per_block[blocks], sizes)
            for per_block in (cands.single_env, cands.single_candidate, cands.n_envs))


def training_domain(table: ColumnTable, labels: Labels, val_suffix: str, test_suffix: str
                    ) -> list[Row]:
    """Training-domain validation (IIDAccuracySelectionMethod, WorstGroupSelectionMethod)."""
    cands = candidates_of(table, labels)
    single = _SingleRows(table, cands)
    rows, test_env, n_envs = single.rows, single.test_env, single.n_envs
    total = np.zeros(len(rows))
    count = np.zeros(len(rows), dtype=np.int64)
    for env in range(int(n_envs.max(initial=0))):
        value = table.store.column(f"env{env}_{val_suffix}")[rows]
        use = (test_env != env) & (env < n_envs) & _finite(value)
        total += np.where(use, value, 0.0)
        count += use
    val = np.divide(total, count, out=np.full(len(total), np.nan), where=count > 0)
    test = _values_at(table, rows, test_env, "env{}_" + test_suffix)
    valid = (count > 0) & _finite(test)
    for at in np.flatnonzero(valid & (count >= 8)):   # np.mean adds 8 or more pairwise
        val[at] = _np_mean(table, int(rows[at]), int(test_env[at]), int(n_envs[at]),
                           val_suffix)
    chosen = np.flatnonzero(valid)
    best = chosen[_first_per(single.candidate[chosen], -val[chosen], rows[chosen])]
    return _choose(table, cands, single.candidate[best], val[best], test[best], rows[best])


def _np_mean(table: ColumnTable, row: int, test_env: int, n_envs: int, suffix: str
             ) -> float:
    values = [float(table.store.column(f"env{i}_{suffix}")[row]) for i in range(n_envs)
              if i != test_env]
    return float(np.mean([v for v in values if np.isfinite(v)]))


def oracle(table: ColumnTable, labels: Labels) -> list[Row]:
    """The test env's validation value at each setting's last checkpoint."""
    cands = candidates_of(table, labels)
    single = _SingleRows(table, cands)
    rows = single.rows
    step = table.store.column("step")[rows]
    last = _first_per(single.candidate, -step, -rows)
    test_env = single.test_env[last]
    val = _values_at(table, rows[last], test_env, "env{}_out_acc")
    test = _values_at(table, rows[last], test_env, "env{}_in_acc")
    keep = _finite(val) & _finite(test)
    return _choose(table, cands, single.candidate[last][keep], val[keep], test[keep],
                   rows[last][keep])


def leave_one_out(table: ColumnTable, labels: Labels) -> list[Row]:
    """Leave-one-domain-out cross-validation (module docstring)."""
    cands = candidates_of(table, labels)
    entries = _loo_entries(table, cands)
    if entries is None:
        return []
    row, candidate, kind, other = entries
    cell, cell_candidate, cell_first_row = _cells(
        row, candidate, table.store.column("step")[row], len(cands.candidate_group_array))
    n_cells = len(cell_candidate)
    group_test_env = np.asarray([g.test_env for g in cands.groups], dtype=np.int64)
    test_env = group_test_env[cands.candidate_group_array][cell_candidate]
    n_envs = cands.n_envs[table.block_of_rows()[cell_first_row]]
    single = kind == 0
    single_cell = cell[single]
    singles = np.bincount(single_cell, minlength=n_cells)
    single_row = np.zeros(n_cells, dtype=np.int64)
    single_row[single_cell] = row[single]
    test = np.full(n_cells, np.nan)      # read in row order, where one single-env record is
    test[single_cell] = _values_at(table, row[single], test_env[single_cell],
                                   "env{}_in_acc")
    test[singles != 1] = np.nan
    val = _held_out_mean(table, cell, row, kind, other, n_envs, test_env, n_cells)
    valid = (n_envs >= 2) & (singles == 1) & _finite(val) & _finite(test)
    cells = np.flatnonzero(valid)
    best = cells[_first_per(cell_candidate[cells], -val[cells], cell_first_row[cells])]
    return _choose(table, cands, cell_candidate[best], val[best], test[best],
                   single_row[best])


def _cells(row: np.ndarray, candidate: np.ndarray, step: np.ndarray, n_candidates: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell, cell_candidate, cell_first_row): each entry's cell, its (candidate, step),
    cells numbered in (candidate, step) order (a NaN step: a cell of its own), and each
    cell's candidate and first row. Small int steps: counted into a dense grid; else by
    sorting."""
    codes = _step_codes(step)
    if codes is not None and n_candidates * codes[1] <= 2 * len(row) + 1024:
        return _dense_cells(row, candidate * codes[1] + codes[0], codes[1],
                            n_candidates * codes[1])
    order = _cell_order(row, step, candidate)
    ordered_candidate, ordered_step = candidate[order], step[order]
    new_cell = np.ones(len(order), dtype=bool)
    new_cell[1:] = (ordered_candidate[1:] != ordered_candidate[:-1]) | \
        (ordered_step[1:] != ordered_step[:-1])
    starts = np.flatnonzero(new_cell)
    cell = np.empty(len(order), dtype=np.int64)
    cell[order] = np.cumsum(new_cell) - 1
    return cell, ordered_candidate[starts], row[order[starts]]


def _step_codes(step: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(codes, count): each step's number among the distinct steps in increasing order,
    where every step is an int from 0 to a bound the table's size sets; else None."""
    if not len(step) or not np.isfinite(step).all() or step.min() < 0 or \
            step.max() > 4 * len(step) + 1024:
        return None
    whole = step.astype(np.int64)
    if not (whole == step).all():
        return None
    used = np.zeros(int(whole.max()) + 1, dtype=bool)
    used[whole] = True
    number = np.cumsum(used) - 1
    return number[whole], int(number[-1]) + 1


def _dense_cells(row: np.ndarray, key: np.ndarray, n_codes: int, n_keys: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_cells where each entry's (candidate, step) is `key` = candidate * n_codes + step
    code, below `n_keys`: the first row per key without sorting."""
    none = np.iinfo(np.int64).max
    first = np.full(n_keys, none, dtype=np.int64)
    np.minimum.at(first, key, row)
    present = np.flatnonzero(first != none)
    number = np.zeros(n_keys, dtype=np.int64)
    number[present] = np.arange(len(present))
    return number[key], present // n_codes, first[present]


def _cell_order(row: np.ndarray, step: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """np.lexsort((row, step, candidate)): one stable sort of an integer (candidate,
    step) key where steps are small ints and each candidate's rows come in order (they
    do unless a run lists a test env twice), else lexsort."""
    if len(step) and np.isfinite(step).all() and step.min() >= 0 and \
            step.max() < 2 ** 31 and (step == np.floor(step)).all():
        key = candidate * (int(step.max()) + 1) + step.astype(np.int64)
        order = np.argsort(key, kind="stable")
        same, rows = key[order], row[order]
        if ((rows[1:] > rows[:-1]) | (same[1:] != same[:-1])).all():
            return order
    return np.lexsort((row, step, candidate))


def _loo_entries(table: ColumnTable, cands: Candidates
                 ) -> tuple[np.ndarray, ...] | None:
    """(row, candidate, kind, other env) of every record in every candidate it belongs to
    (kinds: see Candidates)."""
    if len(cands.entry_block) == 0:
        return None
    blocks = cands.entry_block
    size = table.rows[blocks]
    row = concat_ranges(table.start[blocks], size)
    spread = [np.repeat(a, size) for a in (cands.entry_candidate, _small(cands.entry_kind),
                                           _small(cands.entry_other))]
    return (row, *spread)


def _small(values: np.ndarray) -> np.ndarray:
    """Kinds or envs (small ints, only compared and used as indices) as int8 where they
    fit: spread over every row (two million of them in a 100,000-run sweep), int64 is
    memory the report pays for in page faults."""
    if len(values) and -128 <= int(values.min()) and int(values.max()) <= 127:
        return values.astype(np.int8)
    return values


def _held_out_mean(table: ColumnTable, cell: np.ndarray, row: np.ndarray, kind: np.ndarray,
                   other: np.ndarray, n_envs: np.ndarray, test_env: np.ndarray,
                   n_cells: int) -> np.ndarray:
    """Per cell, the mean over the other envs v of env{v}_in_acc in the last two-test-env
    record holding v out (NaN where one is missing)."""
    max_envs = int(n_envs.max(initial=0))
    width = max(max_envs, 1)
    slot, last_row, env = _last_held_out(cell, row, kind, other, n_envs, width, n_cells)
    flat = np.full(n_cells * width, np.nan)
    flat[slot] = _values_at(table, last_row, env, "env{}_in_acc")
    values = flat.reshape(n_cells, width)
    total = np.zeros(n_cells)
    complete = np.ones(n_cells, dtype=bool)
    for held_out in range(max_envs):
        needed = (held_out < n_envs) & (held_out != test_env)
        complete &= ~needed | _finite(values[:, held_out])
        total = total + np.where(needed, values[:, held_out], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / (n_envs - 1)
    return np.where(complete & (n_envs >= 2), mean, np.nan)


def _last_held_out(cell: np.ndarray, row: np.ndarray, kind: np.ndarray, other: np.ndarray,
                   n_envs: np.ndarray, width: int, n_cells: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot: cell * width + env, row, env) of the last two-test-env record holding env
    out, for each (cell, env) that has one. Made from the positions of those records, not
    from masks over every entry: the report's peak memory is paid for in page faults."""
    pair = np.flatnonzero(kind == 1)
    pair = pair[other[pair] < n_envs[cell[pair]]]
    pair_row, env = row[pair], other[pair]
    slot = cell[pair] * width + env
    last_row = np.full(n_cells * width, -1, dtype=np.int64)
    np.maximum.at(last_row, slot, pair_row)    # the last record per (cell, env)
    last = np.flatnonzero(pair_row == last_row[slot])   # one per (cell, env): rows in order
    return slot[last], pair_row[last], env[last]


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
        block = int(blocks[rows[i]])
        first = int(cands.candidate_first_block[int(candidate[i])])
        chosen.append({**key._asdict(), "val_acc": float(val[i]), "test_acc": float(test[i]),
                       "step": _step(table, block, int(rows[i])),
                       "run_dir": table.run_dirs[block],
                       "hparams_seed": table.keys.value(HPARAMS_SEED, first),
                       "n_candidates": int(counts[group[i]])})
    return chosen


def _step(table: ColumnTable, block: int, row: int) -> Any:
    """The record's own step value (an int; a block that keeps its dicts has it there)."""
    kept = table.kept.get(block)
    if kept is not None:
        return kept[row - int(table.start[block])].get("step")
    return int(table.store.column("step")[row])


def table_labels(table: ColumnTable) -> Labels:
    """grouping.dataset_labels of the table's blocks, from their distinct (dataset, data)
    pairs."""
    keys = table.keys
    combos, _ = keys.distinct((DATASET, DATA_KEY))
    views = [{"args": keys.args_view(c, (DATASET, DATA_KEY))} for c in combos]
    return dataset_labels(views)    # (a list: it tells records apart by id(args))


def block_labels(table: ColumnTable, labels: Labels) -> tuple[np.ndarray, list[Any]]:
    """(codes, names): each block's dataset label as a number into `names` (None for a
    block without a dataset), names in order of first appearance."""
    keys = table.keys
    combos, inverse = keys.distinct((DATASET, DATA_KEY))
    names: list[Any] = []
    code_of: dict[Any, int] = {}
    combo_codes = []
    for combo in combos:
        args = keys.args_view(combo, (DATASET, DATA_KEY))
        name = dataset_label({"args": args}, labels) if args.get("dataset") is not None \
            else None
        combo_codes.append(code_of.setdefault(name, len(names)))
        if combo_codes[-1] == len(names):
            names.append(name)
    codes = np.asarray(combo_codes, dtype=np.int64)[inverse] if len(combos) else \
        np.zeros(0, dtype=np.int64)
    return codes, names
