"""Column-wise records and selection (domainbed.results.columns, column_selection): the
tables rebuild the very records they were made of, and numpy selection picks what the
one-record-at-a-time methods pick, to the bit, on sweeps made to hit their corner cases
(missing and null values, NaN, duplicated settings, ties, two-test-env runs, runs of
different environment counts, int accuracies, records whose keys change within a run)."""
import math
import random

import numpy as np
import pytest

from domainbed.results import column_selection
from domainbed.results import model_selection as ms
from domainbed.results.columns import ColumnTable, TableBuilder, file_parts

METHODS = [ms.IIDAccuracySelectionMethod, ms.WorstGroupSelectionMethod,
           ms.OracleSelectionMethod, ms.LeaveOneOutSelectionMethod]


def _value(rng, ties):
    if rng.random() < ties:            # most checkpoints and settings tie
        return rng.choice([0.5, 1.0])
    draw = rng.random()
    if draw < 0.06:
        return None
    if draw < 0.09:
        return float("nan")
    if draw < 0.12:
        return rng.choice([0, 1])          # an int accuracy
    if draw < 0.2:
        return rng.choice([0.25, 0.5, 0.75])   # ties
    return round(rng.random(), rng.choice([2, 17]))


def _sweep(seed, n_settings=6):
    """Records of a random sweep laid out as DomainBed's (every single and pair of test
    envs per setting), with some runs dropped, duplicated, or held out three envs."""
    rng = random.Random(seed)
    ties = 0.9 if seed % 2 else 0.0
    records = []
    for _ in range(n_settings):
        dataset, n_envs = rng.choice([("VLCS", 4), ("PACS", 4), ("D3", 3), ("D9", 9)])
        base = {"dataset": dataset, "algorithm": rng.choice(["ERM", "IRM"]),
                "trial_seed": rng.randrange(2), "hparams_seed": rng.randrange(3)}
        envs = [[e] for e in range(n_envs)] + \
            [[a, b] for a in range(n_envs) for b in range(a + 1, n_envs)]
        envs += [sorted(rng.sample(range(n_envs), 3))]
        for test_envs in envs:
            for _ in range(rng.choice([0] + [1] * 8 + [2])):
                records += _run(rng, dict(base, test_envs=test_envs), n_envs,
                                f"run{len(records)}", ties)
    return records


def _run(rng, args, n_envs, run_dir, ties):
    hparams = {"lr": [1e-3, 1e-4][args["hparams_seed"] % 2]}
    steps = rng.choice([[0, 100, 200], [0, 100, 100, 200], [0, 200, 100], [0, 100]])
    records = []
    for step in steps:
        record = {"args": args}
        for env in range(n_envs):
            for split in ("in", "out"):
                if rng.random() > 0.03:
                    record[f"env{env}_{split}_acc"] = _value(rng, ties)
                if rng.random() > 0.3:
                    record[f"env{env}_{split}_wga"] = _value(rng, ties)
        record.update(hparams=hparams, step=step, run_dir=run_dir)
        records.append(record)
    return records


def _frames_equal(a, b):
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for column in a.columns:
        for x, y in zip(a[column].tolist(), b[column].tolist()):
            same = (x == y) or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
            assert same and type(x) is type(y), (column, x, y)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.key)
def test_column_selection_picks_what_the_per_record_methods_pick(seed, method):
    records = _sweep(seed)
    labels = ms.dataset_labels(records)
    by_record, _ = ms._select_records(records, method, labels)
    assert by_record, "the sweep selects something"
    import pandas as pd
    expected = pd.DataFrame(by_record, columns=list(ms.GroupKey._fields) + [
        "val_acc", "test_acc", "step", "run_dir", "hparams_seed", "n_candidates"])
    _frames_equal(ms.select(records, method, labels), expected)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.key)
def test_the_loader_s_lossless_blocks_select_alike(method):
    """Blocks rebuilt from matrices (as the loader and the index keep them) select as the
    dicts do."""
    records = [r for r in _sweep(3) if all(type(v) is not float or v == v for v in r.values())
               and None not in r.values()]
    builder = TableBuilder()
    for run_dir in dict.fromkeys(r["run_dir"] for r in records):
        mine = [{k: v for k, v in r.items() if k != "run_dir"} for r in records
                if r["run_dir"] == run_dir]
        for part in file_parts(mine):
            builder.add_part(run_dir, part)
    table = builder.finish()
    assert any(b.records is None for b in table.blocks)
    _frames_equal(ms.select(table, method), ms.select(records, method))


def test_a_table_gives_back_its_records_and_rebuilds_lossless_ones_exactly():
    records = _sweep(5, n_settings=2)
    table = ColumnTable.from_records(records)
    assert table.records == records and all(a is b for a, b in zip(table.records, records))
    clean = [{"args": {"dataset": "VLCS", "test_envs": [0]}, "env0_in_acc": 1,
              "env0_out_acc": 0.5, "hparams": {"lr": 0.1}, "step": 2 ** 40, "epoch": -0.0}]
    part, = file_parts(clean)
    assert part.records is None and part.values.dtype == np.float64
    rebuilt = part.to_records()
    assert rebuilt == clean and [list(r) for r in rebuilt] == [list(clean[0])]
    assert [type(v) for v in rebuilt[0].values()] == [type(v) for v in clean[0].values()]
    assert math.copysign(1, rebuilt[0]["epoch"]) == -1


def test_records_that_a_matrix_cannot_hold_keep_their_dicts():
    odd = [{"args": {"dataset": "VLCS", "test_envs": [0]}, "env0_in_acc": None,
            "flag": True, "step": 2 ** 60}]
    part, = file_parts(odd)
    assert part.records == odd and part.records[0] is odd[0] and part.layout[1] == "aooo"
    assert np.isnan(part.values[0, :3]).all()     # no number selection may use ...
    assert part.values[0, 3] == float(2 ** 60)    # ... but a big int, as float() reads it


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", [10 ** 9, 0.001])
def test_leave_one_out_with_steps_no_dense_grid_holds(seed, scale):
    """Steps too large for the dense (candidate, step) grid, or not ints, are grouped by
    sorting: the cells are still the per-record method's."""
    records = [dict(r, step=r["step"] * scale) for r in _sweep(seed)]
    assert column_selection._step_codes(np.array([r["step"] for r in records])) is None
    labels = ms.dataset_labels(records)
    method = ms.LeaveOneOutSelectionMethod
    by_record, _ = ms._select_records(records, method, labels)
    assert by_record, "the sweep selects something"
    import pandas as pd
    expected = pd.DataFrame(by_record, columns=list(ms.GroupKey._fields) + [
        "val_acc", "test_acc", "step", "run_dir", "hparams_seed", "n_candidates"])
    _frames_equal(ms.select(records, method, labels), expected)


@pytest.mark.parametrize("two_layouts", [False, True])
def test_values_at_reads_each_row_s_own_key(two_layouts):
    records = [{"args": {"dataset": "D", "test_envs": [0]}, "env0_in_acc": 0.1 * i,
                "env1_in_acc": 1.0 + i, "step": i} for i in range(6)]
    if two_layouts:
        del records[2]["env1_in_acc"]
    store = ColumnTable.from_records(records).store
    assert (store._only_layout() is None) == two_layouts
    rows = np.array([5, 0, 2, 3, 2])
    which = np.array([1, 0, 1, -1, 0])
    keys = ["env0_in_acc", "env1_in_acc"]
    expected = [records[r].get(keys[w], math.nan) if w >= 0 else math.nan
                for r, w in zip(rows, which)]
    np.testing.assert_array_equal(store.values_at(rows, keys, which), expected)
