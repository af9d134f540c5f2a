"""Experiment trackers (`train --tracker`): what TensorBoard's event files and MLflow's store
hold is read back with their own readers; W&B goes through the same code path with a fake
module (and, slow, through the real package offline); a failing or missing tracker is one
warning line, never a stopped run; plug-ins arrive through `domainbed.trackers`."""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from domainbed.training import trackers
from tests.hardening_util import wait_for
from tests.requirements import need_package

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPARAMS = {"lr": 0.001, "batch_size": 32, "arch": "mnist_cnn"}
ARGS = {"dataset": "Debug28", "algorithm": "ERM", "test_envs": [0], "hparams_seed": 0,
        "trial_seed": 1}
RECORDS = [  # as results.jsonl holds them: numbers, NaN for an empty split, args, hparams
    {"step": 0, "epoch": 0.0, "loss": 0.69, "env0_in_acc": 0.5, "env1_out_acc": float("nan"),
     "args": ARGS, "hparams": HPARAMS},
    {"step": 2, "epoch": 1.5, "loss": 0.25, "env0_in_acc": 0.75, "env1_out_acc": 0.625,
     "args": ARGS, "hparams": HPARAMS},
]


def tracked_run(tmp_path, identity="abc123", uri=""):
    return trackers.TrackedRun(str(tmp_path / "run"), "ERM Debug28", HPARAMS, ARGS,
                               identity, uri)


def log_all(names, run, warnings):
    opened = trackers.open_trackers(names, run, warn=warnings.append)
    for record in RECORDS:
        opened.log_checkpoint(record["step"], record)
    opened.close()
    return opened


def test_tensorboard_event_files_hold_every_checkpoint(tmp_path):
    need_package("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    warnings = []
    log_all(["tensorboard"], tracked_run(tmp_path), warnings)
    assert warnings == []
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"loss", "env0_in_acc", "epoch", "env1_out_acc"} <= set(scalars)
    assert [(e.step, e.value) for e in events.Scalars("env0_in_acc")] == [(0, 0.5), (2, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("env1_out_acc")] == [(2, 0.625)]
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode()
             for tag in events.Tags()["tensors"] if tag.endswith("text_summary")}
    assert json.loads(texts["hparams/text_summary"]) == HPARAMS
    assert json.loads(texts["args/text_summary"])["dataset"] == "Debug28"


def test_mlflow_file_store_holds_params_and_metrics(tmp_path, monkeypatch):
    need_package("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient
    warnings = []
    opened = log_all(["mlflow"], tracked_run(tmp_path), warnings)
    assert warnings == [] and opened.trackers == []
    store = tmp_path / "run" / "mlruns"
    assert store.is_dir()   # the default: a local file store in the run directory
    client = MlflowClient(tracking_uri="file:" + str(store))
    experiment = client.get_experiment_by_name("domainbed")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.params["hparams.lr"] == "0.001"
    assert run.data.params["hparams.arch"] == "mnist_cnn"
    assert run.data.params["args.test_envs"] == "[0]"
    assert run.data.tags["domainbed.identity"] == "abc123"
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "env0_in_acc")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (2, 0.75)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "env1_out_acc")] == [2]


def test_mlflow_resumed_run_continues_its_run_and_tracker_uri_gathers(tmp_path, monkeypatch):
    need_package("mlflow")
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = "file:" + str(tmp_path / "sweep_mlruns")
    first = trackers.open_trackers(["mlflow"], tracked_run(tmp_path, uri=uri), warn=print)
    first.log_checkpoint(0, RECORDS[0])   # killed here: never closed
    again = trackers.open_trackers(["mlflow"], tracked_run(tmp_path, uri=uri), warn=print)
    again.log_checkpoint(2, RECORDS[1])
    again.close()
    other = trackers.open_trackers(["mlflow"], tracked_run(tmp_path, "other", uri), warn=print)
    other.close()
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("domainbed").experiment_id])
    assert sorted(r.data.tags["domainbed.identity"] for r in runs) == ["abc123", "other"]
    [resumed] = [r for r in runs if r.data.tags["domainbed.identity"] == "abc123"]
    steps = [m.step for m in client.get_metric_history(resumed.info.run_id, "env0_in_acc")]
    assert sorted(steps) == [0, 2]
    assert not (tmp_path / "run" / "mlruns").exists()


class FakeWandb(types.ModuleType):
    """The part of the wandb module the tracker uses, recording every call."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        fake = self

        class Run:
            def log(self, values, step):
                fake.calls.append(("log", step, dict(values)))

            def finish(self):
                fake.calls.append(("finish",))
        return Run()


def test_wandb_receives_config_and_checkpoints(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    warnings = []
    log_all(["wandb"], tracked_run(tmp_path), warnings)
    assert warnings == []
    (kind, init), *rest = fake.calls
    assert kind == "init" and init["config"] == {"hparams": HPARAMS, "args": ARGS}
    assert init["dir"] == str(tmp_path / "run") and init["resume"] == "allow"
    assert len(init["id"]) == 16
    assert rest == [("log", 0, {"epoch": 0.0, "loss": 0.69, "env0_in_acc": 0.5}),
                    ("log", 2, {"epoch": 1.5, "loss": 0.25, "env0_in_acc": 0.75,
                                "env1_out_acc": 0.625}),
                    ("finish",)]


@pytest.mark.slow
def test_wandb_offline_writes_its_run_file(tmp_path, monkeypatch):
    need_package("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    warnings = []
    log_all(["wandb"], tracked_run(tmp_path), warnings)
    assert warnings == []
    [run_file] = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    # wandb's own service process writes the file; on a loaded machine it may still be
    # flushing when finish() returns (seen: only the 7-byte header at load 8)
    wait_for(lambda: b"env0_in_acc" in run_file.read_bytes(), "wandb's run file", timeout=120)


def test_missing_package_is_one_warning(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)   # import mlflow raises ImportError
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    warnings = []
    opened = log_all(["mlflow"], tracked_run(tmp_path), warnings)
    assert opened.trackers == []
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: tracker mlflow needs the mlflow package")
    assert "oodbed[trackers]" in warnings[0]


def test_failing_tracker_is_dropped_after_one_warning(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)

    class Broken(trackers.Tracker):
        def log_checkpoint(self, step, values):
            raise OSError(28, "No space left on device")
    monkeypatch.setitem(trackers.TRACKERS._classes, "broken", Broken)
    warnings = []
    opened = log_all(["broken", "wandb"], tracked_run(tmp_path), warnings)
    assert warnings == ["warning: tracker broken failed to log a checkpoint (OSError: "
                        "[Errno 28] No space left on device); the run goes on without it"]
    assert [c[0] for c in fake.calls] == ["init", "log", "log", "finish"]   # others go on
    assert opened.trackers == []


def test_record_values_sent_are_the_finite_numbers():
    values = trackers.numeric_values({**RECORDS[0], "stage": "stage1", "flag": True})
    assert values == {"epoch": 0.0, "loss": 0.69, "env0_in_acc": 0.5}


def test_unknown_tracker_is_one_error_line_before_training(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
         "--output_dir", str(tmp_path / "run"), "--tracker", "tensorboard", "neptune"],
        capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown tracker 'neptune'; valid trackers: mlflow, tensorboard, wandb"]
    assert not (tmp_path / "run").exists()


def test_tracker_option_repeats_and_is_not_run_identity():
    from domainbed.launch.sweep import Job
    from domainbed.training.config import RunConfig
    from domainbed.training.resume import args_identity
    config = RunConfig.from_argv(["--tracker", "mlflow", "--tracker", "tensorboard", "wandb"])
    assert config.trackers == ["mlflow", "tensorboard", "wandb"]
    assert RunConfig.from_argv([]).trackers == []
    plain = {**RunConfig().to_dict(), "trackers": []}
    assert args_identity(plain) == args_identity({**plain, "trackers": ["mlflow"]})
    job_args = {"dataset": "Debug28", "algorithm": "ERM", "test_envs": [0]}
    with_tracker = Job({**job_args, "tracker": ["mlflow"], "tracker_uri": "file:/x"}, "/s")
    assert with_tracker.output_dir == Job(job_args, "/s").output_dir
    argv = with_tracker.argv
    assert argv[argv.index("--tracker") + 1] == "mlflow"
    assert argv[argv.index("--tracker_uri") + 1] == "file:/x"


def test_sweep_passes_trackers_through(tmp_path):
    from domainbed.scripts import sweep
    args = sweep.build_parser().parse_args(
        ["status", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir", str(tmp_path),
         "--output_dir", str(tmp_path / "s"), "--command_launcher", "dummy",
         "--tracker", "mlflow", "--tracker", "tensorboard", "--tracker_uri", "file:/m"])
    assert args.tracker == ["mlflow", "tensorboard"] and args.tracker_uri == "file:/m"


PLUGIN = textwrap.dedent('''
    import json, os
    from domainbed.training.trackers import Tracker

    class JsonlTracker(Tracker):
        """Appends what it hears to RUN_DIR/tracked.jsonl."""
        def __init__(self, run):
            super().__init__(run)
            self.path = os.path.join(run.run_dir, "tracked.jsonl")
            self.write({"start": run.hparams, "algorithm": run.args["algorithm"]})

        def write(self, line):
            with open(self.path, "a") as f:
                f.write(json.dumps(line, sort_keys=True) + "\\n")

        def log_checkpoint(self, step, values):
            self.write({"step": step, **values})

    class FailingTracker(Tracker):
        def log_checkpoint(self, step, values):
            raise RuntimeError("server down")
''')


def make_plugin(root):
    (root / "demo_tracker").mkdir(parents=True)
    (root / "demo_tracker" / "__init__.py").write_text(PLUGIN)
    dist = root / "demo_tracker-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-tracker\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[domainbed.trackers]\njsonl = demo_tracker:JsonlTracker\n"
        "failing = demo_tracker:FailingTracker\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), REPO])}


def test_plugin_tracker_registers_through_entry_point(tmp_path):
    env = make_plugin(tmp_path / "site")
    code = ("from domainbed.training.trackers import tracker_names; "
            "print(','.join(tracker_names()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out.split(",") == ["failing", "jsonl", "mlflow", "tensorboard", "wandb"]


@pytest.mark.slow
def test_training_run_reaches_every_tracker_and_survives_a_failing_one(tmp_path, monkeypatch):
    need_package("tensorboard")
    need_package("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    env = make_plugin(tmp_path / "site")
    env.pop("MLFLOW_TRACKING_URI", None)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 reading a file store
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
         "--algorithm", "ERM", "--steps", "3", "--checkpoint_freq", "2", "--num_threads", "1",
         "--output_dir", str(out), "--tracker", "tensorboard", "mlflow", "failing",
         "--tracker", "jsonl"], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out / "done").exists()
    assert [line for line in proc.stderr.splitlines() if "warning" in line] == [
        "warning: tracker failing failed to log a checkpoint (RuntimeError: server down); "
        "the run goes on without it"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2]
    tracked = [json.loads(line) for line in (out / "tracked.jsonl").read_text().splitlines()]
    assert tracked[0] == {"start": records[0]["hparams"], "algorithm": "ERM"}
    assert [t["env1_out_acc"] for t in tracked[1:]] == [r["env1_out_acc"] for r in records]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 2]
    assert events.Scalars("loss")[-1].value == pytest.approx(records[-1]["loss"], rel=1e-6)
    client = MlflowClient(tracking_uri="file:" + str(out / "mlruns"))
    [run] = client.search_runs([client.get_experiment_by_name("domainbed").experiment_id])
    assert run.data.params["args.dataset"] == "Debug28"
    assert run.data.metrics["env0_in_acc"] == pytest.approx(records[-1]["env0_in_acc"])
    assert run.info.status == "FINISHED"
