"""Spawrious (Lynch et al.): generate, split and check the spurious-correlation benchmark.

Modules: constants (factors, phrases, negative prompt), prompts (the 72 prompts per
(breed, location) and seeded sampling), procedural / backgrounds / dogs / raster (the
offline backend), backends (procedural, Stable Diffusion via diffusers), caption (the
ViT-GPT2 keyword filter), generate (CLI: ``python -m spawrious.generate``), manifest
(per-attempt records, crash-safe resume), layout (ROOT/spawrious224/{0,1}/<location>/
<breed>/), splits (the six benchmarks; CLI: ``python -m spawrious.splits``), validate
(Eq. 1 / Eq. 2 correlation checks), testing (tiny offline models for smoke tests).
The DomainBed loaders are ``domainbed.datasets.spawrious`` (SpawriousO2O_easy, ...).
"""
from __future__ import annotations

