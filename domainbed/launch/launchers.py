"""Command launchers: run a sweep's jobs locally, on several GPUs, on Slurm or on Ray.

A launcher is a callable ``launcher(commands, **options) -> list`` registered by name
in :data:`LAUNCHERS` (built-ins, imported when first used) or with
``@register_launcher("name")``. Each command is a :class:`~domainbed.launch.jobs.Command`:
an argv list (never a shell string) plus the job's output directory. Launchers that wait
for their jobs return one :class:`~domainbed.launch.jobs.Outcome` per command; launchers
that only submit (slurm) return an empty list. Options a launcher does not use are
ignored, so the sweep can pass them all (``max_workers``, ``slurm_partition`` ...).

Where each lives: :mod:`domainbed.launch.jobs` (one job: lock, log, outcome),
:mod:`~domainbed.launch.local` (dummy, local, multi_gpu), :mod:`~domainbed.launch.pooled`,
:mod:`~domainbed.launch.fused`, :mod:`~domainbed.launch.cluster` (slurm, ray).
"""
import importlib
from typing import Any

from oodutils.errors import UnknownNameError

# name -> "module:function"; imported when a sweep first asks for it
BUILTIN = {
    "dummy": "domainbed.launch.local:dummy_launcher",
    "local": "domainbed.launch.local:local_launcher",
    "multi_gpu": "domainbed.launch.local:multi_gpu_launcher",
    "pooled": "domainbed.launch.pooled:pooled_launcher",
    "fused": "domainbed.launch.fused:fused_launcher",
    "slurm": "domainbed.launch.cluster:slurm_launcher",
    "ray": "domainbed.launch.cluster:ray_launcher",
}
LAUNCHERS = dict(BUILTIN)
# the fused launcher's largest group of stacked models (the sweep's --fused_max_models)
FUSED_MAX_MODELS = 64


def register_launcher(name: str) -> Any:
    """Register a launcher function under `name` (a plug-in's own launcher)."""
    def decorator(fn: Any) -> Any:
        LAUNCHERS[name] = fn
        return fn
    return decorator


def get_launcher(name: str) -> Any:
    if name not in LAUNCHERS:
        raise UnknownNameError("command launcher", name, LAUNCHERS)
    launcher = LAUNCHERS[name]
    if isinstance(launcher, str):
        module, function = launcher.split(":")
        launcher = LAUNCHERS[name] = getattr(importlib.import_module(module), function)
    return launcher
