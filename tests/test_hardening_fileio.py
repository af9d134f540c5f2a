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
