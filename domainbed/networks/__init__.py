"""Featurizers and classifier heads (DomainBed's networks, plus an architecture choice
for small inputs so that a sweep yields a diverse model zoo)."""
import os
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed.hparams import Hparam, small_or_large
from domainbed.networks.backbones import (
    BACKBONE_CHOICES,
    BACKBONES,
    SMALL_ARCHS,
    TRANSFER_MODES,
    Backbone,
    build_featurizer,
)
from domainbed.networks.pretrained import pretrained_model  # noqa: F401 (public)
from domainbed.networks.text import TextFeaturizer
from oodutils.errors import UserError

# Hyperparameters that only set nn.Dropout rates (so fused runs may differ in them).
DROPOUT_HPARAMS = ("mlp_dropout", "resnet_dropout")
ARCHS = SMALL_ARCHS + ("resnet",)


class Networks:
    """Holder of the hyperparameters every network reads (merged into every run's space)."""
    HPARAMS = {
        "arch": small_or_large(
            Hparam("mnist_cnn", lambda r: str(r.choice(SMALL_ARCHS)),
                   "featurizer for small images: mnist_cnn | mlp | resnet_small",
                   choices=ARCHS),
            Hparam("resnet", lambda r: "resnet", "featurizer for large images",
                   choices=ARCHS)),
        "mlp_width": Hparam(256, lambda r: int(2 ** r.uniform(6, 10)), low=1),
        "mlp_depth": Hparam(3, lambda r: int(r.choice([3, 4, 5])), low=2),
        "mlp_dropout": Hparam(0.0, lambda r: float(r.choice([0.0, 0.1, 0.5])), low=0.0,
                              high=1.0),
        "resnet18": Hparam(False, lambda r: False),
        "resnet_dropout": Hparam(0.0, lambda r: float(r.choice([0.0, 0.1, 0.5])), low=0.0,
                                 high=1.0),
        "pretrained": small_or_large(Hparam(False, lambda r: False),
                                     Hparam(True, lambda r: True)),
        "pretrained_path": Hparam("", lambda r: ""),
        "nonlinear_classifier": Hparam(False, lambda r: bool(r.choice([False, False]))),
        # The image backbone (large images); a dataset's BACKBONE_ZOO is its random search's.
        "backbone": lambda dataset_cls: Hparam(
            "auto", lambda r: str(r.choice(getattr(dataset_cls, "BACKBONE_ZOO", ("auto",)))),
            "auto (DomainBed's ResNet-50/18), a name of networks.backbones.BACKBONES, or "
            "timm:<model>", choices=BACKBONE_CHOICES),
        "transfer": Hparam("full", lambda r: "full",
                           "full: fine-tune everything; linear_probe: frozen backbone",
                           choices=TRANSFER_MODES),
    }


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class MLP(nn.Module):
    """DomainBed's MLP (same parameter names, so DomainBed state dicts load)."""

    def __init__(self, n_inputs: Any, n_outputs: int, hparams: dict[str, Any]) -> None:
        super().__init__()
        width = hparams["mlp_width"]
        self.input = nn.Linear(n_inputs, width)
        self.dropout = nn.Dropout(hparams["mlp_dropout"])
        self.hiddens = nn.ModuleList(
            [nn.Linear(width, width) for _ in range(hparams["mlp_depth"] - 2)])
        self.output = nn.Linear(width, n_outputs)
        self.n_outputs = n_outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        x = F.relu(self.dropout(self.input(x)))
        for hidden in self.hiddens:
            x = F.relu(self.dropout(hidden(x)))
        return self.output(x)


class MNIST_CNN(nn.Module):
    """DomainBed's MNIST ConvNet (the IRM paper's architecture with group norm)."""
    n_outputs = 128

    def __init__(self, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 64, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(128, 128, 3, 1, padding=1)
        self.conv4 = nn.Conv2d(128, 128, 3, 1, padding=1)
        self.bn0 = nn.GroupNorm(8, 64)
        self.bn1 = nn.GroupNorm(8, 128)
        self.bn2 = nn.GroupNorm(8, 128)
        self.bn3 = nn.GroupNorm(8, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn0(F.relu(self.conv1(x)))
        x = self.bn1(F.relu(self.conv2(x)))
        x = self.bn2(F.relu(self.conv3(x)))
        x = self.bn3(F.relu(self.conv4(x)))
        return self.avgpool(x).flatten(1)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: Any, c_out: Any, stride: Any) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.GroupNorm(8, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.GroupNorm(8, c_out)
        self.shortcut = Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(8, c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A three-stage residual network for small images (a different inductive bias from
    MNIST_CNN and the MLP, for diverse model zoos)."""
    n_outputs = 128

    def __init__(self, input_shape: tuple[int, ...], widths: Any = (32, 64, 128)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False),
                                  nn.GroupNorm(8, widths[0]), nn.ReLU())
        blocks, c_in = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(_BasicBlock(c_in, w, 1 if i == 0 else 2))
            c_in = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.blocks(self.stem(x))).flatten(1)


TORCHVISION_WEIGHT_FILES = {  # torchvision's IMAGENET1K_V1 files (what DomainBed loads)
    name: spec.file for name, spec in BACKBONES.items() if spec.family == "torchvision"}


def find_pretrained_weights(name: str, explicit_path: str = "") -> Any:
    """A local weights file: the given path, or torch hub's cache. Never downloads."""
    if explicit_path:
        if not os.path.isfile(explicit_path):
            raise UserError(f"pretrained weights file {explicit_path!r} does not exist")
        return explicit_path
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", TORCHVISION_WEIGHT_FILES[name])
    if os.path.isfile(cached):
        return cached
    raise UserError(
        f"pretrained ImageNet weights for {name} are not on disk (looked for {cached}); "
        f"download them with `python -m domainbed.scripts.download --weights {name}`, pass "
        f"--hparams '{{\"pretrained_path\": \"FILE\"}}', or train from scratch with "
        f"--hparams '{{\"pretrained\": false}}'")


class ResNet(Backbone):
    """torchvision ResNet-18/50 without its final layer (DomainBed's ResNet): a zoo backbone
    (see backbones.Backbone for batch norm and transfer modes)."""

    def __init__(self, input_shape: tuple[int, ...], hparams: dict[str, Any]) -> None:
        super().__init__("resnet18" if hparams["resnet18"] else "resnet50", input_shape,
                         hparams)


def Featurizer(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> Any:
    """DomainBed's featurizer choice by input shape; `arch` picks among small-image nets.
    Text datasets declare `text_featurizer` (see domainbed.networks.text)."""
    if "text_featurizer" in hparams:
        return TextFeaturizer(input_shape, hparams)
    if len(input_shape) == 1:
        return MLP(input_shape[0], hparams["mlp_width"], hparams)
    if input_shape[1:3] == (28, 28) or hparams.get("arch", "resnet") in SMALL_ARCHS:
        arch = hparams.get("arch", "mnist_cnn")
        if arch == "mnist_cnn":
            return MNIST_CNN(input_shape)
        if arch == "mlp":
            n_in = int(torch.tensor(input_shape).prod())
            return MLP(n_in, hparams["mlp_width"], hparams)
        if arch == "resnet_small":
            return SmallResNet(input_shape)
        if arch != "resnet":
            raise UserError(f"unknown arch {arch!r}; valid: {', '.join(SMALL_ARCHS)}, resnet")
    return build_featurizer(input_shape, hparams)


def Classifier(in_features: Any, out_features: Any, is_nonlinear: bool = False) -> Any:
    if is_nonlinear:
        return nn.Sequential(
            nn.Linear(in_features, in_features // 2), nn.ReLU(),
            nn.Linear(in_features // 2, in_features // 4), nn.ReLU(),
            nn.Linear(in_features // 4, out_features))
    return nn.Linear(in_features, out_features)
