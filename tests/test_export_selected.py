"""Keeping the selected models: collect_results --export_selected and train's
--save_best_model."""
import json
import os
import subprocess
import sys

from domainbed.results import model_selection as ms
from domainbed.results.export import export_selected
from domainbed.results.records import load_records
from tests.builders import read_records, record, run_args, write_run


def rec(step, hparams_seed, val, test, test_env=0):
    """A Toy record: `test` on env 0, `val` on env 1."""
    return record(step, run_args(test_envs=[test_env], hparams_seed=hparams_seed),
                  {"lr": 0.001 * (1 + hparams_seed)}, {0: (test, test), 1: (val, val)})


def test_each_method_gets_the_checkpoint_it_picks(tmp_path):
    sweep = tmp_path / "sweep"
    # run a: training-domain validation prefers its last step (10), which model.pkl holds
    a = write_run(sweep / "a", [rec(0, 1, 0.5, 0.4), rec(10, 1, 0.9, 0.8)])
    (a / "model.pkl").write_bytes(b"model a, step 10")
    # run b: validation prefers step 0, of which only model_step0.pkl exists
    b = write_run(sweep / "b", [rec(0, 2, 0.95, 0.7), rec(10, 2, 0.6, 0.9)])
    (b / "model.pkl").write_bytes(b"model b, step 10")
    records = load_records(sweep).records
    out = tmp_path / "selected"
    manifest = export_selected(records, [ms.IIDAccuracySelectionMethod], str(out))
    (entry,) = manifest["entries"]
    assert (entry["run_dir"], entry["step"]) == (str(b), 0)
    assert entry["model"] is None and "no model of step 0" in entry["reason"]
    (b / "model_step0.pkl").write_bytes(b"model b, step 0")
    manifest = export_selected(records, [ms.IIDAccuracySelectionMethod,
                                         ms.OracleSelectionMethod], str(out))
    iid, oracle = manifest["entries"]
    assert iid["model"] == "training_domain/Toy/ERM/env0_trial0/model.pkl"
    kept = out / iid["model"]
    assert kept.read_bytes() == b"model b, step 0"
    assert os.stat(kept).st_ino == os.stat(b / "model_step0.pkl").st_ino   # hard link
    assert iid["hparams"] == {"lr": 0.003} and iid["val_acc"] == 0.95
    # the oracle reads the test env's out split at the last step: run b's 0.9
    assert (oracle["run_dir"], oracle["step"], oracle["test_acc"]) == (str(b), 10, 0.9)
    assert (out / oracle["model"]).read_bytes() == b"model b, step 10"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert json.loads((kept.parent / "selection.json").read_text())["step"] == 0


def test_hostile_names_stay_inside_the_export(tmp_path):
    r = rec(0, 1, 0.5, 0.5)
    r["args"].update(dataset="../../etc", algorithm="a/b")
    run = write_run(tmp_path / "sweep" / "r", [r])
    (run / "model.pkl").write_bytes(b"m")
    out = tmp_path / "selected"
    manifest = export_selected(load_records(tmp_path / "sweep").records,
                               [ms.IIDAccuracySelectionMethod], str(out))
    path = (out / manifest["entries"][0]["model"]).resolve()
    assert str(path).startswith(str(out.resolve()) + os.sep)


def test_save_best_model_keeps_the_best_validation_checkpoint(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
            "--data_dir", str(tmp_path), "--output_dir", str(out), "--steps", "5",
            "--checkpoint_freq", "1", "--test_envs", "0", "--num_threads", "1",
            "--save_best_model", "--hparams", '{"lr": 0.05, "batch_size": 8}']
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = read_records(out)
    vals = [(r["env1_out_acc"] + r["env2_out_acc"]) / 2 for r in records]
    best_step = records[vals.index(max(vals))]["step"]
    meta = json.loads((out / "model_best.json").read_text())
    assert meta["step"] == best_step and abs(meta["val_acc"] - max(vals)) < 1e-12
    assert (out / "model_best.pkl").is_file()
    assert "save_best_model" in records[0]["args"]
    selected = tmp_path / "selected"
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(tmp_path), "--no_save",
                           "--selection_methods", "training_domain",
                           "--export_selected", str(selected)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads((selected / "manifest.json").read_text())["entries"]
    assert entry["step"] == best_step and entry["model"] is not None
    assert (selected / entry["model"]).read_bytes() == (out / (
        "model.pkl" if best_step == records[-1]["step"] else "model_best.pkl")).read_bytes()
