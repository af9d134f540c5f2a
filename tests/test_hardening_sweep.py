"""Sweep hardening: a planted .lock or launcher.log symlink is never written through and
shows as a failed job with its reason; `sweep launch` checks every job's arguments before
launching any and creates no job directory when one is invalid."""
import functools
import os
import signal
import sys

import pytest

from domainbed.launch.jobs import (
    FAILED,
    LOCK_FILE,
    LOG_FILE,
    Command,
    job_state,
    last_error,
    run_command,
)
from domainbed.scripts import sweep
from tests.pooled_stand_in import write_done_or_die
from tests.test_sweep import fake_names, fake_train, flags, jobs_for  # noqa: F401

pytestmark = pytest.mark.usefixtures("fake_train")


@pytest.mark.parametrize("name", [LOCK_FILE, LOG_FILE])
def test_symlinked_job_file_is_never_written_through(tmp_path, capsys, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    job = jobs_for(tmp_path)[1]
    os.makedirs(job.output_dir)
    os.symlink(victim, os.path.join(job.output_dir, name))
    assert sweep.main(["launch"] + flags(tmp_path)) == 1
    assert victim.read_text() == "precious\n"
    assert not os.path.exists(os.path.join(job.output_dir, "done"))
    assert_status_fails_only(tmp_path, capsys, job,
                             f"{name} is a symbolic link; refusing to use it")


def assert_status_fails_only(tmp_path, capsys, job, reason):
    """`sweep status`: `job` failed with `reason` on its line, the two others done."""
    capsys.readouterr()
    sweep.main(["status"] + flags(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    failed = [line for line in lines if line.startswith("failed")]
    assert len(failed) == 1 and job.output_dir in failed[0] and reason in failed[0]
    assert sum(line.startswith("done") for line in lines) == 2


def test_fifo_lock_is_refused_without_blocking(tmp_path):
    job = jobs_for(tmp_path)[0]
    os.makedirs(job.output_dir)
    os.mkfifo(os.path.join(job.output_dir, LOG_FILE))
    outcome = run_command(job.command)
    assert outcome.failed
    assert "not a regular file" in last_error(job.output_dir)
    assert job_state(job.output_dir) == FAILED


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
    # checked once for the sweep, before any job (issue 40: every output option)
    assert "--output_dir" in err and "is a file, not a directory" in err
    assert len(err.strip().splitlines()) == 1
    assert out.read_text() == "not a directory\n"


# ------------------------------------------------------------ round 2: job folders
def _plant_job_folder_link(tmp_path, job):
    """The job's folder is a symlink to a victim folder holding one precious file."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "model.pkl").write_text("precious\n")
    os.symlink(victim, job.output_dir)
    return victim


@pytest.mark.parametrize("launcher", ["local", "pooled"])
def test_symlinked_job_folder_is_refused(tmp_path, capsys, launcher):
    job = jobs_for(tmp_path)[1]
    victim = _plant_job_folder_link(tmp_path, job)
    assert sweep.main(["launch"] + flags(tmp_path, launcher=launcher)) == 1
    assert sorted(os.listdir(victim)) == ["model.pkl"]
    assert (victim / "model.pkl").read_text() == "precious\n"
    assert_status_fails_only(tmp_path, capsys, job,
                             f"{job.output_dir} is a symbolic link; refusing to use it")


def test_delete_incomplete_refuses_a_symlinked_job_folder(tmp_path, capsys):
    from oodutils.errors import run_cli
    job = jobs_for(tmp_path)[0]
    victim = _plant_job_folder_link(tmp_path, job)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(sweep.main, ["delete_incomplete"] + flags(tmp_path))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "is a symbolic link, not a job folder" in err and "nothing deleted" in err
    assert os.path.islink(job.output_dir) and (victim / "model.pkl").exists()


def test_hard_linked_launcher_log_is_never_appended_to(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    job = jobs_for(tmp_path)[0]
    os.makedirs(job.output_dir)
    os.link(victim, os.path.join(job.output_dir, LOG_FILE))
    assert run_command(job.command).failed
    assert victim.read_text() == "precious\n"
    assert "launcher.log has other hard links" in last_error(job.output_dir)
    assert job_state(job.output_dir) == FAILED


@pytest.mark.parametrize("umask, expected", [(0o002, 0o664), (0o077, 0o600)])
def test_lock_and_launcher_log_honour_the_umask(tmp_path, umask, expected):
    job = jobs_for(tmp_path)[0]
    old = os.umask(umask)
    try:
        assert run_command(job.command).status == "ok"
    finally:
        os.umask(old)
    for name in (LOCK_FILE, LOG_FILE):
        assert os.stat(os.path.join(job.output_dir, name)).st_mode & 0o777 == expected


# ------------------------------------------------------------ round 2: the pooled launcher
def _pooled_commands(tmp_path, n):
    from domainbed.launch.pooled import TRAIN_MODULE
    outs = [str(tmp_path / f"job{i}") for i in range(n)]
    return [Command([sys.executable, "-m", TRAIN_MODULE, "--output_dir", out], out)
            for out in outs]


@pytest.fixture
def pooled_fake():
    from domainbed.launch import pooled
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(60)   # a hang fails the test instead of stopping the suite
    yield functools.partial(pooled.pooled_launcher, train=write_done_or_die)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _timeout(*_):
    raise TimeoutError("the pooled launcher hung")


@pytest.mark.parametrize("name", [LOCK_FILE, LOG_FILE])
def test_pooled_refuses_a_symlinked_job_file_and_runs_the_rest(tmp_path, pooled_fake, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    commands = _pooled_commands(tmp_path, 4)
    os.makedirs(commands[1].output_dir)
    os.symlink(victim, os.path.join(commands[1].output_dir, name))
    outcomes = pooled_fake(commands, max_workers=2, echo=lambda line: None)
    assert victim.read_text() == "precious\n"
    status = {o.output_dir: o.status for o in outcomes}
    assert status == {c.output_dir: "failed" if i == 1 else "ok"
                      for i, c in enumerate(commands)}
    assert f"{name} is a symbolic link" in last_error(commands[1].output_dir)


def test_pooled_worker_killed_fails_its_job_alone(tmp_path, pooled_fake):
    commands = _pooled_commands(tmp_path, 5)
    os.makedirs(commands[2].output_dir)
    open(os.path.join(commands[2].output_dir, "kill_me"), "w").close()
    outcomes = pooled_fake(commands, max_workers=2, echo=lambda line: None)
    by_dir = {o.output_dir: o for o in outcomes}
    assert len(outcomes) == 5
    for i, c in enumerate(commands):
        assert by_dir[c.output_dir].status == ("failed" if i == 2 else "ok")
    killed = commands[2].output_dir
    assert by_dir[killed].returncode == -signal.SIGKILL
    reason = last_error(killed)
    assert "pooled worker" in reason and f"killed by signal {int(signal.SIGKILL)}" in reason
    assert job_state(killed) == FAILED   # its lock died with it
