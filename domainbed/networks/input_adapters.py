"""What the datasets feed, turned into what a pretrained backbone was trained on: images
re-normalized for weights trained on another normalization than ImageNet's, and
ColoredMNIST's two colour channels as RGB photographs."""
from typing import Any

import torch
import torch.nn as nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _Renormalized(nn.Module):
    """A network trained on another normalization than ImageNet's, fed the
    ImageNet-normalized images the datasets give (re-normalized on the way in)."""
    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, network: nn.Module, spec: Any, attribute: str = "network") -> None:
        super().__init__()
        self.attribute = attribute  # CLIP's tower is `visual`, the name in its state dicts
        self.add_module(attribute, network)
        scale = torch.tensor(IMAGENET_STD) / torch.tensor(spec.std)
        shift = (torch.tensor(IMAGENET_MEAN) - torch.tensor(spec.mean)) / torch.tensor(spec.std)
        self.register_buffer("scale", scale.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", shift.view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.attribute)(x * self.scale + self.shift)


def _takes_imagenet_inputs(network: nn.Module, spec: Any) -> Any:
    """The network as the datasets feed it: re-normalized where its weights need that."""
    if (tuple(spec.mean), tuple(spec.std)) == (IMAGENET_MEAN, IMAGENET_STD):
        return network
    return _Renormalized(network, spec, "visual" if spec.family == "open_clip" else "network")


class TwoColourToRGB(nn.Module):
    """ColoredMNIST's two-channel digits as the RGB photographs a pretrained backbone was
    trained on: channel 0 becomes red, channel 1 green, blue stays 0 (pixel values in
    [0, 1], as the dataset gives them), bilinearly upsampled to `size` px and normalized
    with ImageNet's mean and std (the input every zoo backbone takes)."""
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, size: Any) -> None:
        super().__init__()
        self.size = size
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rgb = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)
        rgb = nn.functional.interpolate(rgb, size=(self.size, self.size), mode="bilinear",
                                        align_corners=False)
        return (rgb - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"red, green, blue=0; bilinear to {self.size} px; ImageNet normalization"


def takes_two_colours(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> Any:
    """Two-channel images (ColoredMNIST) fed to pretrained weights go through
    TwoColourToRGB; a randomly initialized network adapts its stem to two channels."""
    return len(input_shape) == 3 and input_shape[0] == 2 and bool(hparams.get("pretrained"))
