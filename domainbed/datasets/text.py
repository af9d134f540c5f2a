"""Text benchmarks: CivilComments in three framings, and MultiNLI.

The papers behind the framings: accuracy on the line is Salaudeen et al. 2025, "Are Domain
Generalization Benchmarks with Accuracy on the Line Misspecified?"; OODSelect is Salaudeen
et al. 2025, "Aggregation Hides Out-of-Distribution Generalization Failures from Spurious
Correlations".

Inputs are made by the text featurizer the ``text_featurizer`` hyperparameter picks (hashed
bag of words by default; see ``domainbed.networks.text``): every comment of the file is
encoded once (cached on disk for frozen encoders) and each construction indexes into it.

CivilComments layout: ``DATA_DIR/civilcomments/all_data_with_identities.csv`` (WILDS'
release; its ``civilcomments_v1.0/`` folder is accepted too): columns comment_text, split
(train/val/test), toxicity and the identity columns. As WILDS does, y = toxicity >= 0.5 and an
identity is present where its column is >= 0.5 (missing = absent). Identities, in this order:
male, female, LGBTQ, christian, muslim, other_religions, black, white. Example ids: the row of
the comment in the csv (times ATTR_STRIDE plus the attribute where a comment is repeated).

* ``CivilComments`` (SubpopBench's default "coarse" grain): environments train/val/test
  (DEFAULT_TEST_ENVS [1, 2]). Training comments appear once, with attribute ``any_identity`` or
  ``no_identity``; a val/test comment appears once per identity it mentions (attribute = that
  identity; comments without one are left out), so worst-group accuracy is over
  (toxicity x identity) as in SubpopBench.
* ``CivilCommentsIdentity`` (Salaudeen et al. 2025, accuracy on the line): 16 environments
  identity x {toxic, nontoxic} ordered male_toxic, male_nontoxic, female_toxic, ...,
  white_nontoxic; only comments with exactly one identity; all splits pooled.
* ``WILDSCivilComments`` (Salaudeen et al. 2025, OODSelect): 8 environments, one per identity.
  With
  ``RandomState(42 + data_seed)`` (seed 42 as in the paper at the default data seed), applied
  to the comments in file order: each comment goes to one of its identities drawn uniformly;
  a comment without an identity goes to one of the 8 environments drawn uniformly; then
  exactly 20% of all comments, drawn without replacement from the same generator, move to a
  uniformly drawn different environment. Group = (toxicity, the identity drawn before the
  move, or no_identity). OODSelect trains on 0-1-2-3-5-6 and tests on 4 (muslim).

MultiNLI layout (SubpopBench / group DRO): ``DATA_DIR/multinli/data/metadata_random.csv``
(gold_label, sentence2_has_negation, split 0/1/2) and
``DATA_DIR/multinli/glue_data/MNLI/cached_{train,dev,test}_bert-base-uncased_128_mnli``
(BERT token ids). The token ids are decoded back to text with the bert-base-uncased vocabulary
(the one all-MiniLM-L6-v2 ships), so every text featurizer applies. Attribute = negation word
in sentence 2.
"""
import contextlib
import hashlib
import json
import os
from typing import Any

import numpy as np
import torch

from domainbed.datasets.base import MultipleDomainDataset, TensorEnvironment
from domainbed.datasets.layout import find_root, fingerprint_columns, read_csv
from domainbed.datasets.subpopulation import SUBPOPBENCH_TEXT_OPTIMIZER, group_names
from domainbed.networks.text import TEXT_HPARAMS, cache_dir, encode_texts, minilm_path
from domainbed.registry import register_dataset
from oodutils import fileio
from oodutils.errors import UserError, require
from oodutils.log import get_logger
from oodutils.untrusted import parse_json, read_regular_bytes

IDENTITIES = ["male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black",
              "white"]
CIVIL_DIRS = ("civilcomments", "civilcomments_v1.0")
CIVIL_FILE = "all_data_with_identities.csv"
SPLITS = {"train": 0, "val": 1, "test": 2}
ATTR_STRIDE = 16


def texts_fingerprint(texts: list[str]) -> Any:
    joined = "\x1e".join(map(str, texts)) + "\x1e"
    return hashlib.sha256(joined.encode("utf-8", "replace")).hexdigest()[:16]


class TextDataset(MultipleDomainDataset):
    """Environments of encoded texts: TensorEnvironment(x, y, ids, groups) per environment."""
    N_WORKERS = 0
    CLASSES: Any = None
    HPARAMS = dict(TEXT_HPARAMS)

    def build_text_environments(self, texts: list[str], row: Any, env: Any, y: Any, groups: Any,
                                ids: Any, hparams: dict[str, Any], data_dir: str,
                                source: Any) -> None:
        """texts: every text of the source; row: which text each example is; env/y/groups/ids:
        per example. Encodes the texts once (cached), then slices per environment."""
        row, env, y, ids = (np.asarray(v, dtype=np.int64) for v in (row, env, y, ids))
        groups = np.asarray(groups, dtype=np.int64)  # ids are unique by construction
        text_fp = texts_fingerprint(texts)
        encoded = encode_texts(texts, hparams or {}, data_dir, text_fp)
        self.datasets = []
        for i in range(len(self.ENVIRONMENTS)):
            keep = np.flatnonzero(env == i)
            self.datasets.append(TensorEnvironment(encoded[keep_rows(row, keep)], y[keep],
                                                   ids[keep], groups[keep]))
        self.input_shape = tuple(encoded.shape[1:])
        self.num_classes = len(self.CLASSES)
        self.data_source = f"{self.registry_name}:{os.path.abspath(source)}"
        self.data_fingerprint = fingerprint_columns(env, y, groups, ids, row,
                                                    [text_fp])


def keep_rows(row: Any, keep: Any) -> Any:
    return torch.from_numpy(row[keep])


def read_civilcomments(name: str, data_dir: str) -> tuple[Any, ...]:
    """(path, texts, split int array, y, identity matrix [N, 8] bool) of the WILDS csv."""
    root = find_root(name, data_dir, CIVIL_DIRS, CIVIL_FILE)
    path = os.path.join(root, CIVIL_FILE)
    wanted = ["comment_text", "split", "toxicity"] + IDENTITIES
    df = read_csv(name, path, wanted, usecols=lambda c: c in wanted, keep_default_na=True)
    split = df["split"].map(SPLITS)
    if split.isna().any():
        bad = df["split"][split.isna()].iloc[0]
        raise UserError(f"{name}: {path} has split {bad!r}; expected train/val/test")
    texts = df["comment_text"].fillna("").astype(str).tolist()
    y = (df["toxicity"].to_numpy(dtype=float) >= 0.5).astype(np.int64)
    identities = df[IDENTITIES].to_numpy(dtype=float) >= 0.5  # NaN -> False
    return root, texts, split.to_numpy(dtype=np.int64), y, identities


@register_dataset("CivilComments")
class CivilComments(TextDataset):
    """SubpopBench's CivilComments (coarse grain); see the module docstring."""
    ENVIRONMENTS = ["train", "val", "test"]
    DEFAULT_TEST_ENVS = [1, 2]
    CLASSES = ["nontoxic", "toxic"]
    ATTRIBUTES = IDENTITIES + ["any_identity", "no_identity"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    OPTIMIZER_HPARAMS = SUBPOPBENCH_TEXT_OPTIMIZER   # SubpopBench's protocol
    N_STEPS = 30001
    CHECKPOINT_FREQ = 1000

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        source, texts, split, y, identities = read_civilcomments(self.registry_name, root)
        rows, attrs = [], []
        train = np.flatnonzero(split == 0)
        rows.append(train)
        attrs.append(np.where(identities[train].any(1), 8, 9))
        for a in range(len(IDENTITIES)):
            held = np.flatnonzero((split > 0) & identities[:, a])
            rows.append(held)
            attrs.append(np.full(len(held), a))
        row, attr = np.concatenate(rows), np.concatenate(attrs)
        order = np.lexsort((attr, row))
        row, attr = row[order], attr[order]
        self.build_text_environments(texts, row, split[row], y[row],
                                     y[row] * len(self.ATTRIBUTES) + attr,
                                     row * ATTR_STRIDE + attr, hparams, root, source)


@register_dataset("CivilCommentsIdentity")
class CivilCommentsIdentity(TextDataset):
    """The 16 environments identity x {toxic, nontoxic} (single-identity comments) of
    Salaudeen et al. 2025 (accuracy on the line)."""
    ENVIRONMENTS = [f"{i}_{t}" for i in IDENTITIES for t in ("toxic", "nontoxic")]
    GROUP_NAMES = list(ENVIRONMENTS)
    CLASSES = ["nontoxic", "toxic"]
    N_STEPS = 5001
    CHECKPOINT_FREQ = 100

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        source, texts, split, y, identities = read_civilcomments(self.registry_name, root)
        row = np.flatnonzero(identities.sum(1) == 1)
        env = identities[row].argmax(1) * 2 + (1 - y[row])
        self.build_text_environments(texts, row, env, y[row], env, row, hparams, root, source)


def wilds_civil_environments(identities: Any, seed: int,
                             move_fraction: float = 0.2) -> tuple[Any, ...]:
    """(environment, identity drawn before the move or -1) per comment (module docstring)."""
    rng = np.random.RandomState(seed)
    n, k = identities.shape
    counts = identities.sum(1)
    draws = rng.random_sample(n)
    pick = np.minimum((draws * np.maximum(counts, 1)).astype(np.int64), np.maximum(counts, 1) - 1)
    rank = np.cumsum(identities, 1) - 1  # rank of each present identity within its row
    chosen = np.where(counts > 0, (identities & (rank == pick[:, None])).argmax(1), -1)
    env = np.where(counts > 0, chosen, np.minimum((draws * k).astype(np.int64), k - 1))
    moved = rng.choice(n, size=int(round(move_fraction * n)), replace=False)
    env = env.copy()
    env[moved] = (env[moved] + rng.randint(1, k, size=len(moved))) % k
    return env, chosen


@register_dataset("WILDSCivilComments")
class WILDSCivilComments(TextDataset):
    """The 8 demographic environments of OODSelect (Salaudeen et al. 2025); see the module
    docstring for the rule."""
    ENVIRONMENTS = list(IDENTITIES)
    CLASSES = ["nontoxic", "toxic"]
    ATTRIBUTES = IDENTITIES + ["no_identity"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    N_STEPS = 5001
    CHECKPOINT_FREQ = 100

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any],
                 data_seed: int = 0) -> None:
        source, texts, split, y, identities = read_civilcomments(self.registry_name, root)
        env, chosen = wilds_civil_environments(identities, 42 + int(data_seed))
        attr = np.where(chosen >= 0, chosen, len(IDENTITIES))
        row = np.arange(len(y))
        self.build_text_environments(texts, row, env, y, y * len(self.ATTRIBUTES) + attr, row,
                                     hparams, root, source)


logger = get_logger(__name__)
MAX_TEXT_CACHE_BYTES = 1 << 30  # well above MultiNLI's decoded pairs, the largest cache entry
MNLI_FEATURE_FILES = ("cached_train_bert-base-uncased_128_mnli",
                      "cached_dev_bert-base-uncased_128_mnli",
                      "cached_dev_bert-base-uncased_128_mnli-mm")


class _InputFeatures:
    """Stands in for group DRO's utils_glue.InputFeatures when reading the cached files: the
    one class torch.load(weights_only=True) may build, filled with plain attributes. It
    carries that name, which every torch from 2.4 on matches against the pickle's."""


_InputFeatures.__module__ = "utils_glue"
_InputFeatures.__name__ = _InputFeatures.__qualname__ = "InputFeatures"


def _allowing_input_features(torch: Any) -> Any:
    """A context in which torch.load(weights_only=True) builds _InputFeatures: for that load
    alone where torch has `safe_globals` (2.5+), for the process on torch 2.4."""
    if hasattr(torch.serialization, "safe_globals"):
        return torch.serialization.safe_globals([_InputFeatures])
    if _InputFeatures not in torch.serialization.get_safe_globals():
        torch.serialization.add_safe_globals([_InputFeatures])
    return contextlib.nullcontext()


def read_mnli_token_ids(name: str, feature_dir: Any) -> tuple[Any, ...]:
    """[N, 128] input ids and masks of the three cached feature files, concatenated."""
    ids, masks = [], []
    for file in MNLI_FEATURE_FILES:
        path = os.path.join(feature_dir, file)
        try:
            with _allowing_input_features(torch):
                features = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UserError(f"{name}: cannot read {path} ({type(e).__name__}); it must hold "
                            "group DRO's InputFeatures lists and nothing else (objects of "
                            "other classes are never built: that would run code)") from None
        ids += [f.input_ids for f in features]
        masks += [f.input_mask for f in features]
    return np.asarray(ids, dtype=np.int64), np.asarray(masks, dtype=np.int64)


def decode_bert_ids(ids: Any, masks: Any) -> Any:
    """bert-base-uncased token ids -> text (sentence pair kept apart by [SEP])."""
    transformers = require("transformers", extra="text")
    # the featurizer's vocabulary is bert-base-uncased's
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    rows = [row[1:int(m.sum())] for row, m in zip(ids, masks)]  # drop [CLS] and padding
    return tokenizer.batch_decode(rows, clean_up_tokenization_spaces=True)


def mnli_texts(name: str, feature_dir: Any, data_dir: str) -> Any:
    """The decoded texts of the feature files, cached beside the text features (keyed by the
    files' names, sizes and modification times): unpickling and decoding 412k examples is
    the slow part of loading MultiNLI."""
    stats = [(f, os.path.getsize(os.path.join(feature_dir, f)),
              os.path.getmtime(os.path.join(feature_dir, f))) for f in MNLI_FEATURE_FILES]
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:24]
    path = os.path.join(cache_dir(data_dir), f"mnli-texts-{key}.json")
    if os.path.lexists(path):
        texts = _checked_texts(path)
        if texts is not None:
            return texts
        logger.warning(f"warning: decoded-text cache entry {path} is damaged or altered; "
                       "recomputing it")
    texts = decode_bert_ids(*read_mnli_token_ids(name, feature_dir))
    try:
        fileio.atomic_write_text(path, json.dumps({"texts": texts, "rows": len(texts),
                                                   "sha256": _texts_digest(texts)}))
    except OSError:
        pass
    return texts


def _texts_digest(texts: list[str]) -> Any:
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def _checked_texts(path: str) -> Any:
    """The texts of a decoded-text cache entry (a regular file whose row count and checksum
    match), or None."""
    try:
        entry = parse_json(read_regular_bytes(path, MAX_TEXT_CACHE_BYTES))
    except OSError:
        return None
    texts = entry.get("texts") if isinstance(entry, dict) else None
    if not (isinstance(texts, list) and all(isinstance(t, str) for t in texts)) or \
            entry.get("rows") != len(texts) or entry.get("sha256") != _texts_digest(texts):
        return None
    return texts


@register_dataset("MultiNLI")
class MultiNLI(TextDataset):
    """SubpopBench's MultiNLI: environments train/val/test, attribute = negation in sentence 2
    (see the module docstring for the layout)."""
    ENVIRONMENTS = ["train", "val", "test"]
    DEFAULT_TEST_ENVS = [1, 2]
    CLASSES = ["contradiction", "entailment", "neutral"]
    ATTRIBUTES = ["no_negation", "negation"]
    GROUP_NAMES = group_names(CLASSES, ATTRIBUTES)
    OPTIMIZER_HPARAMS = SUBPOPBENCH_TEXT_OPTIMIZER   # SubpopBench's protocol
    N_STEPS = 30001
    CHECKPOINT_FREQ = 1000

    def __init__(self, root: str, test_envs: Any, hparams: dict[str, Any]) -> None:
        name = self.registry_name
        base = find_root(name, root, ("multinli",), os.path.join("data", "metadata_random.csv"))
        meta = read_csv(name, os.path.join(base, "data", "metadata_random.csv"),
                        ["gold_label", "sentence2_has_negation", "split"], index_col=0)
        feature_dir = os.path.join(base, "glue_data", "MNLI")
        for file in MNLI_FEATURE_FILES:
            if not os.path.exists(os.path.join(feature_dir, file)):
                raise UserError(f"{name}: {os.path.join(feature_dir, file)} not found "
                                f"(incomplete layout under {base}); run `python -m "
                                f"domainbed.scripts.download --datasets {name} "
                                "--data_dir DATA_DIR`")
        texts = mnli_texts(name, feature_dir, root)
        if len(texts) != len(meta):
            raise UserError(f"{name}: metadata_random.csv has {len(meta)} rows, the feature "
                            f"files {len(texts)} examples (mismatched files under {base})")
        y = meta["gold_label"].to_numpy(dtype=np.int64)
        a = meta["sentence2_has_negation"].to_numpy(dtype=np.int64)
        row = np.arange(len(y))
        self.build_text_environments(texts, row, meta["split"].to_numpy(dtype=np.int64), y,
                                     y * 2 + a, row, hparams, root, base)
