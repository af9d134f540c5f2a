"""The caption filter (paper section 4.1 steps 4-6): caption every image with an
image-to-text model and keep it only if the caption contains a keyword such as "dog".

The authors' check: ``set(caption.strip().split(" ")) & {"dog"}``. Ours splits on
non-letters and lowercases first (so "dog," and "Dog" count), otherwise the same
exact-word match ("dogs" does not match "dog"; pass it as a keyword if wanted).
The special keyword "*" accepts any non-empty caption (captions are still recorded).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from oodutils.errors import UserError, require

if TYPE_CHECKING:
    from PIL import Image

DEFAULT_CAPTIONER = "nlpconnect/vit-gpt2-image-captioning"


def caption_words(caption: str | None) -> list[str]:
    return re.findall(r"[a-z0-9]+", (caption or "").lower())


def caption_passes(caption: str | None, keywords: Iterable[str]) -> bool:
    words = caption_words(caption)
    if "*" in keywords:
        return bool(words)
    return bool(set(words) & {k.lower() for k in keywords})


class Captioner:
    """Interface: caption(list of PIL images) -> list of str."""
    name = "captioner"

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        raise NotImplementedError


def _looks_like_path(name: str) -> bool:
    if name.startswith((".", "/", "~")):
        return True
    return os.sep in name and not re.fullmatch(r"[\w.-]+/[\w.-]+", name)


def check_model_location(name: str, what: str) -> str:
    """A local path must exist; a hub id is tried from the local cache only by callers."""
    expanded = os.path.expanduser(name)
    if os.path.exists(expanded):
        return expanded
    if _looks_like_path(name):
        raise UserError(f"{what} path {name!r} does not exist")
    return name


class ViTGPT2Captioner(Captioner):
    """A VisionEncoderDecoder captioner (default: nlpconnect/vit-gpt2-image-captioning, the
    paper's), with the authors' settings max_length=16, num_beams=4. Pass `model` as a
    hub id or local directory, or pass ready objects (model, image_processor, tokenizer)."""
    name = "vit-gpt2"

    def __init__(self, model: Any = DEFAULT_CAPTIONER, image_processor: Any = None,
                 tokenizer: Any = None, max_length: int = 16, num_beams: int = 4,
                 device: str | None = None, local_files_only: bool = False) -> None:
        import torch
        self.torch = torch
        self.max_length, self.num_beams = max_length, num_beams
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(model, str):
            self.model_name = model
            location = check_model_location(model, "captioner model")
            try:
                transformers = require("transformers", extra="generate")
                model = transformers.VisionEncoderDecoderModel.from_pretrained(
                    location, local_files_only=local_files_only)
                image_processor = image_processor or \
                    transformers.AutoImageProcessor.from_pretrained(
                        location, local_files_only=local_files_only)
                tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(
                    location, local_files_only=local_files_only)
            except ImportError as e:
                raise UserError(f"the caption filter needs transformers: pip install "
                                f"'oodbed[generate]' ({e})") from e
            except OSError as e:
                message = f"cannot load captioner {self.model_name!r}: {e}"
                raise UserError(message.split("\n")[0]) from e
        else:
            self.model_name = type(model).__name__
        if image_processor is None or tokenizer is None:
            raise UserError("a captioner model object needs its image_processor and tokenizer")
        self.model = model.to(self.device).eval()
        self.image_processor, self.tokenizer = image_processor, tokenizer

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        if not images:
            return []
        rgb = [im.convert("RGB") for im in images]
        pixels = self.image_processor(images=rgb, return_tensors="pt").pixel_values.to(self.device)
        with self.torch.no_grad():
            ids = self.model.generate(pixels, max_length=self.max_length, num_beams=self.num_beams)
        return [c.strip() for c in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]


class CallableCaptioner(Captioner):
    """Wraps fn(image) -> str (fakes in tests, or any other captioner)."""
    name = "callable"

    def __init__(self, fn: Callable[[Image.Image], str], name: str = "callable") -> None:
        self.fn, self.name = fn, name
        self.model_name = name

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        return [self.fn(im) for im in images]
