"""Sweep hardening: a planted .lock or launcher.log symlink is never written through and
shows as a failed job with its reason; `sweep launch` checks every job's arguments before
launching any and creates no job directory when one is invalid."""
import os

import pytest

from domainbed.launch import launchers
from domainbed.scripts import sweep
from tests.test_sweep import fake_names, fake_train, flags, jobs_for  # noqa: F401

pytestmark = pytest.mark.usefixtures("fake_train")


@pytest.mark.parametrize("name", [launchers.LOCK_FILE, launchers.LOG_FILE])
def test_symlinked_job_file_is_never_written_through(tmp_path, capsys, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    job = jobs_for(tmp_path)[1]
    os.makedirs(job.output_dir)
    os.symlink(victim, os.path.join(job.output_dir, name))
    assert sweep.main(["launch"] + flags(tmp_path)) == 1
    assert victim.read_text() == "precious\n"
    assert not os.path.exists(os.path.join(job.output_dir, "done"))
    capsys.readouterr()
    sweep.main(["status"] + flags(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    failed = [line for line in lines if line.startswith("failed")]
    assert len(failed) == 1 and job.output_dir in failed[0]
    assert f"{name} is a symbolic link; refusing to use it" in failed[0]
    assert sum(line.startswith("done") for line in lines) == 2


def test_fifo_lock_is_refused_without_blocking(tmp_path):
    job = jobs_for(tmp_path)[0]
    os.makedirs(job.output_dir)
    os.mkfifo(os.path.join(job.output_dir, launchers.LOG_FILE))
    outcome = launchers.run_command(job.command)
    assert outcome.failed
    assert "not a regular file" in launchers.last_error(job.output_dir)
    assert launchers.job_state(job.output_dir) == launchers.FAILED


@pytest.mark.parametrize("extra, message", [
    (("--steps", "0"), "--steps must be at least 1"),
    (("--checkpoint_freq", "0"), "--checkpoint_freq must be at least 1"),
    (("--hparams", '{"lr": "abc"}'), "hyperparameter 'lr' must be a number"),
    (("--hparams", '{"batch_size": 0}'), "hyperparameter 'batch_size' must be in [1, inf]"),
    (("--hparams", '{"lr": -0.1}'), "hyperparameter 'lr' must be in [0.0, inf]"),
    (("--hparams", '{"no_such_hparam": 1}'), "unknown hyperparameter 'no_such_hparam'"),
    (("--uda_holdout_fraction", "1.0"), "--uda_holdout_fraction must be in [0, 1)"),
    (("--num_threads", "-1"), "--num_threads must be 0"),
])
def test_launch_checks_every_job_before_launching_any(tmp_path, capsys, extra, message):
    from oodutils.errors import run_cli
    argv = ["launch"] + flags(tmp_path, *extra)
    argv[argv.index("--algorithms") + 1] = "ERM"  # declares the base hyperparameters
    with pytest.raises(SystemExit) as exit_info:
        run_cli(sweep.main, argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "nothing launched" in err
    assert len(err.strip().splitlines()) == 1
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no job directory


def test_launch_into_an_output_dir_that_is_a_file(tmp_path, capsys):
    from oodutils.errors import run_cli
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "sweep"
    out.write_text("not a directory\n")
    argv = ["launch"] + flags(data)
    argv[argv.index("--output_dir") + 1] = str(out)
    with pytest.raises(SystemExit):
        run_cli(sweep.main, argv)
    err = capsys.readouterr().err
    assert "which is a file" in err and "nothing launched" in err
    assert out.read_text() == "not a directory\n"
