"""Small pieces several algorithm families share (one copy each)."""
from typing import Any

import torch
import torch.nn as nn

from domainbed.hparams import Hparam


def concat(minibatches: list[tuple[torch.Tensor, ...]]) -> tuple[Any, ...]:
    """All inputs and all labels of a list of (x, y) minibatches, in order."""
    return torch.cat([x for x, _ in minibatches]), torch.cat([y for _, y in minibatches])


def domain_labels(minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
    """The index of each example's minibatch (its training domain), as int64."""
    return torch.cat([torch.full((x.shape[0],), i, dtype=torch.int64, device=x.device)
                      for i, (x, _) in enumerate(minibatches)])


def split_rows(tensor: Any, minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
    """Slices of a tensor computed on the concatenated minibatches, one per minibatch."""
    out, start = [], 0
    for x, _ in minibatches:
        out.append(tensor[start:start + x.shape[0]])
        start += x.shape[0]
    return out


class OutputActivation:
    """Applies an activation to a featurizer's output through a forward hook, so the
    featurizer keeps its parameter names (DomainBed adds an `activation` attribute to its
    MLP and MNIST_CNN for URM instead)."""

    def __init__(self, activation: Any) -> None:
        self.activation = activation

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        return self.activation(output)


ACTIVATIONS = {"tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU, "identity": nn.Identity}


def set_output_activation(featurizer: nn.Module, name: str) -> None:
    featurizer.register_forward_hook(OutputActivation(ACTIVATIONS[name]()))


# --- hyperparameter declarations with their valid range (DomainBed's search spaces) ------

def log_uniform(default: Any, low_exp: Any, high_exp: Any, doc: str = "", cast: Any = float) -> Any:
    """Drawn as 10 ** uniform(low_exp, high_exp); valid from 10**low_exp (or the default,
    when DomainBed's default lies outside its search range) to 10**high_exp."""
    return Hparam(default, lambda r: cast(10 ** r.uniform(low_exp, high_exp)), doc,
                  low=min(default, 10 ** low_exp), high=max(default, 10 ** high_exp))


def uniform(default: Any, low: Any, high: Any, doc: str = "", cast: Any = float) -> Any:
    return Hparam(default, lambda r: cast(r.uniform(low, high)), doc,
                  low=min(default, low), high=max(default, high))


def choice(default: Any, options: Any, doc: str = "") -> Any:
    """Drawn uniformly from `options` (numpy's RandomState.choice, as DomainBed). Valid
    values: booleans and strings as listed (plus the default); numbers anywhere between the
    smallest and largest option or default, or any non-negative value when DomainBed
    searches a single value (a user may still set another)."""
    options = list(options)
    values = options + [default]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        low, high = min(values), max(values)
        if low == high:
            low, high = min(0, low), None
        return Hparam(default, lambda r: r.choice(options).item(), doc, low=low, high=high)
    return Hparam(default, lambda r: r.choice(options).item(), doc,
                  choices=tuple(dict.fromkeys(values)))


def fixed(default: Any, doc: str = "", low: Any = None, high: Any = None) -> Any:
    """A hyperparameter DomainBed never searches over: always the default when drawn.
    Booleans may be either value; numbers are valid within [low, high]."""
    if isinstance(default, bool):
        return Hparam(default, lambda r: default, doc, choices=(False, True))
    if isinstance(default, str):
        return Hparam(default, lambda r: default, doc, choices=(default,))
    return Hparam(default, lambda r: default, doc,
                  low=min(0, default) if low is None else low, high=high)
