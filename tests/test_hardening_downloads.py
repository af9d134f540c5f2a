"""Downloads trust nothing left on disk: a download without a published checksum records
its sha256 in a lock beside the data (trust on first use) and every later download and
`--verify` checks against it; a partial is verified at the end and never kept on a mismatch
(a planted one is not resumed where nothing could verify the result); an oversize stale
partial answered by HTTP 416 is not taken as complete. Against a server on 127.0.0.1."""
import hashlib
import json
import os

import pytest

from domainbed.downloads import fetching as downloading
from domainbed.scripts import download
from oodutils.errors import UserError
from tests.test_download_machinery import PAYLOAD, SHA, Server, waterbirds_tarball


@pytest.fixture
def server():
    s = Server({})
    yield s
    s.close()


def _lock(directory):
    return json.loads((directory / downloading.LOCK_FILE).read_text())


def test_first_download_is_recorded_and_a_changed_source_is_refused(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    dst = tmp_path / "a.bin"
    downloading.fetch(server.url + "/a.bin", str(dst))
    assert _lock(tmp_path)["a.bin"] == {"url": server.url + "/a.bin", "sha256": SHA}
    dst.unlink()
    server.files["/a.bin"] = b"another file" + PAYLOAD[12:]
    with pytest.raises(UserError, match=f"expected sha256 {SHA} \\(recorded in"):
        downloading.fetch(server.url + "/a.bin", str(dst))
    assert sorted(p.name for p in tmp_path.iterdir()) == [downloading.LOCK_FILE]


def test_a_planted_partial_is_not_resumed_when_nothing_could_verify_it(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    (tmp_path / ".a.bin.planted.partial").write_bytes(b"EVIL" * 25_000)
    downloading.fetch(server.url + "/a.bin", str(tmp_path / "a.bin"))
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD and server.ranges == [None]
    assert _lock(tmp_path)["a.bin"]["sha256"] == SHA
    assert not list(tmp_path.glob("*.partial"))


def test_a_planted_partial_that_is_resumed_is_verified_and_never_kept(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    (tmp_path / ".a.bin.planted.partial").write_bytes(b"EVIL" * 25_000)
    with pytest.raises(UserError, match="checksum mismatch"):
        downloading.fetch(server.url + "/a.bin", str(tmp_path / "a.bin"), sha256=SHA)
    assert server.ranges == ["bytes=100000-"]  # resumed, then checked as a whole
    assert not list(tmp_path.iterdir())
    downloading.fetch(server.url + "/a.bin", str(tmp_path / "a.bin"), sha256=SHA)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD


def test_http_416_takes_a_partial_as_complete_only_at_the_stated_size(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    stale = tmp_path / ".a.bin.stale.partial"
    stale.write_bytes(PAYLOAD + b"trailing junk")  # oversize: the server answers 416
    downloading.fetch(server.url + "/a.bin", str(tmp_path / "a.bin"), sha256=SHA)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert server.ranges == [f"bytes={len(PAYLOAD) + 13}-", None]  # started over
    (tmp_path / "a.bin").unlink()
    (tmp_path / ".a.bin.same.partial").write_bytes(b"\0" * len(PAYLOAD))  # right size
    with pytest.raises(UserError, match="checksum mismatch"):
        downloading.fetch(server.url + "/a.bin", str(tmp_path / "a.bin"), sha256=SHA)
    assert not list(tmp_path.iterdir())


def test_an_existing_file_is_checked_not_trusted(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    dst = tmp_path / "a.bin"
    downloading.fetch(server.url + "/a.bin", str(dst))
    dst.write_bytes(b"tampered")
    with pytest.raises(UserError, match="does not match the checksum"):
        downloading.fetch(server.url + "/a.bin", str(dst))
    assert dst.read_bytes() == b"tampered"  # reported, not silently replaced


def test_verify_rechecks_an_extracted_dataset_against_its_first_download(
        server, tmp_path, monkeypatch, capsys):
    server.files["/wb.tar.gz"] = waterbirds_tarball(tmp_path)
    step = download.DATASETS["Waterbirds"][0]
    monkeypatch.setattr(step, "url", server.url + "/wb.tar.gz")
    data = tmp_path / "data"
    download.main(["--data_dir", str(data), "--datasets", "Waterbirds"])
    entry = _lock(data / "waterbirds")["waterbirds.tar.gz"]
    assert entry["sha256"] == hashlib.sha256(server.files["/wb.tar.gz"]).hexdigest()
    assert entry["tree"] == ["waterbird_complete95_forest2water2"]
    download.main(["--data_dir", str(data), "--datasets", "Waterbirds", "--verify"])
    assert "Waterbirds: verified" in capsys.readouterr().out
    metadata = data / "waterbirds" / "waterbird_complete95_forest2water2" / "metadata.csv"
    metadata.write_text(metadata.read_text().replace(",1,", ",0,", 1))
    with pytest.raises(UserError, match="1 of 1 verifications failed: Waterbirds"):
        download.main(["--data_dir", str(data), "--datasets", "Waterbirds", "--verify"])
    assert "changed since they were downloaded" in capsys.readouterr().err
    changed = bytearray(server.files["/wb.tar.gz"])
    changed[len(changed) // 2] ^= 0xFF
    server.files["/wb.tar.gz"] = bytes(changed)  # the source changed since the first use
    with pytest.raises(UserError, match="1 of 1 downloads failed"):
        download.main(["--data_dir", str(data), "--datasets", "Waterbirds"])
    assert "checksum mismatch" in capsys.readouterr().err


def test_verify_checks_weights_against_the_hash_in_their_name(tmp_path, capsys):
    name = "resnet18"
    file = download.weight_sources()[name]["file"]
    (tmp_path / file).write_bytes(b"not the published weights")
    with pytest.raises(UserError, match="1 of 1 verifications failed"):
        download.main(["--weights", name, "--weights_dir", str(tmp_path), "--verify"])
    err = capsys.readouterr().err
    assert f"expected sha256 {download.weight_sources()[name]['sha256_prefix']}" in err
    os.unlink(tmp_path / file)
    with pytest.raises(UserError, match="verifications failed"):
        download.main(["--weights", name, "--weights_dir", str(tmp_path), "--verify"])
    assert "not on disk" in capsys.readouterr().err


def test_a_link_where_pooch_would_stage_is_refused(server, tmp_path):
    """The staging folder beside the target is never followed: a link there is one error
    line and nothing is written through it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / ".a.bin.pooch").symlink_to(elsewhere)
    server.files["/a.bin"] = b"payload"
    with pytest.raises(UserError, match="not a folder a download made"):
        downloading.fetch(server.url + "/a.bin", str(data / "a.bin"))
    assert list(elsewhere.iterdir()) == [] and not (data / "a.bin").exists()


def test_a_linked_partial_is_never_resumed_through(server, tmp_path):
    """A `.NAME.*.partial` that is a link (someone else's) is not appended to."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    data = tmp_path / "data"
    data.mkdir()
    (data / ".a.bin.x1y2.partial").symlink_to(victim)
    server.files["/a.bin"] = PAYLOAD
    downloading.fetch(server.url + "/a.bin", str(data / "a.bin"), sha256=SHA)
    assert victim.read_bytes() == b"keep me" and (data / "a.bin").read_bytes() == PAYLOAD
    assert server.ranges == [None]
