"""The text-to-image path end to end with tiny random models built offline from configs:
diffusers' StableDiffusionPipeline (tiny UNet / VAE / CLIP text encoder) and a tiny
ViT-GPT2 captioner, loaded from disk by the real CLI code."""
import os

import pytest

from tests.requirements import need_package

need_package("diffusers")
need_package("transformers")

import torch  # noqa: E402

from oodutils.errors import UserError  # noqa: E402
from spawrious.generate import main  # noqa: E402
from spawrious.layout import list_images, manifest_path  # noqa: E402
from spawrious.manifest import read_records  # noqa: E402


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from spawrious.testing import build_tiny_captioner, build_tiny_sd
    before = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny models: threads only add overhead
    base = tmp_path_factory.mktemp("tiny")
    build_tiny_sd(str(base / "sd"))
    build_tiny_captioner(str(base / "captioner"), word="dog")
    yield str(base / "sd"), str(base / "captioner")
    torch.set_num_threads(before)


def _argv(out, sd, captioner, *extra):
    return ["--backend", "sd14", "--model", sd, "--captioner", captioner, "--out", str(out),
            "--steps", "2", "--sd-resolution", "32", "--size", "32", "--batch-size", "2",
            "--pools", "1", "--locations", "jungle", "--breeds", "bulldog", "--device", "cpu",
            "--local-files-only", *extra]


def test_sd_backend_with_caption_filter_keeps_images(tiny_models, tmp_path):
    sd, captioner = tiny_models
    assert main(_argv(tmp_path, sd, captioner, "--per-cell", "3")) == 0
    ds = os.path.join(tmp_path, "spawrious224")
    names = list_images(os.path.join(ds, "1", "jungle", "bulldog"))
    assert names == ["sd14_000000.png", "sd14_000001.png", "sd14_000002.png"]
    records, bad = read_records(manifest_path(ds, 1, "jungle", "bulldog"))
    assert bad == 0 and len(records) == 3
    for r in records:
        assert r["status"] == "kept" and r["backend"] == "sd14" and r["size"] == 32
        assert r["caption"].split()[0] == "dog"
        assert r["negative_prompt"].startswith("human, blurry")
        assert r["prompt"].startswith("(((one") and "in a jungle" in r["prompt"]
    from PIL import Image
    assert Image.open(os.path.join(ds, "1", "jungle", "bulldog", names[0])).size == (32, 32)
    # resuming a complete cell does nothing; a larger count continues the attempts
    assert main(_argv(tmp_path, sd, captioner, "--per-cell", "4")) == 0
    assert len(list_images(os.path.join(ds, "1", "jungle", "bulldog"))) == 4
    assert [r["attempt"] for r in read_records(manifest_path(ds, 1, "jungle", "bulldog"))[0]] \
        == [0, 1, 2, 3]


def test_caption_filter_cap_names_the_cell(tiny_models, tmp_path):
    sd, captioner = tiny_models
    with pytest.raises(UserError, match=r"pool=1 location=jungle breed=bulldog: kept 0 of 2 "
                                        r"images after 3 attempts.*zebra"):
        main(_argv(tmp_path, sd, captioner, "--per-cell", "2", "--keywords", "zebra",
                   "--max-attempts", "3"))
    records, _ = read_records(manifest_path(os.path.join(tmp_path, "spawrious224"), 1, "jungle",
                                            "bulldog"))
    assert len(records) == 3 and all(r["reason"] == "caption" for r in records)
    assert all(r["caption"].startswith("dog") for r in records)


def test_missing_models_are_clear_errors(tiny_models, tmp_path):
    sd, captioner = tiny_models
    with pytest.raises(UserError, match="Stable Diffusion model path .* does not exist"):
        main(_argv(tmp_path, str(tmp_path / "nope"), captioner, "--per-cell", "1"))
    with pytest.raises(UserError, match="captioner model path .* does not exist"):
        main(_argv(tmp_path, sd, str(tmp_path / "nope"), "--per-cell", "1"))
    with pytest.raises(UserError, match="cannot load Stable Diffusion model"):
        main(_argv(tmp_path, "not-a-local-model", captioner, "--per-cell", "1"))
