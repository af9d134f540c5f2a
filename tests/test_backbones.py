"""Backbone zoo: every named backbone builds through the real featurizer dispatch with random
weights at a small input and trains (or, for the largest, runs forward); weights load only
from disk (pretrained_path, --weights_dir, torch hub cache) with their sha256 in the run's
args; transfer modes freeze what they should."""
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from domainbed import hparams as hp
from domainbed import networks, run_hparams
from domainbed.algorithms.erm import ERM
from domainbed.datasets.debug import Debug
from domainbed.networks import backbones, weight_files
from oodutils.errors import UserError
from tests.hardening_util import PlantedPickle
from tests.requirements import need_package

REPO = Path(__file__).resolve().parents[1]
# Forward only for the largest networks and deeper twins of a family that trains (resnet18,
# timm:test_vit for ViTs); the others take two training steps.
FORWARD_ONLY = {"resnet34", "resnet50", "resnet101", "vit_b_16", "vgg11_bn", "clip_vit_b16",
                "resnet50_augmix"}


class Tiny32(Debug):
    """Large-image hyperparameters (not SMALL_IMAGES) on 32x32 inputs."""
    INPUT_SHAPE = (3, 32, 32)
    N_PER_ENV = 8
    BACKBONE_ZOO = ("resnet18", "mobilenet_v3_small", "timm:test_vit")


def _hparams(**overrides):
    hparams = hp.draw(run_hparams.hparam_space(ERM, Tiny32), 0)
    hparams.update(pretrained=False, batch_size=4, lr=1e-3)
    hparams.update(overrides)
    return hparams


def _size(name):
    return 28 if "dinov2" in name else 32  # ViT-S/14 needs a multiple of its patch


@pytest.mark.parametrize("name", [*backbones.BACKBONES, "timm:test_vit", "timm:test_convnext"])
def test_each_backbone_builds_and_trains_at_a_small_input(name):
    torch.manual_seed(0)
    shape = (3, _size(name), _size(name))
    algorithm = ERM(shape, 3, 2, _hparams(backbone=name))
    assert isinstance(algorithm.featurizer, backbones.Backbone)
    x, y = torch.randn(4, *shape), torch.tensor([0, 1, 2, 0])
    features = algorithm.featurizer(x)
    assert features.shape == (4, algorithm.featurizer.n_outputs)
    if name in FORWARD_ONLY:
        return
    before = [p.detach().clone() for p in algorithm.featurizer.parameters()]
    for _ in range(2):
        loss = algorithm.update([(x[:2], y[:2]), (x[2:], y[2:])])["loss"]
    assert torch.isfinite(torch.tensor(loss))
    after = list(algorithm.featurizer.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after))


def test_auto_keeps_domainbeds_resnet_choice():
    assert backbones.backbone_name({"backbone": "auto", "resnet18": False}) == "resnet50"
    assert backbones.backbone_name({"backbone": "auto", "resnet18": True}) == "resnet18"
    net = networks.Featurizer((3, 32, 32), _hparams(resnet18=True))
    assert net.n_outputs == 512 and isinstance(net.network.fc, torch.nn.Identity)


def test_linear_probe_freezes_the_backbone_and_trains_the_head():
    torch.manual_seed(0)
    algorithm = ERM((3, 32, 32), 2, 2, _hparams(backbone="resnet18", transfer="linear_probe"))
    algorithm.train()
    bns = [m for m in algorithm.featurizer.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)
    backbone_before = [p.clone() for p in algorithm.featurizer.parameters()]
    head_before = algorithm.classifier.weight.clone()
    stats = bns[0].running_mean.clone()
    x = torch.randn(4, 3, 32, 32) + 2
    algorithm.update([(x, torch.tensor([0, 1, 0, 1]))])
    assert all(torch.equal(b, a) for b, a in zip(backbone_before,
                                                 algorithm.featurizer.parameters()))
    assert not torch.equal(head_before, algorithm.classifier.weight)
    assert torch.equal(stats, bns[0].running_mean)
    features = algorithm.featurizer(x)
    assert torch.equal(features, features.half().float())  # float16 values, as cached


def test_full_transfer_from_pretrained_freezes_batch_norm_only(tmp_path):
    path = tmp_path / "w.pth"
    torch.save(_torchvision_state("mobilenet_v3_small", seed=3), path)
    net = networks.Featurizer((3, 32, 32), _hparams(
        backbone="mobilenet_v3_small", pretrained=True, pretrained_path=str(path))).train()
    assert all(p.requires_grad for p in net.parameters())
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)


def _torchvision_state(name, seed):
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
    return model.state_dict()


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _first_conv(net):
    return next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d)).weight


@pytest.mark.parametrize("where", ["pretrained_path", "weights_dir", "torch_hub_cache"])
def test_weights_load_from_disk_and_their_sha256_is_the_identity(tmp_path, monkeypatch, where,
                                                                 weights_dir):
    name = "mobilenet_v3_small"
    spec = backbones.BACKBONES[name]
    state = _torchvision_state(name, seed=1)
    hparams = _hparams(backbone=name, pretrained=True)
    if where == "pretrained_path":
        path = tmp_path / "anything.pth"
        hparams["pretrained_path"] = str(path)
    elif where == "weights_dir":
        path = tmp_path / spec.file
        weights_dir(tmp_path)
    else:
        monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
        path = Path(torch.hub.get_dir()) / "checkpoints" / spec.file
        path.parent.mkdir(parents=True)
    torch.save(state, path)
    if where != "pretrained_path":  # the hub file name's hash prefix must match the file
        named = path.with_name(f"{name}-{_sha256(path)[:8]}.pth")
        path.rename(named)
        path = named
        monkeypatch.setitem(backbones.BACKBONES, name, dataclasses.replace(spec, file=path.name))
    net = networks.Featurizer((3, 32, 32), hparams)
    torch.testing.assert_close(_first_conv(net), state["features.0.0.weight"])
    identity = backbones.weights_identity((3, 32, 32), hparams)
    assert identity == {"backbone": name, "transfer": "full", "weights": path.name,
                        "weights_sha256": _sha256(path)}


def test_timm_weights_load_from_a_safetensors_file_in_weights_dir(tmp_path, weights_dir):
    import timm
    from safetensors.torch import save_file
    torch.manual_seed(2)
    reference = timm.create_model("test_convnext")
    save_file(reference.state_dict(), str(tmp_path / "test_convnext.safetensors"))
    weights_dir(tmp_path)
    net = networks.Featurizer((3, 32, 32), _hparams(backbone="timm:test_convnext",
                                                    pretrained=True))
    torch.testing.assert_close(_first_conv(net), _first_conv(reference))


def test_missing_weights_is_a_clear_error_naming_the_file_and_where(tmp_path, monkeypatch,
                                                                     weights_dir):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    weights_dir(tmp_path)
    with pytest.raises(UserError) as e:
        networks.Featurizer((3, 32, 32), _hparams(backbone="convnext_tiny", pretrained=True))
    message = str(e.value)
    assert "convnext_tiny-983f1562.pth" in message and str(tmp_path) in message
    assert "pretrained\": false" in message
    with pytest.raises(UserError, match="unknown backbone"):
        backbones.backbone_name({"backbone": "resnet7"})
    with pytest.raises(UserError, match="transfer"):
        networks.Featurizer((3, 32, 32), _hparams(backbone="resnet18", transfer="half"))


def test_densenet_files_with_old_key_names_load(tmp_path):
    """torchvision's published DenseNet files name `norm.1` what today's modules call
    `norm1`: such a file loads (the classifier's keys kept)."""
    state = _torchvision_state("densenet121", seed=3)
    old = {re.sub(r"\.(norm|relu|conv)([12])\.", r".\1.\2.", k): v for k, v in state.items()}
    assert "features.denseblock1.denselayer1.norm.1.weight" in old and "classifier.weight" in old
    torch.save(old, tmp_path / "old_densenet.pth")
    net = networks.Featurizer((3, 32, 32), _hparams(
        backbone="densenet121", pretrained=True,
        pretrained_path=str(tmp_path / "old_densenet.pth")))
    torch.testing.assert_close(_first_conv(net), state["features.conv0.weight"])
    norm1 = next(v for k, v in net.state_dict().items()
                 if k.endswith("denseblock1.denselayer1.norm1.weight"))
    torch.testing.assert_close(norm1, state["features.denseblock1.denselayer1.norm1.weight"])


def test_weight_sources_table_has_file_url_and_checksum():
    for name, source in backbones.WEIGHT_SOURCES.items():
        assert source["file"] and source["url"].startswith("https://"), name
    assert backbones.WEIGHT_SOURCES["resnet50"]["sha256_prefix"] == "0676ba61"
    # OpenAI's TorchScript file cannot be read without running code: safetensors instead
    assert backbones.WEIGHT_SOURCES["clip_vit_b16"]["url"].endswith(".safetensors")


def test_random_search_draws_the_backbone_from_the_datasets_zoo():
    space = run_hparams.hparam_space(ERM, Tiny32)
    assert space["backbone"].default == "auto" and space["transfer"].default == "full"
    drawn = {hp.draw(space, seed)["backbone"] for seed in range(1, 40)}
    assert drawn == set(Tiny32.BACKBONE_ZOO)
    assert {hp.draw(run_hparams.hparam_space(ERM, Debug), s)["backbone"] for s in range(1, 5)} == \
        {"auto"}
    assert "timm:anything" in space["backbone"].choices
    assert "resnet7" not in space["backbone"].choices


@pytest.mark.slow
def test_train_cli_records_the_weights_identity(tmp_path):
    name = "mobilenet_v3_small"
    weights = tmp_path / "weights"
    weights.mkdir()
    # random weights under torchvision's hash-carrying name would fail its sha256-prefix
    # check (they are not torchvision's): hand them over by path instead
    mine = weights / "mine.pth"
    torch.save(_torchvision_state(name, seed=4), mine)
    for env in "CLSV":
        for label in "ab":
            (tmp_path / "VLCS" / env / label).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (8, 8), (40 * i, 80 if label == "a" else 0, 0)).save(
                    tmp_path / "VLCS" / env / label / f"{i}.png")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "VLCS",
           "--algorithm", "ERM", "--data_dir", str(tmp_path), "--output_dir", str(out),
           "--steps", "2", "--weights_dir", str(weights), "--hparams",
           json.dumps({"backbone": name, "image_size": 32, "batch_size": 4,
                       "pretrained_path": str(mine)})]
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "torch_home")}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert record["args"]["weights_sha256"] == _sha256(mine)
    assert record["args"]["backbone"] == name and record["args"]["transfer"] == "full"
    assert "weights_dir" not in record["args"]


def test_dinov2_loads_torch_hubs_original_checkpoint_through_timm(tmp_path, monkeypatch):
    """The hub file (DINOv2's own key names, mask_token, 518 px position embedding) loads
    into timm's ViT-S/14 at a smaller input (position embedding resampled)."""
    import timm
    torch.manual_seed(5)
    original = timm.create_model("vit_small_patch14_dinov2", img_size=518, num_classes=0)
    state = {**original.state_dict(), "mask_token": torch.zeros(1, 384)}
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = Path(torch.hub.get_dir()) / "checkpoints" / "dinov2_vits14_pretrain.pth"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    net = networks.Featurizer((3, 28, 28), _hparams(backbone="dinov2_vits14", pretrained=True))
    torch.testing.assert_close(net.network.patch_embed.proj.weight,
                               original.patch_embed.proj.weight)
    torch.testing.assert_close(net.network.blocks[0].ls1.gamma, original.blocks[0].ls1.gamma)
    assert net.network.pos_embed.shape[1] == 1 + 2 * 2
    assert backbones.weights_identity((3, 28, 28), _hparams(
        backbone="dinov2_vits14", pretrained=True))["weights_sha256"] == _sha256(path)


def test_text_encoders_record_transfer_mode_and_weights_sha256(tmp_path):
    """Hugging Face encoders from a local path: text_finetune is the transfer mode, the
    sha256 of the weight files is the identity (runs on other weights never pool)."""
    transformers = need_package("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=16)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path / "enc")
    hparams = {"text_featurizer": "hf", "text_model": str(tmp_path / "enc"),
               "text_finetune": False, "transfer": "full"}
    weights = tmp_path / "enc" / "model.safetensors"
    expected = hashlib.sha256(f"model.safetensors:{_sha256(weights)}\n".encode()).hexdigest()
    assert backbones.weights_identity((8,), hparams) == {
        "backbone": "text:hf:enc", "transfer": "linear_probe",
        "weights": "model.safetensors", "weights_sha256": expected}
    assert backbones.weights_identity((2, 8), {**hparams, "text_finetune": True})[
        "transfer"] == "full"
    with pytest.raises(UserError, match="text_finetune"):
        backbones.weights_identity((2, 8), {**hparams, "text_finetune": True,
                                            "transfer": "linear_probe"})
    assert backbones.weights_identity((8,), {"text_featurizer": "bow"}) == {}


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torchscript_weight_files_are_refused_without_running_their_code(tmp_path):
    """A TorchScript archive runs its stored code when loaded: refused, with the reason."""
    module = torch.jit.script(torch.nn.Linear(3, 2))
    module.save(str(tmp_path / "scripted.pt"))
    with pytest.raises(UserError, match="runs code") as e:
        weight_files.read_state_dict(str(tmp_path / "scripted.pt"))
    assert "scripted.pt" in str(e.value) and "weights_only=False" not in str(e.value)


def test_pickled_objects_in_weights_files_are_refused_before_they_run(tmp_path):
    target = tmp_path / "victim.txt"
    torch.save({"weight": PlantedPickle(str(target))}, tmp_path / "evil.pth")
    with pytest.raises(UserError, match="tensors only"):
        weight_files.read_state_dict(str(tmp_path / "evil.pth"))
    assert not target.exists()


def test_a_hash_prefix_in_the_file_name_is_checked_before_use(tmp_path):
    state = {"weight": torch.arange(6.0).reshape(2, 3)}
    draft = tmp_path / "draft.pth"
    torch.save(state, draft)
    prefix = _sha256(draft)[:8]
    good = tmp_path / f"linear-{prefix}.pth"
    draft.rename(good)
    torch.testing.assert_close(weight_files.read_state_dict(str(good))["weight"], state["weight"])
    wrong = "0" * 8 if prefix != "0" * 8 else "1" * 8
    bad = tmp_path / f"linear-{wrong}.pth"
    good.rename(bad)
    with pytest.raises(UserError, match=f"sha256 prefix {wrong}"):
        weight_files.read_state_dict(str(bad))
