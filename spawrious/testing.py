"""Tiny randomly initialised models for offline smoke tests of the text-to-image path.

No download: every part is built from a config and saved with ``save_pretrained``, so
``--model`` and ``--captioner`` can point at the saved directories and the real loading,
generation and captioning code runs (in seconds on a CPU).

    from spawrious.testing import build_tiny_sd, build_tiny_captioner
    build_tiny_sd("/tmp/tiny-sd"); build_tiny_captioner("/tmp/tiny-cap", word="dog")
    python -m spawrious.generate --backend sd14 --model /tmp/tiny-sd --captioner /tmp/tiny-cap \
        --steps 2 --sd_resolution 32 --size 32 --per_cell 2 --output_dir /tmp/out

The tiny captioner is wired to say one word (``word``) over and over, whatever the image:
its final layer norm has zero gain, so every decoder state equals the norm's bias, and
only ``word``'s output embedding is aligned with it. A random captioner would otherwise
stop at once and say nothing.
"""
from __future__ import annotations

import json
import os
from typing import Any

import torch

from oodutils.errors import require

CLIP_WORDS = ("one dog in a on the with and of black brown white sitting running beach "
              "desert park jungle mountain snow rocky hot dry cabin").split()
CAPTION_WORDS = "a dog cat on the beach sitting in snow with".split()


def build_tiny_sd(path: str, seed: int = 0) -> Any:
    """A StableDiffusionPipeline (UNet, VAE, CLIP text encoder, tokenizer, DDIM) saved to `path`."""
    diffusers = require("diffusers", extra="generate")
    transformers = require("transformers", extra="generate")
    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=4, norm_num_groups=8)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), latent_channels=4,
        layers_per_block=1, norm_num_groups=8, sample_size=32)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
    for w in CLIP_WORDS:
        vocab[w + "</w>"] = len(vocab)
    tok_dir = os.path.join(path, "_tokenizer_src")
    os.makedirs(tok_dir, exist_ok=True)
    with open(os.path.join(tok_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(tok_dir, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(os.path.join(tok_dir, "vocab.json"),
                              os.path.join(tok_dir, "merges.txt"), model_max_length=77)
    text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_attention_heads=4,
        num_hidden_layers=2, max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
        pad_token_id=1))
    pipe = diffusers.StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
        scheduler=diffusers.DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(path)
    return pipe


def build_tiny_captioner(path: str, word: str = "dog", seed: int = 0) -> str:
    """A ViT + GPT-2 VisionEncoderDecoderModel, its GPT2Tokenizer and ViTImageProcessor,
    saved to `path`; it captions every image as `word` repeated (see the module doc)."""
    transformers = require("transformers", extra="generate")
    os.makedirs(path, exist_ok=True)
    words = list(CAPTION_WORDS) + ([word] if word not in CAPTION_WORDS else [])
    vocab = {"<|endoftext|>": 0}
    for w in words:
        vocab["\u0120" + w] = len(vocab)
    for w in words:
        vocab[w] = len(vocab)
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(path, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    tokenizer = transformers.GPT2Tokenizer(os.path.join(path, "vocab.json"),
                                           os.path.join(path, "merges.txt"))
    torch.manual_seed(seed)
    encoder = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=37)
    decoder = transformers.GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=32,
                                      n_layer=1, n_head=4, add_cross_attention=True,
                                      is_decoder=True, bos_token_id=0, eos_token_id=0,
                                      pad_token_id=0)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    for cfg in (config,):
        cfg.decoder_start_token_id = cfg.pad_token_id = cfg.eos_token_id = cfg.bos_token_id = 0
    model = transformers.VisionEncoderDecoderModel(config=config)
    gen = model.generation_config
    gen.decoder_start_token_id = gen.pad_token_id = gen.eos_token_id = gen.bos_token_id = 0
    with torch.no_grad():
        ln_f = model.decoder.transformer.ln_f
        direction = torch.randn(ln_f.bias.shape)
        ln_f.weight.zero_()
        ln_f.bias.copy_(direction)
        head = model.decoder.get_output_embeddings().weight
        head.zero_()
        head[vocab["\u0120" + word]] = 10.0 * direction / direction.norm() ** 2
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path
