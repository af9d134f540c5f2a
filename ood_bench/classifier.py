"""Algorithm 1 of OoD-Bench: a label-conditioned environment classifier and its features.

    z = g(x) = Linear(backbone(x)) in R^dim_z (8 by default)
    e_hat = h(z, y) = Linear(z * Linear(onehot(y)))   (2 logits: P or Q)

as the official code's EnvClassifier. Training follows the paper (App. C.2): Adam, fixed
learning rate 3e-4, 2000 steps, minibatches of 32 examples from each side, every class
equally likely within each side, cross-entropy; the checkpoint with the best held-out
accuracy at telling P from Q is kept. Backbones: the paper's MLP (2 x (Linear 390, ReLU))
for MNIST-sized inputs, torchvision ResNet-18/34/50 (optionally ImageNet weights from
disk) for images, or any `domainbed.networks.Featurizer`.
"""
from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from numpy.typing import ArrayLike

from domainbed import networks
from domainbed.hparams import declared_space
from domainbed.networks import TORCHVISION_WEIGHT_FILES, find_pretrained_weights
from ood_bench.data import Part, Sides, fetch, iterate
from oodutils.errors import UserError
from oodutils.log import ProjectWarning

BACKBONES = ("auto", "mlp", "resnet18", "resnet34", "resnet50", "featurizer")
SELECTIONS = ("acc", "loss", "last")


class MLPBackbone(nn.Module):
    """The official MNIST_MLP: flatten, 2 x (Linear(width), ReLU), Xavier-ReLU init."""

    def __init__(self, input_shape: tuple[int, ...], width: int = 390) -> None:
        super().__init__()
        n_in = int(np.prod(input_shape))
        self.net = nn.Sequential(nn.Linear(n_in, width), nn.ReLU(True),
                                 nn.Linear(width, width), nn.ReLU(True))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, gain=nn.init.calculate_gain("relu"))
                nn.init.zeros_(m.bias)
        self.n_outputs = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class TorchvisionResNet(nn.Module):
    """A torchvision ResNet without its last layer; batch norm trained (as the official
    code); inputs with other channel counts get DomainBed's adapted stem."""

    def __init__(self, depth: int, input_shape: tuple[int, ...], pretrained: bool = False,
                 pretrained_path: str = "") -> None:
        super().__init__()
        name = f"resnet{depth}"
        net = getattr(torchvision.models, name)(weights=None)
        if pretrained:
            if not pretrained_path and name not in TORCHVISION_WEIGHT_FILES:
                raise UserError(f"no known weights file for {name}; pass --pretrained_path")
            try:
                path = find_pretrained_weights(name, pretrained_path)
            except UserError as e:
                raise UserError(f"{str(e).split(';')[0]}; download them with `python -m "
                                f"domainbed.scripts.download --weights {name}`, pass "
                                f"--pretrained_path FILE, or train from scratch with "
                                f"--no_pretrained") from None
            net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        if input_shape[0] != 3:
            w = net.conv1.weight.data.clone()
            net.conv1 = nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False)
            for i in range(input_shape[0]):
                net.conv1.weight.data[:, i] = w[:, i % 3]
        self.n_outputs = net.fc.in_features
        net.fc = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def resolve_backbone_name(name: str, dataset: Any) -> str:
    if name != "auto":
        return name
    small = getattr(type(dataset), "SMALL_IMAGES", False) or \
        int(np.prod(dataset.input_shape)) <= 3 * 32 * 32
    return "mlp" if small else "resnet18"


def make_backbone(name: str, dataset: Any, mlp_width: int = 390, pretrained: bool | None = None,
                  pretrained_path: str = "",
                  featurizer_hparams: dict[str, Any] | None = None) -> tuple[nn.Module, str]:
    name = resolve_backbone_name(name, dataset)
    shape = tuple(dataset.input_shape)
    if name == "mlp":
        return MLPBackbone(shape, mlp_width), name
    if name.startswith("resnet"):
        if len(shape) != 3:
            raise UserError(f"{name} needs image inputs (C, H, W), not {shape}")
        use = bool(pretrained) if pretrained is not None else True
        return TorchvisionResNet(int(name[6:]), shape, use, pretrained_path), name
    if name == "featurizer":
        space = declared_space(networks.Networks, type(dataset))
        hp = {k: h.default for k, h in space.items()}
        hp.update(featurizer_hparams or {})
        if pretrained is not None:
            hp["pretrained"] = bool(pretrained)
        if pretrained_path:
            hp["pretrained_path"] = pretrained_path
        return networks.Featurizer(shape, hp), name
    raise UserError(f"unknown backbone {name!r}; valid: {', '.join(BACKBONES)}")


class EnvClassifier(nn.Module):
    """g = Linear(backbone) -> R^dim_z; h(z, y) = Linear(z * Linear(onehot(y))) -> 2 logits."""

    def __init__(self, backbone: Any, num_classes: int, dim_z: int = 8,
                 n_outputs: int = 2) -> None:
        super().__init__()
        self.num_classes, self.dim_z = int(num_classes), int(dim_z)
        self.backbone = backbone
        self.fc = nn.Linear(backbone.n_outputs, dim_z)
        self.y_map = nn.Linear(num_classes, dim_z)
        self.h = nn.Linear(dim_z, n_outputs)
        for m in (self.fc, self.y_map, self.h):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.features(x)
        w = self.y_map(F.one_hot(y, self.num_classes).to(z.dtype))
        return z, self.h(z * w)


def class_balanced_weights(y: ArrayLike) -> torch.Tensor:
    """Sampling weights giving every class of `y` equal total probability."""
    y = np.asarray(y)
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    w = 1.0 / (len(counts) * counts[inverse])
    return torch.from_numpy(w)


@torch.no_grad()
def evaluate(model: EnvClassifier, sides: Sides, device: str | torch.device, batch_size: int = 256,
             n_workers: int = 0) -> tuple[float, float]:
    """(accuracy, cross-entropy) at telling held-out P (label 0) from held-out Q (1), each
    side weighted 1/2."""
    was = model.training
    model.eval()
    accs, losses = [], []
    for side, part in enumerate((sides.out_p, sides.out_q)):
        correct, loss = 0, 0.0
        for x, y in iterate(sides.dataset, part, batch_size, n_workers):
            _, logits = model(x.to(device), y.to(device))
            target = torch.full((len(y),), side, dtype=torch.long, device=logits.device)
            loss += float(F.cross_entropy(logits.float(), target, reduction="sum"))
            correct += int((logits.argmax(1) == side).sum())
        accs.append(correct / len(part))
        losses.append(loss / len(part))
    model.train(was)
    return 0.5 * (accs[0] + accs[1]), 0.5 * (losses[0] + losses[1])


def _better(cand: dict[str, Any], best: dict[str, Any], select: str) -> bool:
    """Checkpoint selection: 'acc' (the paper; ties go to the lower held-out loss),
    'loss' (lowest held-out cross-entropy) or 'last'."""
    if select == "last":
        return True
    if select == "loss":
        return cand["loss"] < best["loss"]
    return cand["acc"] > best["acc"] or (cand["acc"] == best["acc"] and
                                         cand["loss"] < best["loss"])


def train_env_classifier(sides: Sides, backbone: str = "auto", dim_z: int = 8, steps: int = 2000,
                         batch_size: int = 32, lr: float = 3e-4, weight_decay: float = 0.0,
                         eval_every: int = 100, seed: int = 0, device: str = "cpu",
                         mlp_width: int = 390, pretrained: bool | None = None,
                         pretrained_path: str = "",
                         featurizer_hparams: dict[str, Any] | None = None, n_workers: int = 0,
                         select: str = "acc",
                         log: Callable[[str], object] | None = None
                         ) -> tuple[EnvClassifier, dict[str, Any]]:
    """Algorithm 1. Returns (model at the selected held-out checkpoint, log dict)."""
    if select not in SELECTIONS:
        raise UserError(f"--select must be one of {', '.join(SELECTIONS)}, not {select!r}")
    torch.manual_seed(seed)
    net, name = make_backbone(backbone, sides.dataset, mlp_width, pretrained, pretrained_path,
                              featurizer_hparams)
    model = EnvClassifier(net, sides.num_classes, dim_z).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(int(seed))
    weights = [class_balanced_weights(sides.train_p.y), class_balanced_weights(sides.train_q.y)]
    parts = [sides.train_p, sides.train_q]
    e = torch.cat([torch.zeros(batch_size, dtype=torch.long),
                   torch.ones(batch_size, dtype=torch.long)]).to(device)
    acc, val_loss = evaluate(model, sides, device, n_workers=n_workers)
    best: dict[str, Any] = {"acc": acc, "loss": val_loss, "step": 0,
                            "state": copy.deepcopy(model.state_dict())}
    history = [{"step": 0, "val_acc": acc, "val_loss": val_loss}]
    t0, loss_ema = time.time(), None
    model.train()
    for step in range(1, steps + 1):
        xs, ys = [], []
        for part, w in zip(parts, weights):
            keys = torch.multinomial(w, batch_size, replacement=True, generator=gen).numpy()
            xs.append(fetch(sides.dataset, part, keys, n_workers))
            ys.append(torch.from_numpy(part.y[keys]))
        x, y = torch.cat(xs).to(device), torch.cat(ys).to(device)
        _, logits = model(x, y)
        loss = F.cross_entropy(logits, e)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if step % eval_every == 0 or step == steps:
            acc, val_loss = evaluate(model, sides, device, n_workers=n_workers)
            history.append({"step": step, "val_acc": acc, "val_loss": val_loss,
                            "loss_ema": loss_ema})
            if log:
                log(f"step {step}/{steps}: train loss (ema) {loss_ema:.4f}, held-out env "
                    f"acc {acc:.4f}, loss {val_loss:.4f}")
            cand = {"acc": acc, "loss": val_loss, "step": step}
            if _better(cand, best, select):
                best = dict(cand, state=copy.deepcopy(model.state_dict()))
    if not math.isfinite(loss_ema if loss_ema is not None else 0.0):
        warnings.warn("the environment classifier's loss is not finite", ProjectWarning,
                      stacklevel=2)
    model.load_state_dict(best["state"])
    model.eval()
    return model, {"backbone": name, "selected_step": best["step"], "selection": select,
                   "val_acc": best["acc"], "val_loss": best["loss"],
                   "history": history, "train_seconds": round(time.time() - t0, 2)}


@torch.no_grad()
def extract_features(model: EnvClassifier, sides: Sides, split: str = "out", device: str = "cpu",
                     batch_size: int = 256, n_workers: int = 0) -> dict[str, np.ndarray]:
    """Features and labels of both sides: {'z_p', 'y_p', 'z_q', 'y_q', 'ids_p', ...}.

    split: 'out' (held-out examples, the official code's choice), 'train', or 'all'."""
    model.eval()
    out: dict[str, np.ndarray] = {}
    for tag, train, held in (("p", sides.train_p, sides.out_p), ("q", sides.train_q, sides.out_q)):
        if split == "out":
            part = held
        elif split == "train":
            part = train
        elif split == "all":
            part = Part.concat([train, held])
        else:
            raise UserError(f"--extract_split must be out, train or all, not {split!r}")
        zs = [model.features(x.to(device)).float().cpu()
              for x, _ in iterate(sides.dataset, part, batch_size, n_workers)]
        out[f"z_{tag}"] = torch.cat(zs).numpy()
        out[f"y_{tag}"] = part.y.copy()
        out[f"env_{tag}"] = part.env.copy()
        ids = part.index.copy()
        for e in np.unique(part.env):
            env_ids: Any = getattr(sides.dataset[int(e)], "ids", None)
            if env_ids is not None:
                rows = part.env == e
                ids[rows] = np.asarray(env_ids)[part.index[rows]]
        out[f"ids_{tag}"] = ids.astype(np.int64)
    return out
