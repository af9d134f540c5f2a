"""SubpopBench's model selection (best val worst-group accuracy) in collect_results."""
import json

import pytest

from domainbed.results import model_selection as ms
from domainbed.scripts import collect_results

ENV_NAMES = ["train", "val", "test"]


def record(algorithm, hparams_seed, trial_seed, step, val_wga, test_wga, test_acc):
    return {
        "args": {"dataset": "Waterbirds", "algorithm": algorithm, "trial_seed": trial_seed,
                 "hparams_seed": hparams_seed, "test_envs": [1, 2], "env_names": ENV_NAMES,
                 "data_source": "w", "data_fingerprint": "f", "data_seed": 0,
                 "precision": "fp32"},
        "hparams": {"lr": hparams_seed}, "step": step,
        "env0_in_acc": 0.9, "env0_out_acc": 0.9, "env0_in_wga": 0.5, "env0_out_wga": 0.5,
        "env1_in_acc": 0.8, "env1_out_acc": 0.8, "env1_in_wga": val_wga, "env1_out_wga": 0.1,
        "env2_in_acc": test_acc, "env2_out_acc": 0.7, "env2_in_wga": test_wga,
        "env2_out_wga": 0.1, "env1_in_acc_g0": 0.8, "env2_in_acc_g0": 0.7,
    }


def write_run(path, records):
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "done").write_text("done\n")


@pytest.fixture
def sweep(tmp_path):
    for trial in (0, 1):
        # hparams 1: best val wga at step 2 (test wga .60); hparams 2: lower val wga
        write_run(tmp_path / f"erm_h1_t{trial}", [
            record("ERM", 1, trial, 0, 0.30, 0.90, 0.91),
            record("ERM", 1, trial, 2, 0.70, 0.60, 0.85)])
        write_run(tmp_path / f"erm_h2_t{trial}", [
            record("ERM", 2, trial, 0, 0.50, 0.95, 0.97)])
        write_run(tmp_path / f"dro_h1_t{trial}", [
            record("GroupDRO", 1, trial, 0, 0.65, 0.70 + 0.1 * trial, 0.80)])
    return tmp_path


def test_selects_best_val_worst_group(sweep):
    from domainbed.results.records import load_records
    records = load_records([str(sweep)], quiet=True).records
    table = ms.select(records, ms.ValWorstGroupSelectionMethod)
    assert set(table["test_env"]) == {2}  # one row per run, for the test env
    erm = table[table["algorithm"] == "ERM"]
    assert list(erm["test_acc"]) == [0.60, 0.60] and list(erm["step"]) == [2, 2]
    assert list(erm["test_avg_acc"]) == [0.85, 0.85] and list(erm["val_acc"]) == [0.7, 0.7]
    # the existing methods keep their columns
    assert "test_avg_acc" not in ms.select(records, ms.OracleSelectionMethod).columns


def test_collect_results_section(sweep, capsys):
    collect_results.main(["--input_dir", str(sweep), "--no_save", "--format", "csv"])
    out = capsys.readouterr().out
    rows = [line.split(",") for line in out.splitlines()]
    mine = [r for r in rows if r[0] == ms.ValWorstGroupSelectionMethod.name]
    cell = {(r[1], r[2], r[3]): r[5] for r in mine}
    assert float(cell[("Test worst-group accuracy", "ERM", "Waterbirds")]) == pytest.approx(60)
    assert float(cell[("Test worst-group accuracy", "GroupDRO", "Waterbirds")]) == \
        pytest.approx(75)
    assert float(cell[("Test average accuracy", "ERM", "Waterbirds")]) == pytest.approx(85)
    assert ms.get_selection_method("subpopbench") is ms.ValWorstGroupSelectionMethod


def test_explicit_method_without_such_datasets_warns(tmp_path, capsys):
    rec = record("ERM", 1, 0, 0, 0.3, 0.3, 0.3)
    rec["args"]["env_names"] = ["a", "b", "c"]
    write_run(tmp_path / "r", [rec])
    collect_results.main(["--input_dir", str(tmp_path), "--no_save",
                          "--selection_methods", "val_worst_group"])
    assert "no val_worst_group tables" in capsys.readouterr().err


def test_sweep_uses_the_datasets_default_test_envs():
    from domainbed.launch.sweep import make_args_list
    for single in (False, True):
        jobs = make_args_list(1, ["Waterbirds", "CivilComments"], ["ERM"], 0, 1, None,
                              "/data", "domain_generalization", 0.2, single, None)
        assert [j["test_envs"] for j in jobs] == [[1, 2], [1, 2]]
    jobs = make_args_list(1, ["VLCS"], ["ERM"], 0, 1, None, "/data",
                          "domain_generalization", 0.2, True, None)
    assert [j["test_envs"] for j in jobs] == [[0], [1], [2], [3]]


def test_validity_selects_with_val_worst_group(sweep):
    from analysis.validity import records as VR
    from domainbed.results.records import load_records
    results = VR.group_results(load_records([str(sweep)], quiet=True).records)
    assert set(results["benchmark"]) == {"Waterbirds"}  # one benchmark: its test env
    erm = results[results["method"] == "ERM"]
    assert set(erm["test_wga"]) == {0.60} and set(erm["test_env"]) == {2}
