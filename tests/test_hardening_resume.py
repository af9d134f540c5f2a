"""Resume hardening: a shared run directory cannot run code, resume never loses or
invents a record, a broken state is one clear error with a way out, and every RNG an
algorithm draws from (torch, numpy, python's `random`) is restored."""
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from domainbed.algorithms.erm import ERM
from domainbed.registry import ALGORITHMS
from tests.builders import read_records, registered
from tests.hardening_util import (  # noqa: F401  (quiet_threads is a fixture)
    comparable,
    quiet_threads,
    train,
    train_argv,
    train_partially,
)

DRAWING = "HardeningRandomDraws"
pytestmark = pytest.mark.usefixtures("quiet_threads")


class RandomDrawsERM(ERM):
    """ERM whose loss weight comes from numpy's and python's global RNGs (as Mixup's
    and RSC's draws do); the draws are recorded, so a lost RNG state shows."""
    def update(self, minibatches, unlabeled=None):
        np_draw, py_draw = float(np.random.rand()), random.random()
        x = torch.cat([x for x, _ in minibatches])
        y = torch.cat([y for _, y in minibatches])
        loss = (0.5 + np_draw + py_draw) * F.cross_entropy(self.predict(x), y)
        self.optimizer_step(loss)
        return {"loss": loss.item(), "np_draw": np_draw, "py_draw": py_draw}


@pytest.fixture
def drawing_algorithm():
    """Registered only while a test needs it (other tests list every algorithm)."""
    with registered(ALGORITHMS, DRAWING, RandomDrawsERM):
        yield DRAWING


def test_crafted_pickle_in_resume_state_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    out = tmp_path / "run"
    out.mkdir()
    torch.save({"version": 2, "identity": "x", "payload": Evil()}, out / "resume_state.pt")
    code, err = train(train_argv(out), capsys)
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "resume_state.pt" in err and "--restart" in err
    assert "weights_only" not in err and "could run code" in err   # no unsafe advice
    code, err = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and (out / "done").exists() and not marker.exists()


def test_numpy_and_python_rngs_are_restored(tmp_path, drawing_algorithm):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    assert train(train_argv(reference, algorithm=DRAWING))[0] == 0
    train_partially(train_argv(out, algorithm=DRAWING), stop_after=3)  # "killed" at 3
    assert [r["step"] for r in read_records(out)] == [0, 2]
    np.random.seed(123)  # whatever the process drew since must not matter
    random.seed(123)
    assert train(train_argv(out, algorithm=DRAWING))[0] == 0
    assert comparable(read_records(out)) == comparable(read_records(reference))


def test_foreign_first_line_neither_drops_nor_keeps_records(tmp_path, capsys):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    assert train(train_argv(reference))[0] == 0
    train_partially(train_argv(out), stop_after=3)
    results = out / "results.jsonl"
    lines = results.read_text().splitlines()
    results.write_text('{"step": 0, "foreign": true}\n' + lines[0] + "\n" + lines[1][:40])
    code, _ = train(train_argv(out), capsys)
    assert code == 0
    assert comparable(read_records(out)) == comparable(read_records(reference))
    prev = (out / "results.jsonl.prev").read_text()
    assert '"foreign": true' in prev  # moved aside, not silently dropped


def test_corrupt_resume_state_is_one_clear_error_then_restart(tmp_path, capsys):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    assert train(train_argv(reference))[0] == 0
    train_partially(train_argv(out), stop_after=3)
    state = out / "resume_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    old_records = (out / "results.jsonl").read_text()
    capsys.readouterr()   # the runs above logged their checkpoint lines to stderr
    for _ in range(2):  # the same clear error on every rerun, nothing changed
        code, err = train(train_argv(out), capsys)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert str(state) in err and "--restart" in err
        assert (out / "results.jsonl").read_text() == old_records
    code, err = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and (out / "done").exists()
    assert (out / "results.jsonl.prev").read_text() == old_records
    assert comparable(read_records(out)) == comparable(read_records(reference))


def test_kill_during_rerun_of_finished_run_keeps_its_records(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(train_argv(out))[0] == 0
    finished = (out / "results.jsonl").read_text()
    (out / "done").unlink()
    # the rerun starts from step 0 (no resume state) and is killed before a checkpoint
    run = train_partially(train_argv(out), stop_after=-1)
    del run
    assert (out / "results.jsonl.prev").read_text() == finished
    assert not (out / "results.jsonl").exists() or \
        (out / "results.jsonl").read_text() == finished
    capsys.readouterr()
    code, _ = train(train_argv(out), capsys)
    assert code == 0 and (out / "done").exists()
    assert (out / "results.jsonl.prev").read_text() == finished  # still there


def test_records_from_another_run_are_never_deleted_at_start(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").write_text('{"step": 0, "mine": 1}\n')
    code, _ = train(train_argv(out), capsys)
    assert code == 0
    assert (out / "results.jsonl.prev").read_text() == '{"step": 0, "mine": 1}\n'


# ------------------------------------------------------------ round 2
def _one_line_error(code, err, *needles):
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def alarm():
    """A hang fails the test instead of stopping the suite."""
    import signal

    def timeout(*_):
        raise TimeoutError("hung")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_symlinked_run_folder_is_refused(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "run"
    os.symlink(victim, out)
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, f"{out} is a symbolic link; refusing to use it")
    assert os.listdir(victim) == []


def test_symlinked_predictions_folder_is_refused(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(victim, out / "predictions")
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, f"{out / 'predictions'} is a symbolic link")
    assert os.listdir(victim) == []
    assert "predictions is a symbolic link" in (out / "err.txt").read_text()


def test_fifo_resume_state_is_refused_without_hanging(tmp_path, capsys, alarm):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "resume_state.pt")
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, "not a regular file", "--restart")
    code, _ = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and (out / "done").exists()


def test_restart_over_a_resume_state_that_is_a_folder(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "resume_state.pt").mkdir(parents=True)
    (out / "resume_state.pt" / "kept").write_text("mine\n")
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, "--restart")
    code, _ = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and (out / "done").exists()
    assert (out / "resume_state.pt.prev" / "kept").read_text() == "mine\n"


def _edit_numpy_keys(state):
    state["numpy_rng"]["keys"] = torch.zeros(5, dtype=torch.int64)


def _edit_python_rng(state):
    state["python_rng"] = [3, [1, 2], "x"]


@pytest.mark.parametrize("edit", [
    lambda s: s.update(accumulators=[1.0, 2.0]),
    lambda s: s.update(accumulators={"loss": "abc"}),
    lambda s: s.update(next_step=-3),
    lambda s: s.update(next_step=1),          # before the last vouched record (step 2)
    lambda s: s.update(next_step=True),
    _edit_numpy_keys,
    _edit_python_rng,
], ids=["accumulators-list", "accumulators-str", "next_step-negative", "next_step-early",
        "next_step-bool", "numpy-keys-shape", "python-rng"])
def test_malformed_but_loadable_state_is_one_clear_error(tmp_path, capsys, edit):
    out = tmp_path / "run"
    train_partially(train_argv(out), stop_after=3)
    path = out / "resume_state.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    capsys.readouterr()
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, str(path), "malformed", "--restart")
    code, _ = train(train_argv(out, "--restart"), capsys)
    assert code == 0 and (out / "done").exists()


def test_every_restart_keeps_the_older_records(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").write_text('{"step": 0, "original": 1}\n')
    contents = [(out / "results.jsonl").read_text()]
    for _ in range(2):
        assert train(train_argv(out, "--restart"), capsys)[0] == 0
        contents.append((out / "results.jsonl").read_text())
        (out / "done").unlink()
    assert train(train_argv(out, "--restart"), capsys)[0] == 0
    kept = [(out / name).read_text() for name in
            ("results.jsonl.prev", "results.jsonl.prev.1", "results.jsonl.prev.2")]
    assert kept == contents and '"original": 1' in kept[0]


def test_disk_full_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno

    def full(fd, data):   # the file system's answer to every write: no space left
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "write", full)
    out = tmp_path / "run"
    code, err = train(train_argv(out), capsys)
    _one_line_error(code, err, "no space left to write", f"{out}{os.sep}", "needed",
                    "left on its file system")
    assert not [name for name in os.listdir(out) if name.startswith(".tmp-")]
