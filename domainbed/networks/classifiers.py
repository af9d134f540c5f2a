"""Outside classifiers for `domainbed-evaluate --model NAME [--weights FILE] [--class_map
FILE]`: a model of the backbone zoo (torchvision, timm, open_clip) or a Hugging Face image
classifier saved on disk, made to answer with one logit per class of a dataset.

What a user of the field expects:
- torchvision / timm names (the zoo's, or ``timm:<model>``) are whole classifiers. With
  ``--weights`` the file is the classifier's state dict (the library's own key names) with
  a head for the dataset's classes (a model fine-tuned elsewhere); without it, the zoo's
  ImageNet weights found on disk as a run finds them (1000 outputs).
- open_clip names are image towers: ``--weights`` holds a linear head (``head.weight``,
  ``head.bias``) and optionally the tower (``visual.*``; default: the zoo's tower).
- ``hf:DIR``: a Hugging Face image classifier saved with ``save_pretrained`` (config.json,
  model.safetensors), read from that folder only; inputs re-normalized to its processor's
  mean and std when ``preprocessor_config.json`` gives them.
- ``--class_map FILE``: a JSON list, entry k the model output (or list of outputs) that is
  the dataset's class k (e.g. ImageNet classes for a dataset's classes); a class's logit is
  the log-sum-exp of its outputs. Without it, the outputs must be the dataset's classes.

Weights are read without running code (``read_state_dict``: safetensors or
``torch.load(weights_only=True)``, a hash prefix in the file name checked).
"""
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from domainbed.networks.backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    _build_open_clip,
    _takes_imagenet_inputs,
    _timm_classifier,
    _torchvision_classifier,
    backbone_name,
    get_spec,
    locate_weights,
)
from domainbed.networks.weight_files import file_sha256, read_state_dict
from oodutils.errors import UserError, require
from oodutils.untrusted import open_input, parse_json, read_input

HF_PREFIX = "hf:"
MAX_CLASS_MAP_BYTES = 16 << 20
HF_FILE = "the Hugging Face model file"


class OutsideClassifier(nn.Module):
    """An outside model as an algorithm for evaluation: `predict(x)` gives one logit per
    dataset class (through the class map where given)."""

    def __init__(self, network: Any, class_map: Any = None) -> None:
        super().__init__()
        self.network = network
        self.class_map = class_map

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        out = self.network(x)
        logits = getattr(out, "logits", out)   # Hugging Face models return an output object
        if self.class_map is None:
            return logits
        return torch.stack([torch.logsumexp(logits[:, idx], dim=1) for idx in self.class_map],
                           dim=1)


def read_class_map(path: Any, num_classes: int) -> Any:
    """The --class_map file: a JSON list of num_classes entries, each an output index or a
    non-empty list of them; as a list of index lists."""
    try:
        entries = json.loads(read_input(path, "--class_map", MAX_CLASS_MAP_BYTES))
    except (ValueError, RecursionError) as e:
        reason = " ".join(str(e).split())[:200] if not isinstance(e, RecursionError) \
            else "nested too deeply"
        raise UserError(f"--class_map {path!r} is not JSON ({reason})") from None
    if not isinstance(entries, list) or len(entries) != num_classes:
        raise UserError(f"--class_map {path!r} must be a JSON list of {num_classes} entries "
                        f"(one per class of the dataset), entry k the model output(s) of "
                        f"class k")
    out = []
    for k, entry in enumerate(entries):
        idx = entry if isinstance(entry, list) else [entry]
        if not idx or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                              for i in idx):
            raise UserError(f"--class_map {path!r}: entry {k} must be an output index or a "
                            f"non-empty list of them, got {entry!r}")
        out.append(idx)
    return out


def _last_linear(model: Any) -> tuple[Any, ...]:
    name, linear = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    return name, linear


def _replace_head(model: Any, name: str, n_outputs: int) -> None:
    """The model with its last Linear (`name`) replaced by one with n_outputs."""
    old = model.get_submodule(name)
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    setattr(parent, name.rsplit(".", 1)[-1],
            nn.Linear(old.in_features, n_outputs, bias=old.bias is not None))


def _load_strict(model: Any, state: Any, path: Any) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise UserError(f"weights file {path} does not fit the model: {detail[:300]}") from None


def _whole_classifier(spec: Any, input_shape: tuple[int, ...], weights: Any) -> Any:
    """torchvision / timm: the library's model, with the --weights file's head size."""
    build = _torchvision_classifier if spec.family == "torchvision" else _timm_classifier
    if not weights:
        return build(spec, input_shape, locate_weights(spec.name, {}))
    state = read_state_dict(weights, "--weights")
    model = build(spec, input_shape, None)
    name, _ = _last_linear(model)
    head = state.get(f"{name}.weight")
    if not isinstance(head, torch.Tensor) or head.dim() != 2:
        raise UserError(f"weights file {weights} has no {name}.weight: not a state dict of "
                        f"{spec.model} (its classifier is `{name}`)")
    _replace_head(model, name, head.shape[0])
    _load_strict(model, state, weights)
    return model


class _TowerAndHead(nn.Module):
    def __init__(self, visual: Any, head: Any) -> None:
        super().__init__()
        self.visual, self.head = visual, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.visual(x))


def _tower_and_head(spec: Any, input_shape: tuple[int, ...], weights: Any) -> tuple[Any, ...]:
    """open_clip: (the image tower and the linear head of the --weights file, the zoo's
    weights file the tower was read from: "" when --weights holds the tower)."""
    if not weights:
        raise UserError(f"{spec.name} is an image tower without a classifier: pass --weights "
                        f"FILE with a linear head (head.weight, head.bias; optionally the "
                        f"tower as visual.*)")
    state = read_state_dict(weights, "--weights")
    head = state.get("head.weight")
    if not isinstance(head, torch.Tensor) or head.dim() != 2:
        raise UserError(f"weights file {weights} has no head.weight (a linear head "
                        f"[classes, {spec.name} features])")
    tower = "" if any(k.startswith("visual.") for k in state) else locate_weights(spec.name, {})
    visual, width = _build_open_clip(spec, input_shape, tower or None)
    model = _TowerAndHead(visual, nn.Linear(width, head.shape[0],
                                            bias="head.bias" in state))
    if not tower:
        _load_strict(model, state, weights)
    else:
        _load_strict(model.head, {k[5:]: v for k, v in state.items() if k.startswith("head.")},
                     weights)
    return model, tower


class _Normalized(nn.Module):
    """ImageNet-normalized inputs re-normalized to another mean and std."""
    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, network: Any, mean: Any, std: Any) -> None:
        super().__init__()
        self.network = network
        mean, std = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
        self.register_buffer("scale", (torch.tensor(IMAGENET_STD) / std).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("shift", ((torch.tensor(IMAGENET_MEAN) - mean) / std
                                       ).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x * self.scale + self.shift)


def _hugging_face(folder: str, weights: Any) -> Any:
    if weights:
        raise UserError("a Hugging Face model (hf:DIR) takes its weights from its folder; "
                        "leave out --weights")
    if not os.path.lexists(os.path.join(folder, "config.json")):
        raise UserError(f"{folder!r} is not a saved Hugging Face model (no config.json)")
    if not os.path.lexists(os.path.join(folder, "model.safetensors")):
        raise UserError(f"{folder!r} has no model.safetensors: Hugging Face models are read "
                        f"from safetensors only (a pytorch_model.bin is a pickle)")
    for name in ("config.json", "model.safetensors"):   # a FIFO there: refused, no hang
        open_input(os.path.join(folder, name), HF_FILE, follow=True).close()
    transformers = require("transformers", extra="text")
    try:
        with quiet_transformers(transformers):   # check_loaded says it in one line
            model, info = transformers.AutoModelForImageClassification.from_pretrained(
                folder, local_files_only=True, use_safetensors=True,
                output_loading_info=True)
    except Exception as e:   # a malformed config or safetensors file, an unknown model type
        raise UserError(f"cannot load a Hugging Face image classifier from {folder!r}: "
                        f"{' '.join(str(e).split())[:300] or type(e).__name__}") from None
    check_loaded(folder, model, info)
    processor = os.path.join(folder, "preprocessor_config.json")
    if os.path.lexists(processor):
        config = parse_json(read_input(processor, HF_FILE, MAX_CLASS_MAP_BYTES, follow=True))
        if not isinstance(config, dict):
            raise UserError(f"{processor} is not a JSON object")
        mean, std = config.get("image_mean"), config.get("image_std")
        if config.get("do_normalize", True) and mean and std:
            return _Normalized(model, mean, std)
    return model


@contextlib.contextmanager
def quiet_logger(name: str, level: Any = logging.ERROR) -> Iterator[Any]:
    """A library's logger kept below `level` for the block (its own warnings repeat, in
    many lines, what one error line here says)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextlib.contextmanager
def quiet_transformers(transformers: Any) -> Iterator[Any]:
    """transformers' load report and progress bar kept out of the terminal for the
    block, as they were after it."""
    hf_logging = transformers.utils.logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_logger("transformers"):
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def check_loaded(folder: str, model: Any, info: Any) -> None:
    """A model some of whose weights were not in its file (initialised at random, which
    transformers only warns of) is refused: its scores would be a random model's."""
    missing = list(info.get("missing_keys") or []) + \
        [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []]
    if missing:
        total = len(model.state_dict())
        raise UserError(f"hf:{folder}: {len(missing)} of the model's {total} weights are "
                        f"not in its model.safetensors (e.g. {missing[0]}) and would be "
                        f"random; a model whose weights did not load is never scored")


def _output_width(model: Any) -> Any:
    config = getattr(model, "config", None) or getattr(getattr(model, "network", None),
                                                       "config", None)
    if config is not None and getattr(config, "num_labels", None):
        return int(config.num_labels)
    return _last_linear(model)[1].out_features


def _files_identity(paths: Any) -> dict[str, Any]:
    """weights / weights_sha256 of the model's weight files: one file's name and sha256;
    several (an open_clip head and the zoo's tower) named in order, comma-separated, with
    the sha256 of their "name:sha256" lines (as a text encoder's files are recorded)."""
    if len(paths) == 1:
        return {"weights": os.path.basename(paths[0]), "weights_sha256": file_sha256(paths[0])}
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{os.path.basename(path)}:{file_sha256(path)}\n".encode())
    return {"weights": ",".join(os.path.basename(p) for p in paths),
            "weights_sha256": digest.hexdigest()}


def outside_classifier(name: str, input_shape: tuple[int, ...], num_classes: int, weights: str = "",
                       class_map: Any = None) -> tuple[Any, ...]:
    """(OutsideClassifier, identity entries for the record's args) of model `name`; its
    outputs must be the dataset's num_classes classes, or cover the class map."""
    if name.startswith(HF_PREFIX):
        folder = name[len(HF_PREFIX):]
        network = _hugging_face(folder, weights)
        sources = [os.path.abspath(os.path.join(folder, "model.safetensors"))]
    else:
        spec = get_spec(backbone_name({"backbone": name}))
        if spec.family == "open_clip":
            network, tower = _tower_and_head(spec, tuple(input_shape), weights)
            sources = [weights] + ([tower] if tower else [])
        else:
            network = _whole_classifier(spec, tuple(input_shape), weights)
            sources = [weights or locate_weights(spec.name, {})]
        network = _takes_imagenet_inputs(network, spec)
    width = _output_width(network)
    if class_map is None and width != num_classes:
        raise UserError(f"model {name} has {width} outputs but the dataset has {num_classes} "
                        f"classes: give --weights with a {num_classes}-class head, or "
                        f"--class_map FILE naming the output(s) of each class")
    if class_map is not None and max(max(idx) for idx in class_map) >= width:
        raise UserError(f"--class_map names output {max(max(i) for i in class_map)}, but "
                        f"model {name} has {width} outputs")
    identity = {"model": name, **_files_identity(sources), "class_map": class_map}
    return OutsideClassifier(network.eval(), class_map), identity
