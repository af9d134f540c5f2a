"""domainbed.results.records: reading run directories (ours and DomainBed's), skip-and-count of
corrupt lines and unfinished runs, the DataFrame view, per-example predictions."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from domainbed.predictions import list_prediction_steps, load_predictions, prediction_matrix
from domainbed.results.records import load_records, records_to_frame
from oodutils.errors import UserError
from oodutils.fileio import atomic_savez
from tests.builders import toy_record, write_run
from tests.requirements import data_dir, need_data

SWEEP = data_dir("domainbed_test_sweep") / "test_sweep_data"


def test_reads_runs_at_any_depth_and_adds_run_dir(tmp_path, capsys):
    a = write_run(tmp_path / "a", [toy_record(0), toy_record(100)])
    b = write_run(tmp_path / "sweep2" / "nested" / "b", [toy_record(0, trial_seed=1)])
    loaded = load_records(tmp_path)
    assert len(loaded) == 3 and len(loaded.records) == 3
    assert loaded.skipped_lines == 0 and loaded.skipped_runs == 0
    assert sorted({r["run_dir"] for r in loaded}) == sorted([str(a), str(b)])
    assert capsys.readouterr().err == ""   # nothing skipped, nothing said


def test_corrupt_lines_and_unfinished_runs_are_skipped_and_counted_once(tmp_path, capsys):
    write_run(tmp_path / "good", [toy_record(0), toy_record(100)],
              tail='{"args": {"dataset": "Toy"}, "env0_in')          # truncated last line
    bad = write_run(tmp_path / "bad", [toy_record(0)])
    with open(bad / "results.jsonl", "a") as f:
        f.write("not json at all\n[1, 2, 3]\n\n" + json.dumps(toy_record(200)) + "\n")
    write_run(tmp_path / "running", [toy_record(0)], done=False)
    write_run(tmp_path / "killed", [], done=False, tail='{"args": {')
    loaded = load_records(tmp_path)
    assert loaded.skipped_lines == 3       # truncated, not json, not a record
    assert loaded.skipped_runs == 2        # no done marker
    assert len(loaded) == 4
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "3 corrupt or truncated" in err and "2 runs without" in err


def test_require_done_false_reads_unfinished_runs(tmp_path, capsys):
    write_run(tmp_path / "running", [toy_record(0), toy_record(100)], done=False)
    assert len(load_records(tmp_path)) == 0
    loaded = load_records(tmp_path, require_done=False)
    assert len(loaded) == 2 and loaded.skipped_runs == 0


def test_quiet_keeps_the_warning_available(tmp_path, capsys):
    write_run(tmp_path / "running", [toy_record(0)], done=False)
    loaded = load_records(tmp_path, quiet=True)
    assert capsys.readouterr().err == ""
    assert "1 run without" in loaded.warning()


def test_missing_input_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_records(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        load_records(tmp_path / "file")


def test_several_input_dirs(tmp_path):
    write_run(tmp_path / "one" / "r", [toy_record(0)])
    write_run(tmp_path / "two" / "r", [toy_record(0), toy_record(1)])
    assert len(load_records([tmp_path / "one", tmp_path / "two"])) == 3


def test_records_to_frame(tmp_path):
    write_run(tmp_path / "a", [toy_record(0, test_envs=(0, 1), loss=0.3), toy_record(100)])
    frame = records_to_frame(load_records(tmp_path))
    assert len(frame) == 2
    for column in ["run_dir", "dataset", "algorithm", "test_envs", "trial_seed",
                   "hparams_seed", "args.dataset", "hparams.lr", "step", "env1_in_acc",
                   "loss"]:
        assert column in frame.columns, column
    assert frame["test_envs"].tolist() == [(0, 1), (0,)]
    assert frame.groupby("test_envs").size().to_dict() == {(0,): 1, (0, 1): 1}
    assert frame["loss"].isna().tolist() == [False, True]
    # A plain list of dicts works too, and no records give an empty frame.
    assert len(records_to_frame([toy_record(5)])) == 1
    assert len(records_to_frame([])) == 0


def test_predictions_round_trip(tmp_path):
    run = write_run(tmp_path / "run", [toy_record(0), toy_record(100)])
    assert list_prediction_steps(run) == []
    n = 6
    arrays = {"id": np.arange(n, dtype=np.int64), "env": np.zeros(n, np.int16),
              "split": np.array([0, 0, 1, 1, 2, 2], np.int8),
              "label": np.ones(n, np.int64), "pred": np.ones(n, np.int64),
              "correct": np.ones(n, np.uint8), "group": -np.ones(n, np.int64)}
    for step in (100, 0):
        atomic_savez(run / "predictions" / f"step_{step:07d}.npz", **arrays)
    (run / "predictions" / "notes.txt").write_text("ignored")
    assert list_prediction_steps(run) == [0, 100]
    loaded = load_predictions(run, 100)
    assert set(loaded) == set(arrays)
    np.testing.assert_array_equal(loaded["split"], arrays["split"])
    assert loaded["env"].dtype == np.int16
    with pytest.raises(UserError, match="no predictions for step 5.*0, 100"):
        load_predictions(run, 5)
    (run / "predictions" / "step_0000200.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(UserError, match="corrupt predictions"):
        load_predictions(run, 200)
    # The predictions folder is not mistaken for a run directory.
    assert len(load_records(tmp_path).run_dirs) == 1


def _save_predictions(run, step, ids, env, split, correct, logits=None):
    n = len(ids)
    arrays = {"id": np.asarray(ids, np.int64), "env": np.asarray(env, np.int16),
              "split": np.asarray(split, np.int8), "label": np.asarray(ids, np.int64) % 2,
              "pred": np.zeros(n, np.int64), "correct": np.asarray(correct, np.uint8),
              "group": np.asarray(ids, np.int64) % 3}
    if logits is not None:
        arrays["logits"] = np.asarray(logits, np.float16)
    atomic_savez(Path(run) / "predictions" / f"step_{step:07d}.npz", **arrays)


def test_prediction_matrix_aligns_examples_by_id_across_checkpoints(tmp_path, capsys):
    a = write_run(tmp_path / "a", [toy_record(0), toy_record(100)])
    b = write_run(tmp_path / "b", [toy_record(0), toy_record(50)])
    # Same examples stored in different orders; env 1 and the UDA split are left out.
    _save_predictions(a, 0, [3, 1, 2, 9], [0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 1, 1])
    _save_predictions(a, 100, [1, 2, 3, 9], [0, 0, 0, 1], [1, 0, 0, 0], [1, 1, 1, 0])
    _save_predictions(b, 0, [2, 3, 1, 8, 7], [0, 0, 0, 0, 1], [0, 0, 1, 2, 0],
                      [0, 0, 1, 1, 1])
    # b step 50 has no predictions file: skipped and counted.
    view = prediction_matrix(load_records(tmp_path), env=0)
    assert view.examples["id"].tolist() == [1, 2, 3]
    assert view.examples["split"].tolist() == [1, 0, 0]
    assert view.examples["group"].tolist() == [1, 2, 0]
    assert [(Path(r["run_dir"]).name, r["step"]) for r in view.checkpoints] == [
        ("a", 0), ("a", 100), ("b", 0)]
    np.testing.assert_array_equal(view.values, [[0, 1, 1], [1, 1, 1], [1, 0, 0]])
    assert view.values.dtype == np.uint8 and view.skipped == 1
    # With the UDA split, b has an example (id 8) that a lacks: columns would not align.
    with pytest.raises(UserError, match="not scored on the same examples of env 0.*b "):
        prediction_matrix(load_records(tmp_path), env=0, splits=(0, 1, 2))
    only_a = [r for r in load_records(tmp_path) if Path(r["run_dir"]).name == "a"]
    assert prediction_matrix(only_a, env=0, splits=(0, 1, 2)).values.shape == (2, 3)
    with pytest.raises(UserError, match="no 'logits'.*--save_logits"):
        prediction_matrix(load_records(tmp_path), env=0, field="logits")
    with pytest.raises(UserError, match="no example of environment 5"):
        prediction_matrix(load_records(tmp_path), env=5)


def test_prediction_matrix_of_logits_and_of_no_predictions(tmp_path):
    run = write_run(tmp_path / "r", [toy_record(0), toy_record(10)])
    with pytest.raises(UserError, match="none of the 2 checkpoints has a predictions file"):
        prediction_matrix(load_records(tmp_path), env=0)
    logits = np.arange(8, dtype=np.float32).reshape(4, 2)
    _save_predictions(run, 10, [4, 3, 2, 1], [0] * 4, [0] * 4, [1] * 4, logits=logits)
    view = prediction_matrix(load_records(tmp_path), env=0, field="logits")
    assert view.values.shape == (1, 4, 2) and view.skipped == 1
    np.testing.assert_array_equal(view.values[0], logits[::-1])


def test_reads_domainbed_published_sweep(tmp_path):
    need_data(SWEEP, "DomainBed's test sweep")
    loaded = load_records(SWEEP, use_cache=False)   # read in place: no cache written there
    assert len(loaded) == 200
    assert loaded.skipped_lines == 0 and loaded.skipped_runs == 0
    assert {r["args"]["dataset"] for r in loaded} == {"VLCS"}
    frame = records_to_frame(loaded)
    assert len(frame) == 200 and frame["run_dir"].nunique() == len(loaded.run_dirs)
    # A copy with one run unfinished and one line cut short still loads.
    copy = tmp_path / "sweep"
    shutil.copytree(SWEEP, copy)
    runs = sorted(p.parent for p in copy.glob("*/results.jsonl"))
    (runs[0] / "done").unlink()
    lines = (runs[1] / "results.jsonl").read_text().splitlines(keepends=True)
    (runs[1] / "results.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40])
    partial = load_records(copy, quiet=True)
    assert partial.skipped_runs == 1 and partial.skipped_lines == 1
    n_first = len((runs[0] / "results.jsonl").read_bytes().splitlines())
    assert len(partial) == 200 - n_first - 1
