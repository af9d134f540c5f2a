"""Result tables say what they show (issue 43, item 6): a table of another metric than
accuracy names it in every format, one trial shows no invented `± 0.0` spread in our own
formats (text and LaTeX stay DomainBed's, byte for byte: tests/test_collect_results.py), and
X cells are explained."""
import json

import pytest

from domainbed.results import tables
from domainbed.scripts import collect_results
from tests.test_records import write_run


def one_trial_sweep(root):
    """One finished run of ERM on a 2-environment dataset, testing on env 0: env 1's cell
    is X; its NLL is in metrics.jsonl."""
    rec = {"args": {"dataset": "Toy", "algorithm": "ERM", "test_envs": [0], "trial_seed": 0,
                    "hparams_seed": 0}, "hparams": {}, "step": 5, "env0_in_acc": 0.5,
           "env0_out_acc": 0.5, "env1_in_acc": 0.7, "env1_out_acc": 0.6}
    run = write_run(root / "t0", [rec])
    (run / "metrics.jsonl").write_text(json.dumps({"step": 5, "env0_in_nll": 0.25}) + "\n")
    return root


def collect(root, capsys, *argv):
    collect_results.main(["--input_dir", str(root), "--no_save", "--selection_methods",
                          "training_domain", *argv])
    return capsys.readouterr()


@pytest.mark.parametrize("fmt", ["markdown", "html", "csv", "text", "latex"])
def test_a_metric_table_names_its_metric(tmp_path, capsys, fmt):
    out = collect(one_trial_sweep(tmp_path), capsys, "--metric", "nll", "--format", fmt).out
    if fmt == "csv":
        assert out.splitlines()[0].endswith(",n_trials,metric")
        assert {line.rsplit(",", 1)[1] for line in out.splitlines()[1:]} == {"nll"}
    else:
        assert "training-domain validation set, metric: nll (x100)" in out
    plain = collect(tmp_path, capsys, "--format", fmt).out
    assert "metric: " not in plain and ("accuracy" in plain) == (fmt == "csv")


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_one_trial_shows_no_spread_in_our_formats(tmp_path, capsys, fmt):
    out = collect(one_trial_sweep(tmp_path), capsys, "--format", fmt).out
    assert "50.0 (n=1)" in out and "±" not in out


def test_one_trial_has_no_stderr_in_csv_and_keeps_domainbeds_text(tmp_path, capsys):
    root = one_trial_sweep(tmp_path)
    rows = collect(root, capsys, "--format", "csv").out.splitlines()
    assert "training-domain validation set,Toy,ERM,0,0,50.0,,1,accuracy" in rows
    assert "50.0 +/- 0.0" in collect(root, capsys).out               # DomainBed's text
    assert "50.0 $\\pm$ 0.0" in collect(root, capsys, "--latex").out  # and LaTeX


def test_x_cells_are_explained(tmp_path, capsys):
    root = one_trial_sweep(tmp_path)
    shown = collect(root, capsys)
    assert "X" in shown.out and tables.MISSING_NOTE not in shown.out   # DomainBed's bytes
    assert shown.err.count(tables.MISSING_NOTE) == 1
    markdown = collect(root, capsys, "--format", "markdown")
    assert markdown.out.rstrip().endswith(tables.MISSING_NOTE + ".")
    assert tables.MISSING_NOTE in collect(root, capsys, "--format", "html").out


def small_zoo(root):
    """8 runs per Debug28 test environment (2 algorithms x 4 seeds), random accuracies:
    every accuracy-on-the-line fit has too few points, so each carries a warning."""
    import random
    rng = random.Random(0)
    for alg in ("ERM", "IRM"):
        for env in range(3):
            for seed in range(2):
                records = []
                for step in (0, 5):
                    r = {"args": {"dataset": "Debug28", "algorithm": alg, "test_envs": [env],
                                  "trial_seed": 0, "hparams_seed": seed}, "hparams": {},
                         "step": step}
                    for k in range(3):
                        acc = rng.uniform(0.4, 0.9)
                        r.update({f"env{k}_in_acc": acc, f"env{k}_out_acc": acc})
                    records.append(r)
                write_run(root / f"{alg}{env}{seed}", records)
    return root


def test_aotl_does_not_repeat_its_tables_warnings_on_stderr(tmp_path, capsys):
    from analysis.aotl import cli as aotl_cli
    aotl_cli.main([str(small_zoo(tmp_path / "zoo")), "--table", "per-ood", "--format", "markdown"])
    shown = capsys.readouterr()
    assert shown.out.count("the verdict means little") == 3          # one per fit, in the table
    assert shown.err.strip().splitlines() == [
        "warning: 3 of 3 fit(s) have too few points to mean much; see the warning column "
        "of the table"]


def test_aotl_study_says_each_warning_once(tmp_path, capsys):
    from analysis.aotl.study import analyse
    said = []
    analyse(str(small_zoo(tmp_path / "zoo")), str(tmp_path / "out"), "Debug28",
            oodselect_steps=0, log=said.append)
    everything = said + capsys.readouterr().err.splitlines()
    warnings = [line for line in everything if "the verdict means little" in line]
    assert len(warnings) == 3 and len(set(warnings)) == 3, warnings   # one per OOD env
