"""Sweep and launchers: job construction (as DomainBed), states, launch / resume /
delete, launchers. Jobs run a tiny fake train script unless the real one is tested."""
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from domainbed.hparams import seed_hash
from domainbed.launch import launchers
from domainbed.launch import sweep as sweep_plan
from domainbed.launch.jobs import (
    DONE,
    FAILED,
    INTERRUPTED,
    LOCK_FILE,
    LOG_FILE,
    NOT_LAUNCHED,
    RUNNING,
    Command,
    is_running,
    job_state,
    last_error,
    run_command,
)
from domainbed.registry import ALGORITHMS, DATASETS
from domainbed.scripts import sweep
from oodutils.errors import UnknownNameError, UserError
from tests.requirements import need_package

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASET, ALGORITHM = "_SweepTest3", "_SweepTestAlg"

FAKE_TRAIN = textwrap.dedent("""
    import json, os, sys, time
    argv = sys.argv[1:]
    out = argv[argv.index("--output_dir") + 1]
    test_env = argv[argv.index("--test_envs") + 1]

    def parent_name():
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                return f.read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            return ""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "runs.txt"), "a") as f:
        f.write(json.dumps({"argv": argv,
                            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "parent": parent_name()}) + "\\n")
    print("training", out)
    if os.environ.get("FAKE_FAIL_ENV") == test_env:
        with open(os.path.join(out, "err.txt"), "w") as f:
            f.write("Traceback (most recent call last):\\nValueError: boom\\n")
        sys.exit(3)
    if os.environ.get("FAKE_HANG_ENV") == test_env:
        time.sleep(120)
    open(os.path.join(out, "done"), "w").close()
""")


@pytest.fixture
def fake_names():
    """A registered 3-env dataset and an algorithm, removed afterwards."""
    class Data:
        ENVIRONMENTS = ["a", "b", "c"]

    class Alg:
        pass
    DATASETS._load()
    ALGORITHMS._load()
    DATASETS.register(DATASET)(Data)
    ALGORITHMS.register(ALGORITHM)(Alg)
    yield
    DATASETS._classes.pop(DATASET, None)
    ALGORITHMS._classes.pop(ALGORITHM, None)


@pytest.fixture
def fake_train(tmp_path, monkeypatch, fake_names):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(sweep_plan, "TRAIN_COMMAND", [sys.executable, str(script)])
    monkeypatch.delenv("FAKE_FAIL_ENV", raising=False)
    monkeypatch.delenv("FAKE_HANG_ENV", raising=False)
    return [sys.executable, str(script)]


def flags(out, *extra, launcher="local"):
    return ["--datasets", DATASET, "--algorithms", ALGORITHM, "--data_dir", str(out),
            "--output_dir", str(out), "--command_launcher", launcher, "--n_trials", "1",
            "--n_hparams", "1", "--single_test_envs", "--skip_confirmation", *extra]


def jobs_for(out, *extra):
    args = sweep.build_parser().parse_args(["status"] + flags(out, *extra))
    args_list = sweep_plan.make_args_list(
        args.n_trials, args.datasets, args.algorithms, args.n_hparams_from, args.n_hparams,
        args.steps, args.data_dir, args.task, args.holdout_fraction, args.single_test_envs,
        args.hparams, {n: getattr(args, n) for n in sweep.PASS_THROUGH})
    return [sweep_plan.Job(a, str(out)) for a in args_list]


def runs(job):
    path = os.path.join(job.output_dir, "runs.txt")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path)]


# ------------------------------------------------------------------ job construction
def test_make_args_list_matches_domainbed(fake_names):
    args_list = sweep_plan.make_args_list(
        n_trials=2, dataset_names=[DATASET], algorithms=[ALGORITHM], n_hparams_from=0,
        n_hparams=2, steps=None, data_dir="/d", task="domain_generalization",
        holdout_fraction=0.2, single_test_envs=False, hparams=None)
    assert len(args_list) == 2 * 6 * 2
    envs = [a["test_envs"] for a in args_list if a["trial_seed"] == 0 and
            a["hparams_seed"] == 0]
    assert envs == [[0], [0, 1], [0, 2], [1], [1, 2], [2]]
    first = args_list[0]
    assert first == {"dataset": DATASET, "algorithm": ALGORITHM, "test_envs": [0],
                     "holdout_fraction": 0.2, "hparams_seed": 0, "data_dir": "/d",
                     "task": "domain_generalization", "trial_seed": 0,
                     "seed": seed_hash(DATASET, ALGORITHM, [0], 0, 0)}
    job = sweep_plan.Job(first, "/sweep")
    digest = hashlib.md5(json.dumps(first, sort_keys=True).encode()).hexdigest()
    assert job.output_dir == os.path.join("/sweep", digest)
    assert job.state == NOT_LAUNCHED


def test_unset_pass_through_flags_keep_domainbed_hashes(tmp_path, fake_names):
    plain = jobs_for(tmp_path)
    extra = jobs_for(tmp_path, "--steps", "5", "--hparams", '{"lr": 0.1}',
                     "--data_seed", "3", "--save_logits")
    assert "data_seed" not in plain[0].train_args and "save_logits" not in plain[0].argv
    assert {j.output_dir for j in plain}.isdisjoint(j.output_dir for j in extra)
    argv = extra[0].argv
    assert argv[:len(sweep_plan.TRAIN_COMMAND)] == sweep_plan.TRAIN_COMMAND
    assert argv[argv.index("--hparams") + 1] == '{"lr": 0.1}'
    assert argv[argv.index("--data_seed") + 1] == "3"
    assert "--save_logits" in argv and argv[argv.index("--save_logits") + 1].startswith("--")
    assert argv[argv.index("--output_dir") + 1] == extra[0].output_dir


def test_train_argv_lists_and_flags():
    assert sweep_plan.train_argv({"test_envs": [0, 2], "b": True, "c": False, "d": None,
                             "e": "a b"}) == ["--b", "--e", "a b", "--test_envs", "0", "2"]


def test_two_env_dataset_gets_no_pairs():
    assert list(sweep_plan.all_test_env_combinations(2)) == [[0], [1]]


# ------------------------------------------------------------------ user errors
def test_unknown_names_list_valid_ones(tmp_path, fake_names):
    with pytest.raises(UnknownNameError, match=DATASET):
        sweep.main(["status"] + flags(tmp_path)[2:] + ["--datasets", "NoSuchData"])
    with pytest.raises(UnknownNameError, match="valid algorithms: .*" + ALGORITHM):
        sweep.main(["status", "--algorithms", "NoSuchAlg"] + flags(tmp_path)[:2] +
                   flags(tmp_path)[4:])
    with pytest.raises(UnknownNameError, match="dummy, fused, local"):
        sweep.main(["status"] + flags(tmp_path, launcher="nope"))


def test_cli_error_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.sweep", "status", "--datasets", "NoSuch",
         "--algorithms", "ERM", "--data_dir", "/d", "--output_dir", str(tmp_path),
         "--command_launcher", "dummy"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown dataset 'NoSuch'"), proc.stderr


@pytest.mark.parametrize("extra,match", [
    (["--hparams", "{bad"], "not valid JSON"), (["--hparams", "[1]"], "JSON object"),
    (["--max_workers", "0"], "max_workers"), (["--n_hparams", "0"], "n_hparams")])
def test_bad_flags(tmp_path, fake_names, extra, match):
    with pytest.raises(UserError, match=match):
        sweep.main(["status"] + flags(tmp_path, *extra))


def test_missing_data_dir_fails_before_launching(tmp_path, fake_names):
    with pytest.raises(UserError, match="data directory"):
        sweep.main(["launch"] + flags(tmp_path, "--data_dir", str(tmp_path / "nope")))
    assert os.listdir(tmp_path) == []


def test_confirmation_without_terminal_requires_skip(tmp_path, fake_train, monkeypatch):
    argv = [a for a in flags(tmp_path) if a != "--skip_confirmation"]
    with pytest.raises(UserError, match="--skip_confirmation"):
        sweep.main(["launch"] + argv)
    assert not any(os.path.exists(j.output_dir) for j in jobs_for(tmp_path))

    class TTY:
        closed = False

        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stdin", TTY())
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert sweep.main(["launch"] + argv) == 0
    assert not any(os.path.exists(j.output_dir) for j in jobs_for(tmp_path))


# ------------------------------------------------------------------ launchers
def test_dummy_launcher_prints_and_runs_nothing(tmp_path, fake_train, capsys):
    assert sweep.main(["launch"] + flags(tmp_path, launcher="dummy")) == 0
    out = capsys.readouterr().out
    assert out.count("Dummy launcher: ") == 3
    assert "--test_envs 0" in out and "--output_dir" in out
    assert not any(os.path.exists(j.output_dir) for j in jobs_for(tmp_path))


def test_local_launcher_two_workers_then_status_done(tmp_path, fake_train, capsys):
    assert sweep.main(["launch"] + flags(tmp_path, "--max_workers", "2")) == 0
    jobs = jobs_for(tmp_path)
    assert [j.state for j in jobs] == [DONE] * 3
    for j in jobs:
        log = open(os.path.join(j.output_dir, LOG_FILE)).read()
        assert "training" in log and "exit code 0" in log
        assert len(runs(j)) == 1
    capsys.readouterr()
    sweep.main(["status"] + flags(tmp_path))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("done ") for line in lines[:3])
    assert lines[3] == ("3 jobs: 3 done, 0 running, 0 failed/incomplete, 0 interrupted, "
                        "0 not launched.")


def test_failed_job_status_shows_last_error(tmp_path, fake_train, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FAIL_ENV", "1")
    assert sweep.main(["launch"] + flags(tmp_path)) == 1
    capsys.readouterr()
    sweep.main(["status"] + flags(tmp_path))
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and "test_envs=[1]" in failed[0]
    assert failed[0].endswith("ValueError: boom (exit code 3)")


def test_relaunch_resumes_incomplete_and_leaves_done_alone(tmp_path, fake_train,
                                                           monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_ENV", "2")
    sweep.main(["launch"] + flags(tmp_path))
    jobs = jobs_for(tmp_path)
    states = [j.state for j in jobs]
    assert states == [DONE, DONE, FAILED]
    done_mtimes = [os.stat(os.path.join(j.output_dir, "done")).st_mtime_ns
                   for j in jobs[:2]]
    monkeypatch.delenv("FAKE_FAIL_ENV")
    assert sweep.main(["launch"] + flags(tmp_path)) == 0
    jobs = jobs_for(tmp_path)
    assert [j.state for j in jobs] == [DONE] * 3
    assert [len(runs(j)) for j in jobs] == [1, 1, 2]   # resumed in the same directory
    assert done_mtimes == [os.stat(os.path.join(j.output_dir, "done")).st_mtime_ns
                           for j in jobs[:2]]


def test_running_job_is_left_alone(tmp_path, fake_train, capsys):
    job = jobs_for(tmp_path)[0]
    os.makedirs(job.output_dir)
    fd = os.open(os.path.join(job.output_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert jobs_for(tmp_path)[0].state == RUNNING
        assert sweep.main(["delete_incomplete"] + flags(tmp_path)) == 0
        assert os.path.isdir(job.output_dir)
        assert sweep.main(["launch"] + flags(tmp_path)) == 0
        assert "Leaving alone 1 jobs" in capsys.readouterr().out
        assert runs(job) == [] and jobs_for(tmp_path)[0].state == RUNNING
        # a launcher handed the job anyway skips it
        outcome = run_command(job.command)
        assert outcome.status == "skipped_running"
    finally:
        os.close(fd)
    assert jobs_for(tmp_path)[0].state == FAILED   # incomplete, no live lock


def test_delete_incomplete_and_delete_all(tmp_path, fake_train, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL_ENV", "0")
    sweep.main(["launch"] + flags(tmp_path))
    jobs = jobs_for(tmp_path)
    assert [j.state for j in jobs] == [FAILED, DONE, DONE]
    other = tmp_path / "not_a_job"
    other.mkdir()
    assert sweep.main(["delete_incomplete"] + flags(tmp_path)) == 0
    assert [j.refresh() for j in jobs] == [NOT_LAUNCHED] + [DONE] * 2
    assert sweep.main(["delete_all"] + flags(tmp_path)) == 0
    assert [j.refresh() for j in jobs] == [NOT_LAUNCHED] * 3
    assert other.is_dir()


def test_sigkill_of_sweep_then_relaunch(tmp_path, fake_train):
    """Kill the sweep mid-way: the orphaned job still counts as running while it lives,
    as interrupted once it is killed (no exit line, no err.txt); `launch` then resumes
    it and runs the rest."""
    code = textwrap.dedent(f"""
        import sys
        from domainbed.registry import register_algorithm, register_dataset
        import domainbed.scripts.sweep as s
        import domainbed.launch.sweep as plan
        register_dataset({DATASET!r})(type("D", (), {{"ENVIRONMENTS": ["a", "b", "c"]}}))
        register_algorithm({ALGORITHM!r})(type("A", (), {{}}))
        plan.TRAIN_COMMAND = {fake_train!r}
        sys.exit(s.main(sys.argv[1:]))
    """)
    argv = [sys.executable, "-c", code, "launch"] + flags(tmp_path)
    env = dict(os.environ, FAKE_HANG_ENV="1")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    jobs = jobs_for(tmp_path)
    hung = jobs[1]
    lock = os.path.join(hung.output_dir, LOCK_FILE)
    child = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not runs(hung):
            time.sleep(0.1)
        assert runs(hung), "the hanging job never started"
        proc.kill()
        proc.wait()
        child = int(open(lock).read())
        assert jobs_for(tmp_path)[1].state == RUNNING
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child is not None:
            os.kill(child, signal.SIGKILL)
    deadline = time.time() + 10
    while time.time() < deadline and is_running(hung.output_dir):
        time.sleep(0.1)
    states = [j.refresh() for j in jobs]
    assert states[1] == INTERRUPTED
    assert sweep.main(["launch"] + flags(tmp_path)) == 0
    assert [j.refresh() for j in jobs] == [DONE] * 3
    assert len(runs(hung)) == 2


def test_multi_gpu_one_job_per_gpu(tmp_path, fake_train, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,")
    assert sweep.main(["launch"] + flags(tmp_path, launcher="multi_gpu")) == 0
    seen = {runs(j)[0]["cuda"] for j in jobs_for(tmp_path)}
    assert seen <= {"3", "5"} and seen
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UserError, match="no GPU"):
        launchers.get_launcher("multi_gpu")([])


def test_multi_gpu_gives_each_job_its_gpus_and_distributed(tmp_path, fake_train,
                                                            monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7,9,11")
    monkeypatch.setattr("domainbed.launch.sweep.check_job", lambda argv, checked: None)
    assert sweep.main(["launch"] + flags(tmp_path, "--gpus_per_job", "2",
                                         launcher="multi_gpu")) == 0
    jobs = jobs_for(tmp_path)
    seen = [runs(j)[0] for j in jobs]
    assert {r["cuda"] for r in seen} <= {"3,5", "7,9"}   # GPU 11 makes no pair: unused
    assert all(r["argv"][-2:] == ["--distributed", "2"] for r in seen)
    assert all(j.refresh() == DONE for j in jobs)   # same jobs: same hashes
    with pytest.raises(UserError, match="between 1 and the 5 visible"):
        launchers.get_launcher("multi_gpu")([], gpus_per_job=6)


def test_multi_gpu_refuses_data_parallel_jobs_that_do_not_split(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    argv = ["launch", "--datasets", "ColoredMNIST", "--algorithms", "IRM", "--data_dir",
            str(tmp_path), "--output_dir", str(tmp_path / "sweep"), "--command_launcher",
            "multi_gpu", "--gpus_per_job", "2", "--n_trials", "1", "--n_hparams", "1",
            "--single_test_envs", "--skip_confirmation"]
    with pytest.raises(UserError, match="IRM's update is not a mean over examples.*"
                                        "nothing launched"):
        sweep.main(argv)
    assert not any(p.name != "sweep" for p in tmp_path.iterdir())


@pytest.mark.parametrize("name,module", [("slurm", "submitit"), ("ray", "ray")])
def test_optional_launchers_need_their_package(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)   # import raises ImportError
    needs_extra = rf"{module} is not installed.*pip install 'oodbed\[cluster\]'"
    with pytest.raises(UserError, match=needs_extra):
        launchers.get_launcher(name)([Command(["true"], "/nonexistent")])


FAKE_SBATCH = textwrap.dedent("""
    import os, re, subprocess, sys
    script = sys.argv[-1]
    text = open(script).read()
    with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
        f.write(text + "\\n")
    array = re.search(r"^#SBATCH --array=0-(\\d+)%(\\d+)$", text, re.M)
    # Slurm runs a copy taken at submission: the submitter may move its file afterwards
    # (submitit 1.5.0 does; later releases leave a symlink)
    spool = os.path.join(os.path.dirname(os.environ["FAKE_SLURM_LOG"]),
                         "spool_" + os.path.basename(script))
    with open(spool, "w") as f:
        f.write(text)
    runner = (
        "import os, subprocess, sys\\n"
        "for i in range(int(sys.argv[1])):\\n"
        "    env = dict(os.environ, SLURM_JOB_ID=str(5000 + i), SLURM_ARRAY_JOB_ID='4242',\\n"
        "               SLURM_ARRAY_TASK_ID=str(i), SLURM_NTASKS='1', SLURM_PROCID='0',\\n"
        "               SLURM_LOCALID='0', SLURM_NODEID='0', SLURM_JOB_NUM_NODES='1',\\n"
        "               SLURM_JOB_NODELIST='localhost')\\n"
        "    subprocess.run(['bash', sys.argv[2]], env=env)\\n")
    # The queue runs the tasks later, detached from the submitting process.
    subprocess.Popen([sys.executable, "-c", runner, str(int(array.group(1)) + 1), spool],
                     start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    print("Submitted batch job 4242")
""")

FAKE_SRUN = textwrap.dedent("""
    import os, sys
    args = sys.argv[1:]
    out = None
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            path = args.pop(0).replace("%A", os.environ["SLURM_ARRAY_JOB_ID"])
            out = path.replace("%a", os.environ["SLURM_ARRAY_TASK_ID"])
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.execvp(args[0], args)
""")


def _fake_slurm(tmp_path, monkeypatch):
    """`sbatch` and `srun` on PATH that run submitit's array tasks on this machine with the
    environment Slurm gives them, so the real submitit code path is exercised."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN)):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + body)
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "sbatch_scripts.txt"))
    return tmp_path / "sbatch_scripts.txt"


def test_slurm_launcher_submits_an_array_that_runs_every_job(tmp_path, fake_train, monkeypatch,
                                                             capsys):
    need_package("submitit")
    submitted = _fake_slurm(tmp_path, monkeypatch)
    out = tmp_path / "sweep"
    assert sweep.main(["launch"] + flags(out, "--slurm_partition", "debugq",
                                         "--slurm_cpus", "3", "--slurm_array_parallelism", "2",
                                         launcher="slurm")) == 0
    assert "Submitted 3 Slurm jobs (array 4242)" in capsys.readouterr().out
    script = submitted.read_text()
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --partition=debugq",
                 "#SBATCH --cpus-per-task=3", "#SBATCH --gpus-per-node=1"):
        assert line in script
    import submitit
    tasks = [submitit.SlurmJob(out / ".submitit", f"4242_{i}") for i in range(3)]
    deadline = time.time() + 120
    while time.time() < deadline and not all(t.paths.result_pickle.exists() for t in tasks):
        time.sleep(0.5)
    # (submitit's results() would wait forever for a task that never ran)
    assert all(t.paths.result_pickle.exists() for t in tasks), "an array task never ran"
    # submitit recorded each task's result: the Outcome our job runner returned.
    outcomes = [t.results()[0] for t in tasks]
    assert [(o.status, o.returncode) for o in outcomes] == [("ok", 0)] * 3
    jobs = jobs_for(out)
    assert sorted(o.output_dir for o in outcomes) == sorted(j.output_dir for j in jobs)
    assert [job_state(j.output_dir) for j in jobs] == [DONE] * 3
    assert sorted(runs(j)[0]["argv"][runs(j)[0]["argv"].index("--test_envs") + 1]
                  for j in jobs) == ["0", "1", "2"]


def test_ray_launcher_runs_every_job_as_a_ray_task(tmp_path, fake_train, capsys):
    ray = need_package("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert sweep.main(["launch"] + flags(tmp_path, launcher="ray")) == 0
    finally:
        ray.shutdown()
    jobs = jobs_for(tmp_path)
    assert [job_state(j.output_dir) for j in jobs] == [DONE] * 3
    for job in jobs:
        (run,) = runs(job)
        assert "ray::" in run["parent"], run["parent"]   # started by a Ray worker
    assert capsys.readouterr().out.count("Done:") == 3


def test_slurm_launcher_without_sbatch_is_a_clear_error(tmp_path, monkeypatch):
    need_package("submitit")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="no 'sbatch' on PATH"):
        launchers.get_launcher("slurm")([Command(["true"], str(tmp_path / "j"))])


def test_launcher_registry():
    assert {"dummy", "local", "multi_gpu", "slurm", "ray"} <= set(launchers.LAUNCHERS)
    with pytest.raises(UnknownNameError, match="valid command launchers"):
        launchers.get_launcher("nope")


def test_missing_executable_is_a_failed_job(tmp_path):
    cmd = Command([str(tmp_path / "no-such-program")], str(tmp_path / "job"))
    outcome = run_command(cmd)
    assert outcome.failed and outcome.returncode == 127
    assert job_state(cmd.output_dir) == FAILED
    assert "exit code 127" in last_error(cmd.output_dir)


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_end_to_end_debug28_local_sweep_and_relaunch(tmp_path):
    """The real train script: a tiny sweep with 2 local workers, then one job made
    incomplete again is completed by a relaunch; finished jobs are not touched."""
    data, out = tmp_path / "data", tmp_path / "sweep"
    data.mkdir()
    argv = ["--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", str(data),
            "--output_dir", str(out), "--command_launcher", "local", "--steps", "5",
            "--n_trials", "1", "--n_hparams", "1", "--single_test_envs",
            "--skip_confirmation", "--num_threads", "1"]

    def cli(command, *extra):
        return subprocess.run([sys.executable, "-m", "domainbed.scripts.sweep", command,
                               *argv, *extra], capture_output=True, text=True, cwd=REPO)

    launched = cli("launch", "--max_workers", "2")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    status = cli("status")
    lines = status.stdout.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("done ") for line in lines[:3]), lines
    assert lines[3].startswith("3 jobs: 3 done")
    dirs = sorted(line.split()[1] for line in lines[:3])
    for d in dirs:
        assert len(open(os.path.join(d, "results.jsonl")).read().splitlines()) >= 1

    os.remove(os.path.join(dirs[0], "done"))   # as if the sweep was killed mid-job
    mtimes = {d: os.stat(os.path.join(d, "done")).st_mtime_ns for d in dirs[1:]}
    assert job_state(dirs[0]) == FAILED
    relaunched = cli("launch")
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert "Launching 1 jobs (1 to resume, 0 new)" in relaunched.stdout
    assert cli("status").stdout.strip().splitlines()[-1].startswith("3 jobs: 3 done")
    assert mtimes == {d: os.stat(os.path.join(d, "done")).st_mtime_ns for d in dirs[1:]}
