"""Generate Spawrious images: ``python -m spawrious.generate``.

    python -m spawrious.generate --backend procedural --output_dir ROOT --per_cell N --seed S
    python -m spawrious.generate --backend sd14 --model PATH_OR_ID --output_dir ROOT --per_cell N

writes ROOT/spawrious224/{0,1}/<location>/<breed>/*.png with N kept images per
(pool, location, breed) cell, a manifest line per attempt (spawrious.manifest) and
ROOT/spawrious224/info.json. Rerunning the same command resumes where it stopped; a
larger --per_cell extends the cells. The caption filter (default on for sd14, off for
procedural) regenerates until every cell has its count, with --max_attempts per cell.
"""
from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from PIL import Image
from tqdm import tqdm

from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.fileio import atomic_write_bytes, atomic_write_json
from oodutils.log import get_logger
from spawrious.backends import Backend, ProceduralBackend, StableDiffusionBackend, check_backend
from spawrious.caption import DEFAULT_CAPTIONER, Captioner, ViTGPT2Captioner, caption_passes
from spawrious.constants import (
    BREEDS,
    CAPTION_KEYWORDS,
    DATASET_DIRNAME,
    LOCATIONS,
    NEGATIVE_PROMPT,
    POOLS,
    check_breed,
    check_location,
    check_pool,
)
from spawrious.layout import INFO_FILE, cell_relpath, read_info
from spawrious.manifest import append_records, image_name, reconcile
from spawrious.procedural import render
from spawrious.prompts import PromptSpec, image_seed, prompt_for_attempt

logger = get_logger(__name__)

EPILOG = epilog_example("spawrious-generate", "spawrious.generate",
                        "--backend procedural --output_dir data --per_cell 50 --seed 0")

CHUNK = 24   # procedural images per worker task


#: what one worker returns: (dataset dir, pool, location, breed, the records it wrote)
ChunkRecords = tuple[str, int, str, str, list[dict[str, Any]]]


def prepare_output(out: str | os.PathLike[str], backend_name: str, seed: int,
                   settings: Mapping[str, Any], per_cell: int) -> str:
    """Create ROOT/spawrious224 (ROOT's parent must exist) and check or write info.json."""
    out = os.path.abspath(os.path.expanduser(os.fspath(out)))
    parent = os.path.dirname(out.rstrip(os.sep)) or os.sep
    if not os.path.isdir(out) and not os.path.isdir(parent):
        raise UserError(f"output directory {out!r} cannot be created: its parent {parent!r} "
                        f"does not exist")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"output path {out!r} exists and is not a directory")
    dataset_dir = os.path.join(out, DATASET_DIRNAME)
    os.makedirs(dataset_dir, exist_ok=True)
    info = read_info(dataset_dir)
    if info is not None:
        for key, value in (("backend", backend_name), ("seed", seed), ("size", settings["size"])):
            if info.get(key) != value:
                raise UserError(f"{dataset_dir} already holds images generated with {key}="
                                f"{info.get(key)!r}, not {value!r}; resume with the same settings "
                                f"or choose another --output_dir")
    new = {"generator": "spawrious.generate", "backend": backend_name, "seed": seed,
           "per_cell": max(per_cell, (info or {}).get("per_cell", 0)), **settings}
    if new != info:
        atomic_write_json(os.path.join(dataset_dir, INFO_FILE), new)
    return dataset_dir


def _record(spec: PromptSpec, seed: int, pool: int, attempt: int, backend: str, size: int,
            file: str | None = None, caption: str | None = None, status: str = "kept",
            reason: str | None = None, negative_prompt: str | None = None) -> dict[str, Any]:
    return {"file": file, "pool": pool, "location": spec.location, "breed": spec.breed,
            "attempt": attempt, "prompt": spec.text, "negative_prompt": negative_prompt,
            "fur": spec.fur, "pose": spec.pose, "time_of_day": spec.time_of_day,
            "tod_index": spec.tod_index, "seed": seed, "backend": backend, "caption": caption,
            "status": status, "reason": reason, "size": size}


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _render_chunk(task: tuple[str, int, int, int, str, str, Sequence[int]]) -> ChunkRecords:
    """Worker: render and atomically write procedural images; return their records."""
    dataset_dir, seed, size, pool, location, breed, attempts = task
    records = []
    for k in attempts:
        spec = prompt_for_attempt(seed, pool, breed, location, k)
        s = image_seed(seed, pool, breed, location, k)
        name = image_name("procedural", k)
        rel = cell_relpath(pool, location, breed, name)
        atomic_write_bytes(os.path.join(dataset_dir, rel),
                           _png_bytes(Image.fromarray(render(spec, s, size))))
        records.append(_record(spec, s, pool, k, "procedural", size, file=rel))
    return dataset_dir, pool, location, breed, records


def _cells(pools: Iterable[int | str], locations: Iterable[str],
           breeds: Iterable[str]) -> list[tuple[int, str, str]]:
    return [(check_pool(p), check_location(loc), check_breed(b))
            for p in pools for loc in locations for b in breeds]


def generate_procedural_fast(dataset_dir: str, seed: int, size: int, per_cell: int,
                             cells: Sequence[tuple[int, str, str]], workers: int,
                             log: Callable[[str], object]) -> int:
    """Every attempt is kept (no filter): render the missing ones in parallel."""
    tasks, manifests = [], {}
    for pool, location, breed in cells:
        state = reconcile(dataset_dir, pool, location, breed, "procedural")
        manifests[(pool, location, breed)] = state.manifest
        need = per_cell - state.kept
        start = state.next_attempt
        todo = list(range(start, start + max(need, 0)))
        for i in range(0, len(todo), CHUNK):
            tasks.append((dataset_dir, seed, size, pool, location, breed, todo[i:i + CHUNK]))
    total = sum(len(t[-1]) for t in tasks)
    if not total:
        log(f"all {len(cells)} cells already hold {per_cell} images")
        return 0
    log(f"rendering {total} procedural images ({len(cells)} cells, {workers} workers)")
    done, t0 = 0, time.time()
    if workers <= 1:
        results: Iterable[ChunkRecords] = map(_render_chunk, tasks)
        pool_ = None
    else:
        pool_ = multiprocessing.get_context("spawn").Pool(workers)   # (no fork)
        results = pool_.imap_unordered(_render_chunk, tasks)
    bar = tqdm(total=total, desc="Spawrious images", unit="img",
               disable=not sys.stderr.isatty())
    try:
        for _, pool, location, breed, records in results:
            append_records(manifests[(pool, location, breed)], records)
            done += len(records)
            bar.update(len(records))
    finally:
        bar.close()
        if pool_ is not None:
            pool_.terminate()
            pool_.join()
    log(f"wrote {done} images in {time.time() - t0:.1f}s")
    return done


def generate_filtered(dataset_dir: str, backend: Backend, seed: int, per_cell: int,
                      cells: Sequence[tuple[int, str, str]], captioner: Captioner | None,
                      keywords: Iterable[str], max_attempts: int,
                      log: Callable[[str], object]) -> int:
    """The regenerate-until-count loop: caption every image, keep those whose caption
    has a keyword, stop a cell with a UserError after `max_attempts` attempts."""
    written = 0
    negative = getattr(backend, "negative_prompt", None)
    batch = getattr(backend, "batch_size", 4)
    for pool, location, breed in cells:
        state = reconcile(dataset_dir, pool, location, breed, backend.name)
        kept, attempts, k = state.kept, state.attempts, state.next_attempt
        while kept < per_cell:
            if attempts >= max_attempts:
                raise UserError(
                    f"cell pool={pool} location={location} breed={breed}: kept {kept} of "
                    f"{per_cell} images after {attempts} attempts (--max_attempts "
                    f"{max_attempts}); the caption filter (keywords: {', '.join(keywords)}) "
                    f"rejected the rest: check the models or raise --max_attempts")
            n = min(batch, max_attempts - attempts, per_cell - kept)
            ks = list(range(k, k + n))
            specs = [prompt_for_attempt(seed, pool, breed, location, a) for a in ks]
            seeds = [image_seed(seed, pool, breed, location, a) for a in ks]
            results = backend.generate(specs, seeds)
            images = [im for im, _ in results if im is not None]
            captions = iter(captioner.caption(images) if captioner is not None else [])
            records = []
            for a, spec, s, (image, _info) in zip(ks, specs, seeds, results):
                common: dict[str, Any] = dict(negative_prompt=negative)
                if image is None:
                    records.append(_record(spec, s, pool, a, backend.name, backend.size,
                                           status="rejected", reason="nsfw", **common))
                    continue
                caption = next(captions) if captioner is not None else None
                if captioner is not None and not caption_passes(caption, keywords):
                    records.append(_record(spec, s, pool, a, backend.name, backend.size,
                                           caption=caption, status="rejected", reason="caption",
                                           **common))
                elif kept >= per_cell:
                    records.append(_record(spec, s, pool, a, backend.name, backend.size,
                                           caption=caption, status="rejected", reason="surplus",
                                           **common))
                else:
                    rel = cell_relpath(pool, location, breed, image_name(backend.name, a))
                    atomic_write_bytes(os.path.join(dataset_dir, rel), _png_bytes(image))
                    records.append(_record(spec, s, pool, a, backend.name, backend.size,
                                           file=rel, caption=caption, **common))
                    kept += 1
                    written += 1
            append_records(state.manifest, records)
            attempts += n
            k += n
        log(f"cell {pool}/{location}/{breed}: {kept} images ({attempts} attempts)")
    return written


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="spawrious-generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    add_option(p, "--backend", default="procedural", help="procedural (default) | sd14")
    add_option(p, "--output_dir", "--out", "--output", dest="out",
                  required=True, help="ROOT: images go to ROOT/spawrious224/...")
    add_option(p, "--per_cell", type=int, default=3168,
                  help="kept images per (pool, location, breed) cell (default 3168)")
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--pools", nargs="+", default=[str(p) for p in POOLS])
    add_option(p, "--locations", nargs="+", default=list(LOCATIONS))
    add_option(p, "--breeds", nargs="+", default=list(BREEDS))
    add_option(p, "--size", type=int, default=224, help="saved image side in pixels")
    add_option(p, "--workers", type=int, default=None,
                  help="procedural: processes (default: CPUs)")
    g = p.add_argument_group("sd14")
    add_option(g, "--model", default="CompVis/stable-diffusion-v1-4",
                  help="hub id or local Stable Diffusion directory")
    add_option(g, "--steps", type=int, default=100)
    add_option(g, "--guidance", type=float, default=7.5)
    add_option(g, "--batch_size", type=int, default=4)
    add_option(g, "--sd_resolution", type=int, default=512)
    add_option(g, "--negative_prompt", default=NEGATIVE_PROMPT)
    add_option(g, "--device", default=None)
    add_option(g, "--local_files_only", action="store_true",
                  help="never download model files")
    c = p.add_argument_group("caption filter")
    add_option(c, "--captioner", default=None,
                  help="'none', or a hub id / local directory of a VisionEncoderDecoder "
                        f"captioner (sd14 default: {DEFAULT_CAPTIONER}; procedural default: none)")
    add_option(c, "--keywords", nargs="+", default=list(CAPTION_KEYWORDS),
                  help="keep an image only if its caption has one of these words ('*': any)")
    add_option(c, "--max_attempts", type=int, default=None,
                  help="attempts per cell before giving up (default 5 x per-cell, >= 20)")
    add_logging_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_outputs((args.out, "--output_dir", True))
    check_backend(args.backend)
    if args.per_cell < 1:
        raise UserError("--per_cell must be >= 1")
    if args.size < 16:
        raise UserError("--size must be >= 16")
    cells = _cells(args.pools, args.locations, args.breeds)
    log = logger.info
    captioner_name = args.captioner or (
        "none" if args.backend == "procedural" else DEFAULT_CAPTIONER)
    max_attempts = args.max_attempts or max(5 * args.per_cell, 20)
    backend: Backend
    if args.backend == "procedural":
        backend = ProceduralBackend(args.size)
    else:
        backend = StableDiffusionBackend(
            args.model, size=args.size, steps=args.steps, guidance=args.guidance,
            batch_size=args.batch_size, negative_prompt=args.negative_prompt,
            resolution=args.sd_resolution, device=args.device,
            local_files_only=args.local_files_only)
    settings = dict(backend.settings(), captioner=captioner_name,
                    keywords=list(args.keywords) if captioner_name != "none" else None)
    dataset_dir = prepare_output(args.out, backend.name, args.seed, settings, args.per_cell)
    if captioner_name == "none" and args.backend == "procedural":
        workers = args.workers or os.cpu_count() or 1
        generate_procedural_fast(dataset_dir, args.seed, args.size, args.per_cell, cells,
                                 workers, log)
    else:
        captioner = None
        if captioner_name != "none":
            captioner = ViTGPT2Captioner(captioner_name, device=args.device,
                                         local_files_only=args.local_files_only)
        generate_filtered(dataset_dir, backend, args.seed, args.per_cell, cells, captioner,
                          args.keywords, max_attempts, log)
    log(f"done: {dataset_dir}")
    return 0

def cli() -> None:
    """The `spawrious-generate` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
