"""File modes and links: atomic writes give what a plain open() gives under the umask
(a teammate can read a shared sweep), replace a symlink instead of writing through it,
and in-place appends refuse symlinks."""
import os
import stat

import pytest

from oodutils import fileio
from oodutils.errors import UserError
from tests.hardening_util import quiet_threads, train, train_argv  # noqa: F401


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_writes_follow_the_umask(tmp_path, umask):
    fileio.atomic_write_text(tmp_path / "a.txt", "x")
    assert mode(tmp_path / "a.txt") == 0o644
    umask(0o027)
    fileio.atomic_savez(tmp_path / "b.npz", x=[1])
    assert mode(tmp_path / "b.npz") == 0o640
    umask(0o002)
    fileio.atomic_write_text(tmp_path / "c.txt", "x", durable=True)
    assert mode(tmp_path / "c.txt") == 0o664


@pytest.mark.usefixtures("quiet_threads")
def test_run_outputs_are_readable_by_teammates(tmp_path, umask, capsys):
    out = tmp_path / "run"
    assert train(train_argv(out), capsys)[0] == 0
    for name in ("results.jsonl", "done", "model.pkl", "predictions/step_0000005.npz"):
        assert mode(out / name) == 0o644, name


def test_atomic_write_replaces_a_symlink_never_writes_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "results.jsonl")
    fileio.atomic_write_text(tmp_path / "results.jsonl", "new")
    assert victim.read_text() == "precious"
    assert not os.path.islink(tmp_path / "results.jsonl")
    assert (tmp_path / "results.jsonl").read_text() == "new"


def test_move_aside_keeps_the_old_file(tmp_path):
    (tmp_path / "results.jsonl").write_text("old\n")
    aside = fileio.atomic_move_aside(str(tmp_path / "results.jsonl"))
    assert aside.endswith("results.jsonl.prev") and open(aside).read() == "old\n"
    assert fileio.atomic_move_aside(str(tmp_path / "results.jsonl")) is None


def test_spawrious_manifest_append_refuses_a_symlink(tmp_path):
    from spawrious.manifest import append_records
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "m.jsonl")
    with pytest.raises(UserError, match="symbolic link"):
        append_records(str(tmp_path / "m.jsonl"), [{"attempt": 0}])
    assert victim.read_text() == "precious"


def test_pinned_folder_swapped_for_a_symlink_after_opening_is_not_followed(tmp_path):
    """The race a path check loses: the folder is replaced by a link once opened."""
    from oodutils.pinned_dir import PinnedDir
    victim = tmp_path / "victim"
    victim.mkdir()
    run = tmp_path / "run"
    with PinnedDir.open(run, create=True) as folder:
        os.rename(run, tmp_path / "run_moved")
        os.symlink(victim, run)
        folder.write_text("results.jsonl", "mine\n")
        with folder.subdir("predictions") as predictions:
            predictions.write_bytes("step_0.npz", b"x")
        assert folder.move_aside("results.jsonl").endswith("results.jsonl.prev")
    assert os.listdir(victim) == []
    assert (tmp_path / "run_moved" / "results.jsonl.prev").read_text() == "mine\n"
    assert (tmp_path / "run_moved" / "predictions" / "step_0.npz").read_bytes() == b"x"


def test_full_disk_when_creating_the_temp_file_is_one_clear_error(tmp_path, monkeypatch):
    import errno

    from oodutils.pinned_dir import NoSpaceLeft
    real_open = os.open

    def full_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(os, "open", full_open)
    with pytest.raises(NoSpaceLeft, match=r"no space left to write .*done \(5 bytes needed"):
        fileio.atomic_write_text(tmp_path / "done", "done\n")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_file_written_in_pieces_holds_them_in_order(tmp_path):
    """The records index is written from its arrays' own memory, piece by piece."""
    import numpy as np

    from oodutils.fileio import atomic_write_bytes
    matrix = np.arange(12, dtype=np.float64).reshape(3, 4)
    pieces = [b"head", memoryview(matrix).cast("B"), b"", b"\0" * 3]
    atomic_write_bytes(tmp_path / "f", pieces)
    assert (tmp_path / "f").read_bytes() == b"head" + matrix.tobytes() + b"\0" * 3
