"""How far the convolution layout moves ARM from DomainBed's golden outputs.

    python scripts/arm_layout_parity.py [PATH/TO/golden_zoo.json] [--threads 1]

Replays golden_zoo.json's ARM case (DomainBed's init state, three updates on its
minibatches under its seeding protocol, then predict on its probe) with our ARM twice:
in the contiguous layout DomainBed ran, and in channels-last, the layout our training
loop picks on a CPU (`--memory_format auto`). Prints, per layout, the losses and the
largest difference of the predictions from DomainBed's, then the largest difference of
every layer's output between the two layouts in the first forward pass, in the order
they run: the first one listed is where the two computations part.

Measured on the 2-core development machine (torch 2.14.1, one thread): contiguous is
bit-identical to DomainBed's outputs; channels-last parts at the context net's first
convolution (7e-7 at |x| <= 2.9: three float32 ulps) and ends 1.6e-4 away after three
Adam steps (its first step amplifies round-off in near-zero gradients up to the lr). DomainBed's
own ARM put in channels-last gives the same numbers as ours there.
"""
import argparse
import base64
import json
import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from domainbed import registry  # noqa: E402

DEFAULT_ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                           "domainbed_golden", "golden_zoo.json")


def decode(values, shape):
    if isinstance(values, str):
        array = np.frombuffer(base64.b64decode(values), "<f4")
    else:
        array = np.asarray(values, dtype=np.float32)
    return torch.tensor(array.reshape(shape), dtype=torch.float32)


def seed_all(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def build(case, layout):
    seed_all(0)
    shape = tuple(case["input_shape"])
    algorithm = registry.get_algorithm_class("ARM")(shape, case["num_classes"],
                                                    case["num_domains"], dict(case["hparams"]))
    state = {name: decode(values, shape) for name, shape, values in case["init_state"]}
    for alias, name in (case.get("init_state_aliases") or {}).items():
        state[alias] = state[name]
    algorithm.load_state_dict(state, strict=False)
    return algorithm.to(memory_format=layout)


def minibatches(case, i, layout):
    shape = case["input_shape"]
    return [(decode(x, [len(y)] + shape).to(memory_format=layout), torch.tensor(y))
            for x, y in case["minibatches"][i]]


def replay(case, layout, layer_outputs=None):
    """Three updates and predict; `layer_outputs` collects the first forward's layers."""
    algorithm = build(case, layout)
    def keep(name):
        def hook(module, inputs, output):
            layer_outputs.setdefault(name, output.detach().clone())
        return hook

    hooks = []
    if layer_outputs is not None:
        hooks = [module.register_forward_hook(keep(name))
                 for name, module in algorithm.named_modules()
                 if name and not list(module.children())]
    losses = []
    for i in range(len(case["update_outputs"])):
        seed_all(1000 + i)
        losses.append(algorithm.update(minibatches(case, i, layout), None)["loss"])
        for hook in hooks:
            hook.remove()
        hooks = []
    algorithm.eval()
    with torch.no_grad():
        probe = decode(case["probe_x"], [-1] + case["input_shape"]).to(memory_format=layout)
        return losses, algorithm.predict(probe).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("zoo", nargs="?", default=DEFAULT_ZOO)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not os.path.isfile(args.zoo):
        sys.exit(f"error: no golden_zoo.json at {args.zoo}")
    torch.set_num_threads(args.threads)
    with open(args.zoo) as f:
        case = json.load(f)["updates"]["ARM"]
    expected = np.asarray(case["predict_after"])
    layers = {}
    for label, layout in (("contiguous", torch.contiguous_format),
                          ("channels-last", torch.channels_last)):
        layers[label] = {}
        losses, logits = replay(case, layout, layers[label])
        print(f"{label:>14}: losses {losses}; predict vs DomainBed: max |diff| "
              f"{np.abs(logits - expected).max():.3g}")
    print("first forward, channels-last vs contiguous, per layer in running order:")
    for name, out in layers["contiguous"].items():
        diff = (out - layers["channels-last"][name]).abs().max().item()
        print(f"  {name:<28} max |diff| {diff:.3g}  (max |x| {out.abs().max().item():.3g})")


if __name__ == "__main__":
    main()
