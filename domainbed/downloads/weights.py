"""Backbone weights: fetched from the URLs of ``domainbed.networks.backbones.WEIGHT_SOURCES``
into torch hub's checkpoints folder (where runs look) or a given folder, checked against
the published sha256 or the prefix in torch hub's file names, recorded on first use
otherwise."""
import os

from domainbed.downloads.fetching import fetch
from domainbed.downloads.sources import verify_file
from oodutils.errors import UserError


def weight_sources() -> dict[str, dict[str, str]]:
    """Every named backbone's published weights (file, URL, checksum): one table, in
    domainbed.networks.backbones, read by both the runs and the download command."""
    from domainbed.networks import backbones  # torch: only when weights are named
    return backbones.WEIGHT_SOURCES


def hub_hash_prefix(url: str) -> str | None:
    stem = os.path.basename(url).rsplit(".", 1)[0]
    return stem.rsplit("-", 1)[1] if "-" in stem else None


def _weights_path(name: str, weights_dir: str) -> tuple[dict[str, str], str]:
    import torch.hub
    source = weight_sources()[name]
    folder = weights_dir or os.path.join(torch.hub.get_dir(), "checkpoints")
    return source, os.path.join(folder, source["file"])


def download_weights(name: str, weights_dir: str = "") -> str:
    """The weights of backbone `name` into `weights_dir` (default: torch hub's checkpoints
    folder, where runs also look), checked against the published sha256 or its prefix."""
    sources = weight_sources()
    if name not in sources:
        raise UserError(f"unknown weights {name!r}; valid: {', '.join(sources)}")
    source, path = _weights_path(name, weights_dir)
    return fetch(source["url"], path, sha256=source["sha256"] or source["sha256_prefix"] or None)


def verify_weights(name: str, weights_dir: str = "") -> str:
    """The weights file of backbone `name` on disk against its published or recorded sha256."""
    source, path = _weights_path(name, weights_dir)
    return verify_file(path, source["url"], source["sha256"] or source["sha256_prefix"] or None)
