"""domainbed.downloads.fetching against a local HTTP server (127.0.0.1, with Range support) and
crafted archives; the download CLI end to end for a dataset in its real layout."""
import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
import zipfile

import pytest

from domainbed.downloads import fetching as downloading
from domainbed.downloads import weights
from domainbed.scripts import download
from oodutils.errors import UserError


class Server:
    """Serves `files` (path -> bytes); honours Range unless `ignore_range`; can cut a
    response short after `cut_after` bytes (a dropped connection), every response while
    `cut_always`."""

    def __init__(self, files):
        self.files, self.ranges, self.ignore_range, self.cut_after = files, [], False, None
        self.cut_always = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                header = self.headers.get("Range")
                server.ranges.append(header)
                start = 0
                if header and not server.ignore_range:
                    start = int(header.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/"
                                                      f"{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.cut_after is not None:
                    body = body[:server.cut_after]
                    if not server.cut_always:
                        server.cut_after = None
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server({})
    yield s
    s.close()


PAYLOAD = os.urandom(300_000)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_fetch_verifies_checksum(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    dst = tmp_path / "a.bin"
    downloading.fetch(server.url + "/a.bin", str(dst), sha256=SHA)
    assert dst.read_bytes() == PAYLOAD and server.ranges == [None]
    with pytest.raises(UserError, match="checksum mismatch .* expected sha256 00ff"):
        downloading.fetch(server.url + "/a.bin", str(tmp_path / "b.bin"), sha256="00ff")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]  # nothing half-there


def test_broken_transfer_resumes_with_range_in_the_same_call(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    server.cut_after = 100_000
    dst = tmp_path / "a.bin"
    downloading.fetch(server.url + "/a.bin", str(dst), sha256=SHA)
    assert server.ranges == [None, "bytes=100000-"] and dst.read_bytes() == PAYLOAD
    assert not list(tmp_path.glob("*.partial"))


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    server.cut_after, server.cut_always = 50_000, True   # three tries, each cut short
    dst = tmp_path / "a.bin"
    with pytest.raises(UserError, match="Run again to resume"):
        downloading.fetch(server.url + "/a.bin", str(dst), sha256=SHA)
    partials = list(tmp_path.glob(".a.bin.*.partial"))
    assert not dst.exists() and len(partials) == 1
    assert partials[0].stat().st_size == 150_000
    server.cut_after = None
    downloading.fetch(server.url + "/a.bin", str(dst), sha256=SHA)
    assert server.ranges[-1] == "bytes=150000-" and dst.read_bytes() == PAYLOAD
    assert not list(tmp_path.glob("*.partial"))


def test_server_ignoring_range_restarts(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    dst = tmp_path / "a.bin"
    (tmp_path / ".a.bin.x1y2.partial").write_bytes(b"garbage" * 10)
    server.ignore_range = True
    downloading.fetch(server.url + "/a.bin", str(dst), sha256=SHA)
    assert dst.read_bytes() == PAYLOAD and server.ranges == ["bytes=70-"]


def test_temp_names_are_not_predictable(tmp_path):
    first = downloading._partial_file(str(tmp_path / "x.tar"))
    os.unlink(first)
    second = downloading._partial_file(str(tmp_path / "x.tar"))
    assert first != second and os.path.dirname(first) == str(tmp_path)


def test_unreachable_is_one_clear_error(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: connection refused
    with pytest.raises(UserError, match="could not download .*network reachable"):
        downloading.fetch(f"http://127.0.0.1:{port}/x", str(tmp_path / "x"))
    assert not list(tmp_path.iterdir())


def make_tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_extract_places_only_complete_trees(tmp_path):
    archive = tmp_path / "a.tar.gz"
    make_tar(archive, {"ds/x.txt": b"x", "ds/sub/y.txt": b"y"})
    into = tmp_path / "data"
    assert downloading.extract(str(archive), str(into)) == ["ds"]
    assert (into / "ds" / "sub" / "y.txt").read_bytes() == b"y" and not archive.exists()
    assert sorted(p.name for p in into.iterdir()) == ["ds"]  # no temp dir left


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_member_escaping_the_target_is_a_user_error(tmp_path, kind):
    archive = tmp_path / f"evil.{kind}"
    if kind == "tar":
        make_tar(archive, {"ok.txt": b"ok", "../escaped.txt": b"bad"})
    else:
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("ok.txt", "ok")
            zf.writestr("../escaped.txt", "bad")
    into = tmp_path / "data"
    with pytest.raises(UserError, match="refusing to extract"):
        downloading.extract(str(archive), str(into))
    assert not (tmp_path / "escaped.txt").exists()
    assert list(into.iterdir()) == []  # nothing placed, temp dir removed


def test_truncated_archive_leaves_nothing(tmp_path):
    archive = tmp_path / "a.tar.gz"
    make_tar(archive, {f"ds/{i}.bin": os.urandom(20_000) for i in range(5)})
    archive.write_bytes(archive.read_bytes()[:30_000])
    into = tmp_path / "data"
    with pytest.raises(UserError, match="damaged or incomplete"):
        downloading.extract(str(archive), str(into))
    assert list(into.iterdir()) == []


def waterbirds_tarball(tmp_path):
    """The Stanford DRO tarball's layout, one image per cell: the archive's bytes."""
    from tests.dataset_fixtures import write_waterbirds
    src = tmp_path / "src"
    write_waterbirds(src, per_cell=1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src / "waterbirds" / "waterbird_complete95_forest2water2",
                arcname="waterbird_complete95_forest2water2")
    return buf.getvalue()


def test_download_cli_waterbirds_end_to_end(server, tmp_path, monkeypatch, capsys):
    """The Waterbirds entry: served archive -> the loader's layout -> loadable dataset."""
    from domainbed.datasets.subpopulation import Waterbirds
    server.files["/wb.tar.gz"] = waterbirds_tarball(tmp_path)
    step = download.DATASETS["Waterbirds"][0]
    monkeypatch.setattr(step, "url", server.url + "/wb.tar.gz")
    data = tmp_path / "data"
    download.main(["--data_dir", str(data), "--datasets", "Waterbirds"])
    assert "Waterbirds: done" in capsys.readouterr().out
    ds = Waterbirds(str(data), [1, 2], {"image_size": 8})
    assert [len(e) for e in ds] == [4, 4, 4]
    assert not list((data / "waterbirds").glob(".*"))  # no temp files or dirs left


def test_download_cli_offline_exit_and_manual(tmp_path, monkeypatch, capsys):
    step = download.DATASETS["MetaShift"][0]
    monkeypatch.setattr(step, "url", "http://127.0.0.1:9/metashift.tar.gz")
    with pytest.raises(UserError, match="1 of 2 downloads failed: MetaShift"):
        download.main(["--data_dir", str(tmp_path), "--datasets", "MetaShift", "NICO_Mixed"])
    captured = capsys.readouterr()
    assert "MetaShift: error: could not download" in captured.err
    assert "NICO_Mixed: cannot be downloaded automatically" in captured.out
    assert "NICO/{animal,vehicle}/images/<category>/<context>" in captured.out


def test_wilds_downloads_go_through_a_temp_root(tmp_path, monkeypatch):
    import types

    import wilds

    def fake_get_dataset(name, root_dir, download):
        assert download and os.path.basename(root_dir).startswith(".wilds-")
        folder = os.path.join(root_dir, f"{name}_v1.0")
        os.makedirs(folder)
        open(os.path.join(folder, "RELEASE_v1.0.txt"), "w").close()
        return types.SimpleNamespace(data_dir=folder)

    monkeypatch.setattr(wilds, "get_dataset", fake_get_dataset)
    download.main(["--data_dir", str(tmp_path), "--datasets", "WILDSCamelyon"])
    assert (tmp_path / "camelyon17_v1.0" / "RELEASE_v1.0.txt").exists()
    assert not list(tmp_path.glob(".wilds-*"))

    def failing(name, root_dir, download):
        os.makedirs(os.path.join(root_dir, "half"))
        raise ConnectionError("network unreachable")

    monkeypatch.setattr(wilds, "get_dataset", failing)
    with pytest.raises(UserError, match="1 of 1 downloads failed"):
        download.main(["--data_dir", str(tmp_path), "--datasets", "WILDSFMoW"])
    assert not list(tmp_path.glob(".wilds-*"))


def test_weights_checksum_is_the_hub_prefix():
    sources = weights.weight_sources()
    assert weights.hub_hash_prefix(sources["resnet18"]["url"]) == "f37072fd"
    assert sources["resnet18"]["sha256_prefix"] == "f37072fd"
    for name, source in sources.items():  # every backbone's weights can be fetched
        assert source["url"].startswith("https://") and source["file"], name


def test_weights_download_verifies_and_lands_where_runs_look(tmp_path, monkeypatch):
    calls = []

    def fake_fetch(url, dst, sha256=None):
        calls.append((url, dst, sha256))
        return dst
    monkeypatch.setattr(weights, "fetch", fake_fetch)
    download.main(["--weights", "clip_vit_b16", "resnet34", "--weights_dir", str(tmp_path)])
    (clip_url, clip_dst, clip_sha), (_, r34_dst, r34_sha) = calls
    assert clip_dst == str(tmp_path / "clip_vit_b16_openai.safetensors")
    assert clip_url.endswith(".safetensors") and clip_sha is None  # trust on first use
    assert r34_dst == str(tmp_path / "resnet34-b627a593.pth") and r34_sha == "b627a593"


def test_google_drive_goes_through_gdown_and_the_same_checks(tmp_path, monkeypatch):
    """A Google Drive file is fetched by gdown inside pooch: recorded on first use, a
    changed file refused in one line with nothing left, gdown's failure one line too."""
    gdown = pytest.importorskip("gdown")
    served = {"bytes": b"first"}

    def fake_download(url, output, quiet=True):
        with open(output, "wb") as f:
            f.write(served["bytes"])
        return output
    monkeypatch.setattr(gdown, "download", fake_download)
    url, dst = download.DATASETS["VLCS"][0].url, tmp_path / "VLCS.tar.gz"
    downloading.fetch(url, str(dst), google_drive=True)
    lock = json.loads((tmp_path / downloading.LOCK_FILE).read_text())
    assert lock["VLCS.tar.gz"]["sha256"] == hashlib.sha256(b"first").hexdigest()
    dst.unlink()
    served["bytes"] = b"changed"
    with pytest.raises(UserError, match="checksum mismatch .*recorded in .* got "
                                        + hashlib.sha256(b"changed").hexdigest()):
        downloading.fetch(url, str(dst), google_drive=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [downloading.LOCK_FILE]
    monkeypatch.setattr(gdown, "download", lambda url, output, quiet=True: None)
    with pytest.raises(UserError, match="could not download .*network reachable"):
        downloading.fetch(url, str(dst), google_drive=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [downloading.LOCK_FILE]
