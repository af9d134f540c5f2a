"""`domainbed-download --source hub`: the Hub mirrors of PACS and Office-Home, written in
DomainBed's folder layout. Offline: the mirror's parquet files are fixtures the tests
write in its schema, served by a local HTTP server standing in for the Hub (HF_ENDPOINT),
with the endpoints the download calls: GET /api/datasets/REPO/revision/REV (the commit and
its files with their LFS sha256, through huggingface_hub), /api/datasets/REPO/tree/COMMIT
(snapshots), and HEAD / GET (with Range) /datasets/REPO/resolve/REV/FILE. A transfer broken
within one process, and a download process killed midway and run again, are resumed with a
Range request from what had arrived."""
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.requirements import need_package

need_package("huggingface_hub")
need_package("datasets")

from domainbed.downloads.hub_mirrors import MIRRORS, write_layout  # noqa: E402
from domainbed.registry import get_dataset_class  # noqa: E402
from tests.hub_fixtures import encoded_png, write_hub_folder  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
COMMIT = MIRRORS["PACS"].revision
FILE = "data/train-00000-of-00001.parquet"
CHUNK = 10 * 1024 * 1024


def _pacs(data_dir):
    hparams = {"image_size": 16, "data_augmentation": False}
    return get_dataset_class("PACS")(str(data_dir), [0], hparams)


def _mirror_fixture(root, noise_side=None):
    """PACS in the mirror's schema, the domains in the mirror's (unsorted) row order."""
    return write_hub_folder(root, domains=("sketch", "photo", "art_painting", "cartoon"),
                            classes=PACS_CLASSES, per_class=2, noise_side=noise_side)


def _folder_fixture(data_dir, rows):
    """The same examples in DomainBed's folder layout (PACS/<domain>/<class>/<k>.png)."""
    for k, (domain, label, _) in enumerate(rows):
        folder = data_dir / "PACS" / domain / PACS_CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k}.png").write_bytes(encoded_png((20, 18), (k % 255, 0, 0)))


def test_mirror_schema_gives_domainbeds_environments_and_classes(tmp_path):
    rows = _mirror_fixture(tmp_path / "mirror")
    counts = write_layout("PACS", MIRRORS["PACS"], [tmp_path / "mirror" / FILE],
                          tmp_path / "from_hub")
    _folder_fixture(tmp_path / "from_folders", rows)
    hub, folders = _pacs(tmp_path / "from_hub"), _pacs(tmp_path / "from_folders")
    assert hub.environment_dirs == folders.environment_dirs == list(PACS_DOMAINS)
    assert hub.classes == folders.classes == list(PACS_CLASSES)
    assert [len(e) for e in hub] == [len(e) for e in folders] == [14] * 4
    for a, b in zip(hub, folders):
        assert a.y.tolist() == b.y.tolist()
    assert counts == {d: 14 for d in PACS_DOMAINS}
    assert sorted(np.unique(hub[2].y).tolist()) == list(range(7))


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The Hub's endpoints for one dataset repository (set on the server object)."""

    def log_message(self, *args):
        pass

    def _file(self):
        prefix = f"/datasets/{self.server.repo}/resolve/"
        if not self.path.startswith(prefix):
            return None
        revision, _, name = self.path[len(prefix):].partition("/")
        return self.server.files.get(name) if revision in (COMMIT, "main") else None

    def do_GET(self):
        self.server.seen.append(("GET", self.path, self.headers.get("Range")))
        if self.path.startswith(f"/api/datasets/{self.server.repo}/revision/"):
            body = json.dumps({"id": self.server.repo, "sha": COMMIT, "private": False,
                               "siblings": [{"rfilename": n, "size": len(d),
                                             "lfs": {"sha256": hashlib.sha256(d).hexdigest(),
                                                     "size": len(d), "pointerSize": 134}}
                                            for n, d in self.server.files.items()]})
            return self._send(200, body.encode(), {"Content-Type": "application/json"})
        if self.path.startswith(f"/api/datasets/{self.server.repo}/tree/{COMMIT}"):
            body = json.dumps([{"type": "file", "path": n, "size": len(d),
                                "oid": hashlib.sha1(d).hexdigest(),
                                "lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d),
                                        "pointerSize": 134}}
                               for n, d in self.server.files.items()])
            return self._send(200, body.encode(), {"Content-Type": "application/json"})
        data = self._file()
        if data is None:
            return self._send(404, b"not found", {})
        start = int(self.headers["Range"].split("=")[1].split("-")[0]) \
            if self.headers.get("Range") else 0
        if self.server.stall_at and not start:   # a transfer that hangs part way
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:self.server.stall_at])
            self.wfile.flush()
            self.server.release.wait(120)
            self.close_connection = True
            return
        if self.server.cut_at and not start:   # a transfer that breaks part way
            cut, self.server.cut_at = self.server.cut_at, None
            self.send_response(200)
            for key, value in self._headers(data).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(206 if start else 200, data[start:], self._headers(data, start))

    def do_HEAD(self):
        self.server.seen.append(("HEAD", self.path, None))
        data = self._file()
        if data is None:
            return self._send(404, b"", {}, body=False)
        self._send(200, data, self._headers(data), body=False)

    def _headers(self, data, start=0):
        headers = {"X-Repo-Commit": COMMIT,
                   "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        return headers

    def _send(self, status, data, headers, body=True):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


@pytest.fixture
def fake_hub(tmp_path):
    _mirror_fixture(tmp_path / "mirror", noise_side=280)   # about 13 MB
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    server.repo, server.seen, server.cut_at = MIRRORS["PACS"].repo, [], None
    server.stall_at, server.release = None, threading.Event()
    server.files = {FILE: (tmp_path / "mirror" / FILE).read_bytes()}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _download_command(tmp_path, server, cache="hf_home"):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
           "HF_HOME": str(tmp_path / cache), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}
    return [sys.executable, "-m", "domainbed.scripts.download", "--datasets", "PACS",
            "--source", "hub", "--data_dir", str(tmp_path / "data")], env


def _download(tmp_path, server, cache="hf_home"):
    command, env = _download_command(tmp_path, server, cache)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def _file_ranges(server):
    return [r for method, path, r in server.seen if method == "GET" and "/resolve/" in path]


def test_download_from_the_hub_resumes_records_and_checks_each_file(tmp_path, fake_hub):
    assert len(fake_hub.files[FILE]) > CHUNK + 1_000_000
    fake_hub.cut_at = CHUNK + 500_000   # the first transfer breaks after one chunk
    proc = _download(tmp_path, fake_hub)
    assert proc.returncode == 0, proc.stderr
    assert f"PACS: done from {MIRRORS['PACS'].repo}@{COMMIT[:12]}" in proc.stdout
    # resumed from what had arrived, not from 0
    assert _file_ranges(fake_hub) == [None, f"bytes={CHUNK + 500_000}-"]
    assert [len(e) for e in _pacs(tmp_path / "data")] == [14] * 4
    lock = json.loads((tmp_path / "data" / "domainbed_checksums.lock.json").read_text())
    entry = next(v for k, v in lock.items() if k.endswith("train-00000-of-00001.parquet"))
    assert entry["sha256"] == hashlib.sha256(fake_hub.files[FILE]).hexdigest()

    # the mirror's file changes (same revision name): refused in one line
    _mirror_fixture(tmp_path / "changed")
    fake_hub.files = {FILE: (tmp_path / "changed" / FILE).read_bytes() + b"\0"}
    proc = _download(tmp_path, fake_hub, cache="fresh_cache")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "has changed" in line]
    assert len(errors) == 1 and "refused" in errors[0]


def test_a_killed_download_resumes_from_its_partial_file(tmp_path, fake_hub):
    """The download process is killed while the file is half way; run again, it asks the
    Hub only for the bytes its partial file lacks."""
    data = fake_hub.files[FILE]
    fake_hub.stall_at = 3 * 2**20 + 123   # the client writes whole MiB blocks
    command, env = _download_command(tmp_path, fake_hub)
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        partial = None
        for _ in range(1200):
            found = list((tmp_path / "hf_home").rglob("*.partial"))
            if found and found[0].stat().st_size >= 3 * 2**20:
                partial = found[0]
                break
            time.sleep(0.1)
        assert partial is not None, "the first download never got half way"
    finally:
        first.kill()
        first.wait()
    fake_hub.stall_at = None
    fake_hub.release.set()
    kept = partial.stat().st_size
    assert kept == 3 * 2**20
    proc = _download(tmp_path, fake_hub)
    assert proc.returncode == 0, proc.stderr
    assert _file_ranges(fake_hub) == [None, f"bytes={kept}-"]
    # nothing left beside the file: neither the partial nor pooch's temporary file
    assert [p.name for p in partial.parent.iterdir()] == [os.path.basename(FILE)]
    assert [len(e) for e in _pacs(tmp_path / "data")] == [14] * 4
    lock = json.loads((tmp_path / "data" / "domainbed_checksums.lock.json").read_text())
    entry = next(v for k, v in lock.items() if k.endswith("train-00000-of-00001.parquet"))
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_original_failing_names_the_hub(monkeypatch, capsys, tmp_path):
    from domainbed import downloads
    from domainbed.scripts import download
    from oodutils.errors import UserError

    def offline(name, data_dir):
        raise UserError("cannot reach drive.google.com")
    monkeypatch.setattr(downloads, "download_dataset", offline)
    with pytest.raises(UserError):
        download.main(["--datasets", "PACS", "--data_dir", str(tmp_path)])
    assert "--source hub" in capsys.readouterr().err


@pytest.mark.slow
def test_train_on_a_hub_repository_records_the_commit(tmp_path, fake_hub):
    """hf:REPO through huggingface_hub (snapshot at --hf_revision main): the records name
    the repository and the commit the snapshot holds."""
    out = tmp_path / "run"
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{fake_hub.server_port}",
           "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}
    hparams = {"arch": "resnet_small", "pretrained": False, "image_size": 16,
               "batch_size": 4}
    subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset",
                    f"hf:{MIRRORS['PACS'].repo}", "--hf_revision", "main", "--algorithm",
                    "ERM", "--test_envs", "0", "--steps", "1", "--hparams",
                    json.dumps(hparams), "--output_dir", str(out)], cwd=REPO, env=env,
                   check=True, capture_output=True, text=True, timeout=600)
    with open(out / "results.jsonl") as f:
        args = json.loads(f.readlines()[-1])["args"]
    assert args["dataset"] == f"hf:{MIRRORS['PACS'].repo}?revision=main"
    assert args["data_source"] == f"hf:{MIRRORS['PACS'].repo}@{COMMIT}"
    assert args["hf_revision"] == COMMIT
    assert args["env_names"] == list(PACS_DOMAINS)
    # offline, the cache answers: the same environments and fingerprint
    offline = subprocess.run(
        [sys.executable, "-c", "from domainbed.registry import get_dataset_class as g; "
         f"print(g('hf:{MIRRORS['PACS'].repo}?revision=main').ENVIRONMENTS)"],
        cwd=REPO, env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
        capture_output=True, text=True, timeout=300)
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip() == str(list(PACS_DOMAINS))


def test_mirror_domains_map_onto_domainbeds_folders_or_fail_in_one_line(tmp_path):
    from domainbed.downloads.hub_mirrors import domain_folder
    from oodutils.errors import UserError
    office = MIRRORS["OfficeHome"]
    assert domain_folder("OfficeHome", office, "Real_World") == "Real World"
    assert domain_folder("OfficeHome", office, "real world") == "Real World"
    assert domain_folder("PACS", MIRRORS["PACS"], "art_painting") == "art_painting"
    write_hub_folder(tmp_path / "odd", domains=("moon", "sun"), classes=PACS_CLASSES,
                     per_class=1)
    with pytest.raises(UserError, match="the mirror's domain 'moon' is none of"):
        write_layout("PACS", MIRRORS["PACS"], [tmp_path / "odd" / FILE], tmp_path / "data")
    assert not (tmp_path / "data" / "PACS").exists()
    assert not [p for p in os.listdir(tmp_path / "data") if p.startswith(".PACS")]


def test_office_home_class_names_in_another_casing_map_to_domainbeds_folders(tmp_path):
    """The mirror's ClassLabel names, whatever their casing or separators, become
    DomainBed's class folders, so the classes and their indices are the original's."""
    from oodutils.errors import UserError
    office = MIRRORS["OfficeHome"]
    mirror_names = ("alarm clock", "DESK_LAMP", "tv", "toothbrush")
    rows = write_hub_folder(tmp_path / "mirror",
                            domains=("real_world", "art", "CLIPART", "product"),
                            classes=mirror_names, per_class=1)
    counts = write_layout("OfficeHome", office, [tmp_path / "mirror" / FILE],
                          tmp_path / "data")
    assert counts == {"Real World": 4, "Art": 4, "Clipart": 4, "Product": 4}
    folders = sorted(p.name for p in (tmp_path / "data" / "office_home" / "Art").iterdir())
    assert folders == ["Alarm_Clock", "Desk_Lamp", "TV", "ToothBrush"]
    ds = get_dataset_class("OfficeHome")(str(tmp_path / "data"), [0],
                                         {"image_size": 16, "data_augmentation": False})
    assert ds.classes == ["Alarm_Clock", "Desk_Lamp", "TV", "ToothBrush"]
    # each row's class, by DomainBed's index, is the class the mirror labelled it with
    expected = {"alarm clock": "Alarm_Clock", "DESK_LAMP": "Desk_Lamp", "tv": "TV",
                "toothbrush": "ToothBrush"}
    art = [expected[mirror_names[label]] for domain, label, _ in rows if domain == "art"]
    assert sorted(ds.classes[y] for y in ds[0].y.tolist()) == sorted(art)
    write_hub_folder(tmp_path / "odd", domains=("art",), classes=("spaceship",), per_class=1)
    with pytest.raises(UserError, match="the mirror's class 'spaceship' is none of"):
        write_layout("OfficeHome", office, [tmp_path / "odd" / FILE], tmp_path / "data2")
