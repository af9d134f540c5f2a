"""The generation CLI: layout, manifest, resume after interruptions, the caption-filter
loop (with a fake captioner), and clear errors on bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from oodutils.errors import UnknownNameError, UserError
from spawrious.backends import ProceduralBackend
from spawrious.caption import CallableCaptioner, caption_passes
from spawrious.constants import BREEDS, LOCATIONS
from spawrious.generate import generate_filtered, main, prepare_output
from spawrious.layout import list_images, manifest_path
from spawrious.manifest import read_manifest, read_records, reconcile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files(root):
    out = {}
    for base, _, names in os.walk(os.path.join(root, "spawrious224")):
        for n in names:
            if n.endswith(".png"):
                with open(os.path.join(base, n), "rb") as f:
                    out[os.path.relpath(os.path.join(base, n), root)] = f.read()
    return out


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "spawrious.generate", *args],
                          capture_output=True, text=True, cwd=REPO)


def test_cli_contract_layout_and_manifest(tmp_path):
    root = tmp_path / "ROOT"
    r = _cli("--backend", "procedural", "--out", str(root), "--per-cell", "2", "--seed", "5",
             "--size", "32")
    assert r.returncode == 0, r.stderr
    for pool in (0, 1):
        for loc in LOCATIONS:
            for breed in BREEDS:
                names = list_images(root / "spawrious224" / str(pool) / loc / breed)
                assert names == ["procedural_000000.png", "procedural_000001.png"]
    image = Image.open(root / "spawrious224" / "0" / "beach" / "corgi" / "procedural_000000.png")
    assert image.size == (32, 32) and image.mode == "RGB"
    records = read_manifest(str(root / "spawrious224"))
    assert len(records) == 96 and all(r["status"] == "kept" for r in records)
    rec = records[0]
    for key in ("prompt", "fur", "pose", "time_of_day", "seed", "backend", "caption", "file"):
        assert key in rec
    assert os.path.isfile(root / "spawrious224" / rec["file"])
    info = json.load(open(root / "spawrious224" / "info.json"))
    assert info["per_cell"] == 2 and info["seed"] == 5 and info["backend"] == "procedural"
    # the splits CLI reads what the generator wrote
    r = subprocess.run([sys.executable, "-m", "spawrious.splits", "--root", str(root),
                        "--benchmark", "m2m_easy", "--per-cell", "2", "--summary", "csv"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 + 16


def _gen(root, per_cell, seed=0, **kw):
    argv = ["--out", str(root), "--per-cell", str(per_cell), "--seed", str(seed), "--size", "24",
            "--pools", "0", "--locations", "beach", "--breeds", "corgi", "bulldog",
            "--workers", "1"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return main(argv)


def test_deterministic_and_resumes_without_duplicates(tmp_path):
    clean, broken = tmp_path / "clean", tmp_path / "broken"
    _gen(clean, 4)
    _gen(broken, 4)
    assert _files(clean) == _files(broken)
    ds = broken / "spawrious224"
    cell = ds / "0" / "beach" / "corgi"
    mpath = manifest_path(str(ds), 0, "beach", "corgi")
    # a run killed after writing image 3 but before recording it, with a half-written
    # temp file and a truncated manifest line
    records, _ = read_records(mpath)
    with open(mpath, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records[:3]) + '{"attempt": 3, "fi')
    (cell / ".tmp-abcd").write_bytes(b"\x89PNG partial")
    _gen(broken, 4)
    assert _files(clean) == _files(broken)
    assert not any(n.startswith(".tmp-") for n in os.listdir(cell))
    records, bad = read_records(mpath)
    assert bad == 0 and [r["attempt"] for r in records] == [0, 1, 2, 3]
    # an image lost after it was recorded: the record goes, a new attempt replaces it
    os.unlink(cell / "procedural_000001.png")
    _gen(broken, 4)
    names = list_images(cell)
    assert len(names) == 4 and "procedural_000004.png" in names
    records, _ = read_records(mpath)
    assert sorted(r["file"].split("/")[-1] for r in records) == names
    # extending the count continues where it stopped; rerunning is a no-op
    _gen(broken, 6)
    assert len(list_images(cell)) == 6
    before = _files(broken)
    _gen(broken, 6)
    assert _files(broken) == before
    assert json.load(open(ds / "info.json"))["per_cell"] == 6


def test_settings_mismatch_and_bad_input(tmp_path):
    _gen(tmp_path / "a", 1)
    with pytest.raises(UserError, match="seed"):
        _gen(tmp_path / "a", 1, seed=9)
    with pytest.raises(UserError, match="size"):
        main(["--out", str(tmp_path / "a"), "--per-cell", "1", "--size", "32", "--pools", "0",
              "--locations", "beach", "--breeds", "corgi"])
    with pytest.raises(UnknownNameError, match="valid breeds"):
        main(["--out", str(tmp_path / "b"), "--breeds", "poodle"])
    with pytest.raises(UnknownNameError, match="valid locations"):
        main(["--out", str(tmp_path / "b"), "--locations", "moon"])
    with pytest.raises(UnknownNameError, match="valid pools"):
        main(["--out", str(tmp_path / "b"), "--pools", "2"])
    with pytest.raises(UnknownNameError, match="valid backends"):
        main(["--out", str(tmp_path / "b"), "--backend", "dalle"])
    with pytest.raises(UserError, match="parent"):
        main(["--out", str(tmp_path / "no" / "such" / "dir"), "--per-cell", "1"])
    with pytest.raises(UserError, match="does not exist"):
        main(["--out", str(tmp_path / "c"), "--backend", "sd14", "--model",
              str(tmp_path / "no-model")])
    r = _cli("--out", str(tmp_path / "d"), "--breeds", "poodle")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown breed 'poodle'")
    r = _cli("--out", str(tmp_path / "e"), "--backend", "sd14", "--model", "/no/such/model")
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_caption_keyword_match():
    assert caption_passes("a dog sitting on a beach", ["dog"])
    assert caption_passes("A Dog, on snow", ["dog"])
    assert not caption_passes("two dogs on a beach", ["dog"])
    assert not caption_passes("a hotdog stand", ["dog"])
    assert caption_passes("a cat", ["*"]) and not caption_passes("", ["*"])


class _CountingBackend(ProceduralBackend):
    """The procedural backend that flags every `nsfw_every`-th image as NSFW."""

    def __init__(self, size, nsfw_every=0):
        super().__init__(size)
        self.calls, self.nsfw_every, self.seen = 0, nsfw_every, 0

    def generate(self, specs, seeds):
        self.calls += 1
        out = []
        for image, info in super().generate(specs, seeds):
            self.seen += 1
            if self.nsfw_every and self.seen % self.nsfw_every == 0:
                out.append((None, {"nsfw": True}))
            else:
                out.append((image, info))
        return out


def _filtered(tmp_path, captioner, per_cell, max_attempts, backend=None):
    backend = backend or _CountingBackend(24)
    ds = prepare_output(tmp_path / "f", backend.name, 0, backend.settings(), per_cell)
    generate_filtered(ds, backend, 0, per_cell, [(0, "snow", "dachshund")], captioner, ["dog"],
                      max_attempts, lambda m: None)
    return ds, read_records(manifest_path(ds, 0, "snow", "dachshund"))[0]


def test_filter_keeps_only_matching_captions(tmp_path):
    calls = []

    def fake(image):
        calls.append(image.size)
        return "a dog in the snow" if len(calls) % 3 else "a snowy field"
    ds, records = _filtered(tmp_path, CallableCaptioner(fake), per_cell=5, max_attempts=50)
    kept = [r for r in records if r["status"] == "kept"]
    rejected = [r for r in records if r["status"] == "rejected"]
    assert len(kept) == 5 and len(rejected) == 2
    assert all(r["reason"] == "caption" and r["file"] is None for r in rejected)
    assert all(r["caption"] == "a snowy field" for r in rejected)
    assert sorted(r["file"].split("/")[-1] for r in kept) == \
        list_images(os.path.join(ds, "0", "snow", "dachshund"))
    assert calls == [(24, 24)] * 7
    state = reconcile(ds, 0, "snow", "dachshund", "procedural")
    assert state.kept == 5 and state.attempts == 7 and state.next_attempt == 7


def test_filter_gives_up_with_the_cell_named(tmp_path):
    with pytest.raises(UserError, match=r"pool=0 location=snow breed=dachshund: kept 0 of 3 "
                                        r"images after 8 attempts"):
        _filtered(tmp_path, CallableCaptioner(lambda im: "a white cat"), per_cell=3, max_attempts=8)
    records = read_records(manifest_path(str(tmp_path / "f" / "spawrious224"), 0, "snow",
                                         "dachshund"))[0]
    assert len(records) == 8 and {r["reason"] for r in records} == {"caption"}


def test_filter_regenerates_nsfw_images(tmp_path):
    backend = _CountingBackend(24, nsfw_every=2)
    ds, records = _filtered(tmp_path, CallableCaptioner(lambda im: "dog"), per_cell=4,
                            max_attempts=40, backend=backend)
    assert sum(r["status"] == "kept" for r in records) == 4
    nsfw = [r for r in records if r["reason"] == "nsfw"]
    assert nsfw and all(r["file"] is None for r in nsfw)
    assert len(list_images(os.path.join(ds, "0", "snow", "dachshund"))) == 4


def test_render_chunk_writes_full_size_images(tmp_path):
    """The worker writes one 224 px RGB PNG per attempt (its speed is a benchmark figure:
    scripts/bench_spawrious_render.py)."""
    from spawrious.generate import _render_chunk
    ds = prepare_output(tmp_path / "t", "procedural", 0, {"size": 224}, 2)
    _, _, _, _, records = _render_chunk((ds, 0, 224, 0, "jungle", "labrador", [0, 1]))
    assert [r["file"] for r in records] == [
        os.path.join("0", "jungle", "labrador", f"procedural_{k:06d}.png") for k in (0, 1)]
    for k in (0, 1):
        image = np.asarray(Image.open(os.path.join(ds, "0", "jungle", "labrador",
                                                   f"procedural_{k:06d}.png")))
        assert image.shape == (224, 224, 3)
