"""MNIST for ``domainbed.datasets.mnist`` (ColoredMNIST, RotatedMNIST, the OoD-Bench
variant): torchvision's downloader, which holds the files' URLs and md5s."""
import os
import urllib.error
from dataclasses import dataclass
from typing import Any

from domainbed.downloads.sources import Source
from oodutils.errors import UserError


def _torchvision_datasets() -> Any:
    """torchvision.datasets (heavy: imported when MNIST is downloaded or verified)."""
    import torchvision.datasets.utils
    return torchvision.datasets


@dataclass
class TorchvisionMNIST:
    def run(self, data_dir: str) -> None:
        torchvision_datasets = _torchvision_datasets()
        try:
            torchvision_datasets.MNIST(data_dir, train=True, download=True)
            torchvision_datasets.MNIST(data_dir, train=False, download=True)
        except (RuntimeError, urllib.error.URLError, OSError) as e:
            raise UserError(f"could not download MNIST into {data_dir} ({e})") from None

    def verify(self, data_dir: str) -> str:
        """torchvision records MNIST's md5s and checks them at download; again here."""
        torchvision_datasets = _torchvision_datasets()
        resources = torchvision_datasets.MNIST.resources
        raw = os.path.join(data_dir, "MNIST", "raw")
        for name, md5 in resources:
            name = os.path.basename(name)
            if not torchvision_datasets.utils.check_integrity(os.path.join(raw, name), md5):
                raise UserError(f"{os.path.join(raw, name)} is missing or does not match "
                                "torchvision's md5")
        return f"{len(resources)} files match torchvision's md5s"


SOURCES: dict[str, list[Source]] = {"MNIST": [TorchvisionMNIST()]}
