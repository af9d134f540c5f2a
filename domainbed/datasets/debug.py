"""Tiny random datasets for fast tests (as DomainBed's Debug28 / Debug224)."""
from typing import Any

import torch

from domainbed.datasets.base import MultipleDomainDataset, TensorEnvironment, fingerprint_arrays
from domainbed.registry import register_dataset


class Debug(MultipleDomainDataset):
    """Random inputs with a learnable signal; labels x a binary attribute form 4 groups."""
    NEEDS_DATA_DIR = False   # random tensors: no files
    N_STEPS = 5
    CHECKPOINT_FREQ = 2
    N_WORKERS = 0
    ENVIRONMENTS = ["0", "1", "2"]
    GROUP_NAMES = ["y0_a0", "y0_a1", "y1_a0", "y1_a1"]
    N_PER_ENV = 48

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        g = torch.Generator().manual_seed(int(data_seed))
        self.input_shape, self.num_classes = self.INPUT_SHAPE, 2
        self.datasets = []
        for e in range(len(self.ENVIRONMENTS)):
            y = torch.randint(0, 2, (self.N_PER_ENV,), generator=g)
            attr = torch.randint(0, 2, (self.N_PER_ENV,), generator=g)
            x = torch.randn(self.N_PER_ENV, *self.INPUT_SHAPE, generator=g) * 0.5
            x[:, 0] += (2 * y - 1).view(-1, *[1] * (len(self.INPUT_SHAPE) - 1)).float()
            ids = torch.arange(self.N_PER_ENV) + e * self.N_PER_ENV
            self.datasets.append(TensorEnvironment(x, y, ids.numpy(), (2 * y + attr).numpy()))
        self.data_source = f"random:{type(self).__name__}"
        self.data_fingerprint = fingerprint_arrays(*[d.x for d in self.datasets])


@register_dataset("Debug28")
class Debug28(Debug):
    INPUT_SHAPE = (3, 28, 28)
    SMALL_IMAGES = True


@register_dataset("Debug224")
class Debug224(Debug):
    INPUT_SHAPE = (3, 224, 224)
    N_PER_ENV = 8
