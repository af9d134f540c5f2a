"""Whole pretrained classifiers of the backbone zoo (ImageNet head included) and the
preprocessing their weights expect: to check that weights on disk are what they claim
(an ImageNet photo gets its ImageNet class) and to use them outside a training run."""
from typing import Any

from domainbed.networks.backbones import (
    CLASSIFIERS,
    PRETRAINED_INPUT_SIZE,
    backbone_name,
    get_spec,
    locate_weights,
)
from oodutils.errors import UserError

INPUT_SIZE = PRETRAINED_INPUT_SIZE
CROP_FRACTION = 0.875  # resize to 256, center-crop 224: the usual ImageNet evaluation


def preprocessing(name: str) -> Any:
    """The transform from a PIL image to backbone `name`'s input: resized, center-cropped
    to 224 and normalized as its weights were trained (mean and std of its spec)."""
    spec = get_spec(backbone_name({"backbone": name}))
    from torchvision import transforms  # heavy: only where a pretrained model is used
    return transforms.Compose([
        transforms.Resize(round(INPUT_SIZE / CROP_FRACTION)),
        transforms.CenterCrop(INPUT_SIZE),
        transforms.ToTensor(),
        transforms.Normalize(spec.mean, spec.std)])


def pretrained_model(name: str) -> tuple[Any, ...]:
    """(model, transform): backbone `name`'s whole pretrained classifier in eval mode, its
    weights found on disk as a run finds them (UserError where they are not), and
    ``preprocessing(name)``."""
    name = backbone_name({"backbone": name})
    spec = get_spec(name)
    if spec.family not in CLASSIFIERS:
        raise UserError(f"backbone {name} has no ImageNet classifier (its weights are an "
                        "image tower only)")
    path = locate_weights(name, {})
    model = CLASSIFIERS[spec.family](spec, (3, INPUT_SIZE, INPUT_SIZE), path)
    return model.eval(), preprocessing(name)
