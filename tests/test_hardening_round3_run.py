"""Hardening round 3, the run side (issue 40): numeric options within bounds, resume
states that do not fit the run's schedule or hold non-finite weights, stale temporaries
after a kill, a dangling `done` link, every file a command reads opened the no-follow,
regular-file-only way, malformed weights files, and trackers that write outside the run
folder or wait on a server that is down. Each case is one clear line (or one warning
and the run goes on), never a traceback, a hang or a wrong record."""
import json
import os
import signal
import time

import pytest
import torch

from tests.hardening_util import (  # noqa: F401  (quiet_threads is a fixture)
    comparable,
    quiet_threads,
    records,
    train,
    train_argv,
    train_partially,
)

pytestmark = pytest.mark.usefixtures("quiet_threads")


def one_line_error(code, err, *needles):
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def alarm():
    """A hang fails the test instead of stopping the suite."""
    def timeout(*_):
        raise TimeoutError("hung")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------ 12: numeric bounds
@pytest.mark.parametrize("extra, message", [
    (("--steps", str(10**23)), "--steps must be at most 1000000000, got 1" + "0" * 23),
    (("--checkpoint_freq", str(10**12)), "--checkpoint_freq must be at most"),
    (("--seed", "-1"), "--seed must be at least 0, got -1"),
    (("--seed", str(2**64)), "--seed must be at most 4294967295"),
    (("--trial_seed", "-5"), "--trial_seed must be at least 0"),
    (("--data_seed", str(2**40)), "--data_seed must be at most"),
    (("--hparams_seed", "-1"), "--hparams_seed must be at least 0"),
    (("--eval_batch_size", str(10**14)), "--eval_batch_size must be at most"),
    (("--num_threads", "100000"), "--num_threads must be at most"),
    (("--distributed", "100000"), "--distributed must be at most"),
    (("--early_stopping", "val_acc", "--patience", str(10**12)), "--patience must be at most"),
    (("--tracker_timeout", "0"), "--tracker_timeout must be in (0, 3600.0]"),
    (("--tracker_timeout", "nan"), "--tracker_timeout must be in"),
])
def test_numeric_option_out_of_bounds_is_one_line(tmp_path, capsys, alarm, extra, message):
    out = tmp_path / "run"
    code, err = train(train_argv(out) + list(extra), capsys)
    one_line_error(code, err, message)
    assert not out.exists()


@pytest.mark.parametrize("extra, message", [
    (("--n_trials", str(10**11)), "--n_trials must be at most 1000000"),
    (("--n_hparams", str(10**9)), "--n_hparams must be at most"),
    (("--n_trials", "1000", "--n_hparams", "10000"), "jobs per dataset"),
    (("--max_workers", str(10**9)), "--max_workers must be at most"),
    (("--steps", str(10**23)), "--steps must be at most 1000000000"),
    (("--seed", "-3"), "--seed must be at least 0"),
    (("--slurm_mem_gb", "inf"), "--slurm_mem_gb must be a number"),
])
def test_sweep_numeric_option_out_of_bounds_is_one_line(tmp_path, capsys, extra, message):
    from domainbed.scripts.sweep import main
    from oodutils.errors import run_cli
    argv = ["launch", "--datasets", "Debug28", "--algorithms", "ERM", "--data_dir",
            str(tmp_path), "--output_dir", str(tmp_path / "sweep"), "--command_launcher",
            "local", "--n_trials", "1", "--n_hparams", "1", "--skip_confirmation", *extra]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    err = capsys.readouterr().err
    one_line_error(exit_info.value.code, err, message)
    assert not (tmp_path / "sweep").exists()


# ------------------------------------------------------------ 3: resume vs schedule
def _edited_state(tmp_path, edit):
    """A run of 6 steps (checkpoints at 0, 2, 4, 5) "killed" after step 3, its resume
    state edited by `edit`."""
    out = tmp_path / "run"
    train_partially(train_argv(out), stop_after=3)
    path = out / "resume_state.pt"
    state = torch.load(path, weights_only=True)
    assert state["next_step"] == 3 and len(state["records"]) == 2
    edit(state)
    torch.save(state, path)
    return out, path


def _record_at(step):
    def edit(state):
        record = json.loads(state["records"][-1])
        state["records"].append(json.dumps({**record, "step": step}))
        state["next_step"] = step + 1
    return edit


def _nan_weight(state):
    name = next(k for k, v in state["algorithm"].items() if v.is_floating_point())
    state["algorithm"][name][0] = float("nan")


def _inf_optimizer_state(state):
    [optimizer] = state["optimizers"].values()
    moments = next(iter(optimizer["state"].values()))
    moments["exp_avg"].fill_(float("inf"))


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.update(next_step=10**15), "next_step 1000000000000000 is beyond the run's 6"),
    (lambda s: s.update(next_step=6), "not the 4 checkpoints of this run's schedule"),
    (lambda s: s.update(next_step=5), "before step 5"),      # the checkpoint at 4 missing
    (_record_at(3), "are not the 2 checkpoints"),            # 3 is no checkpoint step
    (_record_at(5), "are not the 4 checkpoints"),            # done with 3 of 4 checkpoints
    (_nan_weight, "holds NaN or infinite values"),
    (_inf_optimizer_state, "optimizer optimizer tensor 'state' holds NaN"),
], ids=["next-step-1e15", "next-step-at-end", "checkpoint-missing", "off-schedule-record",
        "finished-with-missing-checkpoints", "nan-weight", "inf-adam-moment"])
def test_resume_state_that_does_not_fit_the_schedule_is_refused(tmp_path, capsys, edit,
                                                                 needle):
    out, path = _edited_state(tmp_path, edit)
    capsys.readouterr()
    code, err = train(train_argv(out), capsys)
    one_line_error(code, err, str(path), needle, "--restart")
    assert not (out / "done").exists()
    code, _ = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and [r["step"] for r in records(out)] == [0, 2, 4, 5]


def test_resume_state_of_the_schedule_still_resumes(tmp_path, capsys):
    reference = tmp_path / "reference"
    assert train(train_argv(reference))[0] == 0
    out, _ = _edited_state(tmp_path, lambda state: None)
    code, _ = train(train_argv(out), capsys)
    assert code == 0 and comparable(records(out)) == comparable(records(reference))


# ------------------------------------------------------------ 13: stale temporaries
def test_relaunch_removes_the_temporaries_a_kill_left(tmp_path, capsys):
    out = tmp_path / "run"
    train_partially(train_argv(out), stop_after=3)
    # what a kill -9 in the middle of a write leaves: a partial resume state, a partial
    # predictions file (the writer's own naming)
    (out / ".tmp-0123456789abcdef").write_bytes(b"PK\x03\x04 partial resume state")
    (out / "predictions" / ".tmp-fedcba9876543210").write_bytes(b"PK partial")
    (out / ".tmp-folder").mkdir()       # not a file a write leaves: left alone
    capsys.readouterr()
    code, err = train(train_argv(out), capsys)
    assert code == 0 and (out / "done").exists()
    assert "removed 2 temporary files an interrupted attempt left" in err
    leftovers = [p.name for p in out.rglob(".tmp-*")]
    assert leftovers == [".tmp-folder"]


# ------------------------------------------------------------ 10: a dangling `done` link
def _partial_run_with_dangling_done(tmp_path):
    out = tmp_path / "run"
    train_partially(train_argv(out), stop_after=3)
    os.symlink(tmp_path / "nowhere" / "done", out / "done")
    return out


def test_status_names_a_dangling_done_link_and_the_way_out(tmp_path):
    from domainbed.launch import jobs
    out = _partial_run_with_dangling_done(tmp_path)
    assert jobs.job_state(str(out)) == jobs.FAILED
    reason = jobs.last_error(str(out))
    assert f"{out / 'done'} is a symbolic link, not the marker a finished run writes" \
        in reason
    assert "relaunch the sweep" in reason and "sweep delete_incomplete" in reason \
        and "--restart" in reason


def test_relaunch_launches_a_job_whose_done_is_a_dangling_link(tmp_path):
    import sys

    from domainbed.launch import jobs
    out = tmp_path / "job"
    out.mkdir()
    os.symlink(tmp_path / "nowhere", out / "done")
    write_done = ("import os, sys; d = os.path.join(sys.argv[1], 'done'); os.unlink(d); "
                  "open(d, 'w').close()")
    outcome = jobs.run_command(jobs.Command([sys.executable, "-c", write_done, str(out)],
                                            str(out)))
    assert outcome.status == "ok" and jobs.job_state(str(out)) == jobs.DONE
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("kind", ["dangling-link", "link-to-a-file", "folder"])
def test_train_repairs_a_done_that_is_not_a_file_and_resumes(tmp_path, capsys, kind):
    reference = tmp_path / "reference"
    assert train(train_argv(reference))[0] == 0
    out = tmp_path / "run"
    train_partially(train_argv(out), stop_after=3)
    target = tmp_path / "someone_elses_file"
    if kind == "folder":
        (out / "done").mkdir()
    else:
        if kind == "link-to-a-file":
            target.write_text("theirs\n")
        os.symlink(target, out / "done")
    capsys.readouterr()
    code, err = train(train_argv(out), capsys)
    assert code == 0 and "not the marker a finished run writes" in err
    assert (out / "done").is_file() and not (out / "done").is_symlink()
    assert comparable(records(out)) == comparable(records(reference))
    assert "resuming" in err                                   # from its checkpoint
    if kind == "link-to-a-file":
        assert target.read_text() == "theirs\n"
    else:
        assert not target.exists()


# ------------------------------------------------------------ 7 and 9: evaluate's inputs
def evaluate_here(capsys, *argv):
    """domainbed-evaluate in this process: (exit code, stderr)."""
    from domainbed.scripts import evaluate
    from oodutils.errors import run_cli
    with pytest.raises(SystemExit) as stopped:
        run_cli(evaluate.main, [str(a) for a in argv])
    return stopped.value.code, capsys.readouterr().err


def _save_resnet18(path, n_outputs):
    import torchvision
    from safetensors.torch import save_file
    torch.manual_seed(0)
    save_file(torchvision.models.resnet18(num_classes=n_outputs).state_dict(), str(path))


def _checkpoint(tmp_path):
    from tests.test_evaluate import make_checkpoint
    return make_checkpoint(tmp_path)[0]


MODEL = ("--model", "resnet18", "--dataset", "Debug28")


@pytest.mark.parametrize("option", ["--class_map", "--weights", "--checkpoint"])
@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_every_file_evaluate_reads_is_a_regular_file_never_followed(tmp_path, capsys, alarm,
                                                                    option, kind):
    real = tmp_path / "real"
    if option == "--checkpoint":
        os.replace(_checkpoint(tmp_path), real)
        argv = []
    else:
        _save_resnet18(tmp_path / "ten.safetensors", 10)
        (tmp_path / "map.json").write_text(json.dumps([0, 1]))
        argv = [*MODEL, "--weights", tmp_path / "ten.safetensors", "--class_map",
                tmp_path / "map.json"]
        real.write_bytes((tmp_path / ("map.json" if option == "--class_map"
                                      else "ten.safetensors")).read_bytes())
        del argv[argv.index(option):argv.index(option) + 2]
    planted = tmp_path / "planted.safetensors"
    if kind == "fifo":
        os.mkfifo(planted)
    elif kind == "symlink":
        os.symlink(real, planted)
    else:
        planted.mkdir()
    code, err = evaluate_here(capsys, *argv, option, planted, "--output_dir", tmp_path / "o")
    reason = {"fifo": "is not a regular file", "folder": "is not a regular file",
              "symlink": f"is a symbolic link; refusing to follow it (pass the file it "
                         f"points to, {real}"}[kind]
    if option == "--weights" and kind != "symlink":
        reason = "is not a file"     # checked by name before any work
    one_line_error(code, err, option, reason)
    assert not (tmp_path / "o" / "results.jsonl").exists()


def _safetensors_with(header, payload=b"\0" * 16):
    import struct
    return struct.pack("<Q", len(header)) + header + payload


MALFORMED = {
    "huge-header-length": (2**63).to_bytes(8, "little") + b"{}",
    "bad-json-header": _safetensors_with(b"{nope"),
    "unknown-dtype": _safetensors_with(json.dumps(
        {"fc.weight": {"dtype": "Q77", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()),
    "offsets-past-the-end": _safetensors_with(json.dumps(
        {"fc.weight": {"dtype": "F32", "shape": [2, 512], "data_offsets": [0, 4096]}}
    ).encode()),
    "empty": b"",
}


@pytest.mark.parametrize("case", [*MALFORMED, "pickle"])
def test_malformed_safetensors_weights_are_one_line(tmp_path, capsys, case):
    weights = tmp_path / "head.safetensors"
    if case == "pickle":
        torch.save({"fc.weight": torch.zeros(2, 512)}, weights)
    else:
        weights.write_bytes(MALFORMED[case])
    code, err = evaluate_here(capsys, *MODEL, "--weights", weights, "--output_dir",
                              tmp_path / "o")
    one_line_error(code, err, f"weights file {weights} is not a valid safetensors file")
    assert not (tmp_path / "o" / "results.jsonl").exists()


@pytest.mark.parametrize("case", [*MALFORMED, "text"])
def test_malformed_checkpoint_is_one_line(tmp_path, capsys, case):
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(MALFORMED.get(case, b"just text\n"))
    code, err = evaluate_here(capsys, "--checkpoint", checkpoint, "--output_dir",
                              tmp_path / "o")
    one_line_error(code, err, f"--checkpoint {checkpoint} cannot be read")


def test_checkpoint_sha256_is_of_the_bytes_scored(tmp_path):
    import hashlib

    from domainbed.scripts import evaluate
    path = _checkpoint(tmp_path)
    assert evaluate.main(["--checkpoint", str(path), "--output_dir",
                          str(tmp_path / "o")]) == 0
    [record] = records(tmp_path / "o")
    assert record["args"]["checkpoint_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_hugging_face_weights_matching_no_parameter_are_refused(tmp_path, capsys):
    from tests.requirements import need_package
    transformers = need_package("transformers")
    from safetensors.torch import save_file
    config = transformers.ResNetConfig(num_labels=2, embedding_size=8, hidden_sizes=[8, 16],
                                       depths=[1, 1], num_channels=3)
    folder = tmp_path / "hf_model"
    transformers.ResNetForImageClassification(config).save_pretrained(str(folder))
    save_file({"unrelated.weight": torch.zeros(3)}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    capsys.readouterr()     # save_pretrained's progress bar
    code, err = evaluate_here(capsys, "--model", f"hf:{folder}", "--dataset", "Debug28",
                              "--output_dir", tmp_path / "o")
    one_line_error(code, err, f"hf:{folder}", "weights are not in its model.safetensors",
                   "never scored")
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_hugging_face_folder_with_a_fifo_is_refused_without_hanging(tmp_path, capsys, alarm):
    folder = tmp_path / "hf_model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    os.mkfifo(folder / "model.safetensors")
    code, err = evaluate_here(capsys, "--model", f"hf:{folder}", "--dataset", "Debug28",
                              "--output_dir", tmp_path / "o")
    one_line_error(code, err, str(folder / "model.safetensors"), "not a regular file")


# ------------------------------------------------------------ 1 and 8: trackers
def _warnings(err):
    return [line for line in err.splitlines() if line.startswith("warning: tracker")]


@pytest.mark.parametrize("tracker, folder", [("tensorboard", "tensorboard"),
                                             ("mlflow", "mlruns")])
def test_tracker_folder_that_is_a_symlink_is_refused_and_the_run_goes_on(
        tmp_path, capsys, monkeypatch, tracker, folder):
    from tests.requirements import need_package
    need_package(tracker)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(victim, out / folder)
    code, err = train(train_argv(out, "--tracker", tracker), capsys)
    assert code == 0 and (out / "done").exists()
    [warning] = _warnings(err)
    assert f"tracker {tracker} refused: {out / folder} is a symbolic link" in warning
    assert "the run goes on without it" in warning and "Traceback" not in err
    assert os.listdir(victim) == []


def test_link_planted_inside_a_tracker_folder_stops_that_tracker(tmp_path):
    from tests.requirements import need_package
    need_package("tensorboard")
    from domainbed.training import trackers
    run = trackers.TrackedRun(str(tmp_path / "run"), "r", {"lr": 1.0}, {}, "id")
    warnings = []
    opened = trackers.open_trackers(["tensorboard"], run, warn=warnings.append)
    assert warnings == [] and len(opened.trackers) == 1
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    [event_file] = (tmp_path / "run" / "tensorboard").iterdir()
    os.symlink(victim, event_file.with_name("planted"))
    opened.log_checkpoint(0, {"step": 0, "loss": 1.0})
    assert opened.trackers == [] and len(warnings) == 1
    assert "planted is a symbolic link" in warnings[0]
    assert victim.read_text() == "precious\n"


def test_a_tracker_that_hangs_is_dropped_after_its_timeout(tmp_path, monkeypatch):
    from domainbed.training import trackers

    class Hanging(trackers.Tracker):
        def log_checkpoint(self, step, values):
            time.sleep(60)
    monkeypatch.setitem(trackers.TRACKERS._classes, "hanging", Hanging)
    run = trackers.TrackedRun(str(tmp_path / "run"), "r", {}, {}, "id", timeout=0.5)
    warnings = []
    opened = trackers.open_trackers(["hanging"], run, warn=warnings.append)
    started = time.monotonic()
    opened.log_checkpoint(0, {"step": 0, "loss": 1.0})
    opened.close()
    assert time.monotonic() - started < 5
    assert warnings == ["warning: tracker hanging failed to log a checkpoint (TrackerTimeout: "
                        "no answer within 0.5 s (--tracker_timeout)); the run goes on "
                        "without it"]


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9", "sqlite:////proc/no/such/mlflow.db"])
def test_mlflow_server_down_is_one_quiet_warning_within_the_timeout(tmp_path, capsys,
                                                                   monkeypatch, uri):
    from tests.requirements import need_package
    need_package("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    started = time.monotonic()
    code, err = train(train_argv(out, "--tracker", "mlflow", "--tracker_uri", uri,
                                 "--tracker_timeout", "3", "--steps", "2"), capsys)
    took = time.monotonic() - started
    assert code == 0 and (out / "done").exists()
    [warning] = _warnings(err)
    assert warning.startswith("warning: tracker mlflow failed to start")
    assert not [line for line in err.splitlines() if "mlflow" in line.lower()
                and not line.startswith("warning: tracker mlflow")], err
    assert took < 60, took    # MLflow alone retries an HTTP server for 250 s


# ------------------------------------------------------------ the sweep folder's files
def test_slurm_submissions_file_that_is_a_fifo_neither_hangs_status_nor_launch(tmp_path,
                                                                              alarm):
    from domainbed.launch import slurm_status
    from oodutils.pinned_dir import UnsafePath
    os.mkfifo(tmp_path / slurm_status.SUBMISSIONS_FILE)
    assert slurm_status.submitted_job_ids(str(tmp_path)) == {}
    with pytest.raises(UnsafePath, match="not a regular file"):
        slurm_status.record_submissions(str(tmp_path), [(str(tmp_path / "run"), 7)])


def test_slurm_submissions_file_skips_malformed_lines(tmp_path):
    from domainbed.launch import slurm_status
    (tmp_path / slurm_status.SUBMISSIONS_FILE).write_bytes(
        b'[1]\n{"run": "a", "job_id": 3}\n' + b"[" * 100000 + b"\n\xff\xfe\n"
        + b'{"run": "b"' + b" " * 70000 + b', "job_id": 4}\n')
    assert slurm_status.submitted_job_ids(str(tmp_path)) == {"a": "3"}


def test_deeply_nested_hparams_json_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = train(train_argv(out, hparams="[" * 100000), capsys)
    one_line_error(code, err, "--hparams is not valid JSON (nested too deeply)")
    assert len(err) < 400 and not out.exists()


def test_deeply_nested_class_map_is_one_line(tmp_path, capsys):
    _save_resnet18(tmp_path / "ten.safetensors", 10)
    (tmp_path / "map.json").write_text("[" * 100000)
    code, err = evaluate_here(capsys, *MODEL, "--weights", tmp_path / "ten.safetensors",
                              "--class_map", tmp_path / "map.json", "--output_dir",
                              tmp_path / "o")
    one_line_error(code, err, "--class_map", "is not JSON (nested too deeply)")


# ------------------------------------------------------------ other commands' file inputs
def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("command", ["aotl", "oodselect", "ood-bench-calibration",
                                     "ood-bench-grid"])
def test_a_fifo_named_as_any_commands_input_is_one_line(tmp_path, capsys, alarm, command):
    from oodutils.errors import run_cli
    out = str(tmp_path / "out")
    if command == "aotl":
        from analysis.aotl.cli import main
        argv, needle = [_fifo(tmp_path, "acc.csv")], "accuracy CSV"
    elif command == "oodselect":
        from analysis.oodselect.cli import main
        argv, needle = ["--matrix", _fifo(tmp_path, "m.npz"), "--out", out], "matrix file"
    elif command == "ood-bench-calibration":
        import numpy as np

        from ood_bench.quantify import main
        rng = np.random.RandomState(0)
        np.savez(tmp_path / "f.npz", z_p=rng.randn(40, 2), y_p=rng.randint(0, 2, 40),
                 z_q=rng.randn(40, 2), y_q=rng.randint(0, 2, 40))
        argv = ["--features", str(tmp_path / "f.npz"), "--calibration",
                _fifo(tmp_path, "cal.json"), "--out", str(tmp_path / "r.json")]
        needle = "--calibration"
    else:
        from ood_bench.cli import main
        argv = ["plot", "heatmap", "--grid", _fifo(tmp_path, "grid.json"), "--out",
                str(tmp_path / "h.png")]
        needle = "--grid"
    with pytest.raises(SystemExit) as stopped:
        run_cli(main, argv)
    one_line_error(stopped.value.code, capsys.readouterr().err, needle,
                   "is not a regular file")
