"""Image backends: `procedural` (offline default, no weights) and `sd14` (Stable
Diffusion v1.4 through diffusers, or any local Stable Diffusion model directory).

Interface: ``generate(specs, seeds) -> list of (PIL.Image or None, info dict)``; an
image is None when the backend refused it (info["nsfw"] True).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from PIL import Image

from oodutils.errors import UnknownNameError, UserError, require
from spawrious.caption import check_model_location
from spawrious.constants import NEGATIVE_PROMPT
from spawrious.procedural import render
from spawrious.prompts import PromptSpec

DEFAULT_SD_MODEL = "CompVis/stable-diffusion-v1-4"


class Backend(Protocol):
    """What the generation loop needs of a backend: a name, its settings (written to
    info.json) and one image (or None, with the reason in its flags) per prompt and seed."""
    name: str
    size: int

    def settings(self) -> dict[str, Any]: ...

    def generate(self, specs: Sequence[PromptSpec],
                 seeds: Sequence[int]) -> list[tuple[Image.Image | None, dict[str, bool]]]: ...


class ProceduralBackend:
    name = "procedural"

    def __init__(self, size: int = 224) -> None:
        self.size = int(size)

    def settings(self) -> dict[str, Any]:
        return {"size": self.size}

    def generate(self, specs: Sequence[PromptSpec],
                 seeds: Sequence[int]) -> list[tuple[Image.Image | None, dict[str, bool]]]:
        return [(Image.fromarray(render(spec, seed, self.size)), {"nsfw": False})
                for spec, seed in zip(specs, seeds)]


class StableDiffusionBackend:
    """diffusers' StableDiffusionPipeline with the authors' settings: negative prompt,
    100 inference steps, 4 images per call, a whole batch resampled when any image is
    flagged NSFW by the pipeline's safety checker (here: all flagged in a batch are
    recorded as rejected and the generation loop tries again with fresh seeds).
    Images are generated at `resolution` (512) and resized to `size` (224)."""
    name = "sd14"

    def __init__(self, model: str = DEFAULT_SD_MODEL, size: int = 224, steps: int = 100,
                 guidance: float = 7.5, batch_size: int = 4, negative_prompt: str = NEGATIVE_PROMPT,
                 resolution: int = 512, device: str | None = None, dtype: Any = None,
                 pipeline: Any = None, local_files_only: bool = False) -> None:
        import torch
        self.torch = torch
        self.size, self.steps, self.guidance = int(size), int(steps), float(guidance)
        self.batch_size, self.resolution = int(batch_size), int(resolution)
        self.negative_prompt = negative_prompt
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if steps < 1 or batch_size < 1 or resolution < 8:
            raise UserError("--steps, --batch_size must be >= 1 and --sd_resolution >= 8")
        if pipeline is None:
            self.model_name = model
            location = check_model_location(model, "Stable Diffusion model")
            dtype = dtype or (torch.float16 if self.device == "cuda" else None)
            try:
                diffusers = require("diffusers", extra="generate")
                StableDiffusionPipeline = diffusers.StableDiffusionPipeline
            except ImportError as e:   # diffusers without transformers
                raise UserError(f"the sd14 backend needs diffusers and transformers: "
                                f"pip install 'oodbed[generate]' ({e})") from e
            try:
                kwargs = {"torch_dtype": dtype} if dtype is not None else {}
                pipeline = StableDiffusionPipeline.from_pretrained(
                    location, local_files_only=local_files_only, **kwargs)
            except (OSError, ValueError) as e:
                raise UserError(f"cannot load Stable Diffusion model {model!r}: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; pass a "
                                f"local model directory with --model") from e
        else:
            self.model_name = getattr(pipeline, "name_or_path", None) or type(pipeline).__name__
        self.pipeline = pipeline.to(self.device)
        self.pipeline.set_progress_bar_config(disable=True)

    def settings(self) -> dict[str, Any]:
        return {"size": self.size, "model": self.model_name, "steps": self.steps,
                "guidance": self.guidance, "batch_size": self.batch_size,
                "resolution": self.resolution, "negative_prompt": self.negative_prompt}

    def generate(self, specs: Sequence[PromptSpec],
                 seeds: Sequence[int]) -> list[tuple[Image.Image | None, dict[str, bool]]]:
        torch = self.torch
        gen_device = "cpu" if self.device == "mps" else self.device
        generators = [torch.Generator(gen_device).manual_seed(int(s)) for s in seeds]
        out = self.pipeline(prompt=[s.text for s in specs],
                            negative_prompt=[self.negative_prompt] * len(specs),
                            num_inference_steps=self.steps, guidance_scale=self.guidance,
                            height=self.resolution, width=self.resolution, generator=generators)
        flags = getattr(out, "nsfw_content_detected", None) or [False] * len(specs)
        results: list[tuple[Image.Image | None, dict[str, bool]]] = []
        for image, nsfw in zip(out.images, flags):
            if nsfw:
                results.append((None, {"nsfw": True}))
                continue
            if image.size != (self.size, self.size):
                image = image.resize((self.size, self.size), Image.Resampling.LANCZOS)
            results.append((image, {"nsfw": False}))
        return results


BACKENDS = {"procedural": ProceduralBackend, "sd14": StableDiffusionBackend}


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, BACKENDS)
    return name


