"""Frozen-feature cache for linear probes: the frozen backbone's features of every example
of every environment, computed once and reused by every later run on the same backbone.

A `linear_probe` run whose featurizer is a zoo backbone (`backbones.Backbone`) calls
``attach(training_run)`` once its data and model are built. The features (evaluation
transform, float16) are looked up under a key made of the weights' identity, the
dataset's identity (source, fingerprint, data seed), the evaluation transform and the
precision; on a miss they are extracted and stored as one float16 ``.npy`` array per
environment, with each array's row count and checksum in the entry's meta.json. A cache
entry is a directory written under a temporary name and renamed into place only once
complete, so a run killed while writing leaves nothing a later run would use. A cache may
be shared, so an entry is checked on read (regular files only, the key's fields, row counts,
checksums): a damaged or altered one is recomputed with a warning, never used.

The run then trains on the features: each split's inputs become its rows of the cached
array (same examples, same order, same ids), and the backbone's forward takes features
(`takes_features`), so minibatch indices, evaluation, records and per-example predictions
are exactly those of a run that computes the (float16-rounded) features on the fly.

Not cached (features are computed each step instead): runs with `--feature_cache_dir
none`, algorithms declaring ``TRANSFORMS_INPUTS = True`` (e.g. mixing images). Refused:
training environments whose inputs are augmented (`data_augmentation`), since cached
features of the plain images would not be the inputs the run asked for.
"""
import collections
import contextlib
import copy
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from domainbed.datasets.base import Environment, EnvironmentSubset
from domainbed.networks.backbones import Backbone
from domainbed.training.config import RunConfig
from domainbed.training.evaluation import iterate_split
from domainbed.training.precision import autocast_context
from oodutils.errors import UserError
from oodutils.untrusted import array_digest, open_regular, parse_json, read_regular_bytes

FORMAT_VERSION = 2  # 2: meta.json holds each array's row count and checksum
MAX_META_BYTES = 1 << 20
# "extracted" / "loaded": how often each happened (tests)
STATS: collections.Counter[str] = collections.Counter()
# inside shared_loads(): entry -> (features, {id(split): FeatureSplit})
_SHARED: dict[Any, Any] | None = None


@contextlib.contextmanager
def shared_loads() -> Iterator[Any]:
    """Runs built inside this block on the same dataset share each cache entry: its arrays
    are read and checked once, and each split's feature rows are gathered once (a stack of
    500 probes holds the features once, not 500 times)."""
    global _SHARED
    outer, _SHARED = _SHARED, ({} if _SHARED is None else _SHARED)
    try:
        yield
    finally:
        _SHARED = outer


def default_cache_dir() -> Any:
    return os.environ.get("DOMAINBED_FEATURE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "domainbed", "features")


def cache_dir_of(config: RunConfig) -> str | None:
    """The cache root of a run, or None where caching is off (`--feature_cache_dir none`)."""
    chosen = config.feature_cache_dir or default_cache_dir()
    return None if chosen == "none" else chosen


class FeatureSplit(Environment):
    """A split whose inputs are cached features (ids, labels, groups, paths unchanged)."""

    def __init__(self, split: Any, features: torch.Tensor) -> None:
        self.x, self.y, self.ids = features, split.y, split.ids
        self.groups, self.paths = split.groups, split.paths

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return self.x[i], self.y[i]


def _root_indices(split: Any) -> tuple[Any, ...]:
    """(root environment, indices into it) of a split made by (nested) subsets."""
    indices = np.arange(len(split))
    while isinstance(split, EnvironmentSubset):
        indices = split.indices[indices]
        split = split.parent
    return split, indices


def _split_identity(split: Any) -> Any:
    """Equal for a split and its shallow copies (a training view shares the subset's
    parent and indices), so that each is gathered once."""
    if isinstance(split, EnvironmentSubset):
        return _split_identity(split.parent), id(split.indices)
    return id(split)


def _is_augmented(split: Any) -> bool:
    train = getattr(split, "train_transform", None)
    return train is not None and train is not getattr(split, "eval_transform", None) and \
        getattr(split, "transform", None) is train


def cache_key(run: Any, featurizer: Any) -> tuple[Any, ...]:
    """What the cached features depend on, and its hash (the entry's directory name)."""
    args = run.args_dict
    weights = args.get("weights_sha256") or f"random_init:seed={run.config.seed}"
    transforms = [repr(getattr(env, "eval_transform", None)) for env in run.dataset]
    fields = {
        "format": FORMAT_VERSION, "backbone": featurizer.name, "weights": weights,
        "dataset": run.config.dataset, "data_source": args.get("data_source"),
        "data_fingerprint": args.get("data_fingerprint"), "data_seed": run.config.data_seed,
        "eval_transforms": transforms, "input_shape": list(run.dataset.input_shape),
        "env_sizes": [len(env) for env in run.dataset], "precision": run.config.precision}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]
    return fields, digest


def _plain_view(env: Any) -> Any:
    if not hasattr(env, "set_transform"):
        return env
    view = copy.copy(env)
    view.set_transform(False)
    return view


@torch.inference_mode()
def _extract(env: Any, featurizer: Any, ctx: Any) -> Any:
    """Features of every example of an environment (evaluation transform), float16."""
    chunks = []
    for x in iterate_split(_plain_view(env), ctx.eval_batch_size, ctx.n_workers):
        x = x.to(ctx.device)
        if x.dim() == 4:
            x = x.contiguous(memory_format=ctx.memory_format)
        with autocast_context(ctx.device, ctx.precision):
            chunks.append(featurizer.features(x).float().half().cpu())
    return torch.cat(chunks).numpy() if chunks else np.zeros((0, featurizer.n_outputs),
                                                                np.float16)


def write_entry(entry: Any, fields: Any, arrays: Any) -> None:
    """Write an entry atomically: a temporary directory, renamed into place when complete.
    meta.json holds the key's fields and, per environment, the row count and checksum."""
    tmp = f"{entry}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        for i, array in enumerate(arrays):
            out = np.lib.format.open_memmap(os.path.join(tmp, f"env{i}.npy"), mode="w+",
                                            dtype=np.float16, shape=array.shape)
            out[:] = array
            out.flush()
            del out
        arrays_meta = [{"rows": int(len(a)), "sha256": array_digest(np.asarray(a, np.float16))}
                       for a in arrays]
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({**fields, "arrays": arrays_meta}, f, sort_keys=True)
        try:
            os.rename(tmp, entry)
        except OSError:  # another run finished the same entry first: keep theirs
            if not os.path.isdir(entry):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


class BadEntry(Exception):
    """A cache entry that is not what its meta.json says (why, in words)."""


def _read_meta(entry: Any, fields: Any) -> Any:
    try:
        meta = parse_json(read_regular_bytes(os.path.join(entry, "meta.json"), MAX_META_BYTES))
    except OSError as e:
        raise BadEntry(f"meta.json unreadable ({e})") from None
    if not isinstance(meta, dict) or {k: meta.get(k) for k in fields} != fields:
        raise BadEntry("meta.json does not match the entry's key")
    arrays = meta.get("arrays")
    if not isinstance(arrays, list) or len(arrays) != len(fields["env_sizes"]):
        raise BadEntry("meta.json has no row count and checksum per environment")
    return arrays


def _read_array(path: str, rows: Any, sha256: str | None) -> Any:
    try:
        with open_regular(path) as f:
            array = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise BadEntry(f"{os.path.basename(path)} unreadable ({type(e).__name__})") from None
    if array.dtype != np.float16 or array.ndim != 2 or len(array) != rows:
        raise BadEntry(f"{os.path.basename(path)} holds {array.shape} {array.dtype}, not "
                       f"{rows} rows of float16")
    if array_digest(array) != sha256:
        raise BadEntry(f"{os.path.basename(path)} does not match its checksum")
    return array


def read_entry(entry: Any, fields: Any) -> Any:
    """The float16 arrays of a complete entry, or None when there is none; BadEntry when
    one exists but is damaged or altered (a row count or checksum that does not match)."""
    if not os.path.lexists(os.path.join(entry, "meta.json")):
        return None
    out = []
    for i, (rows, meta) in enumerate(zip(fields["env_sizes"], _read_meta(entry, fields))):
        if not isinstance(meta, dict):
            raise BadEntry("meta.json lists an array without its row count and checksum")
        out.append(_read_array(os.path.join(entry, f"env{i}.npy"), rows, meta.get("sha256")))
    return out


def _discard(entry: Any) -> None:
    """Move a bad entry out of the way (never followed if it is a symlink), then delete."""
    aside = f"{entry}.bad-{uuid.uuid4().hex[:8]}"
    os.rename(entry, aside)
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.unlink(aside)


def load_or_extract(run: Any, featurizer: Any, root: Any) -> list[Any]:
    """Per environment, the float16 feature tensor (from the cache, extracting on a miss or
    on a bad entry, with a warning); the backbone casts each batch to float32."""
    fields, digest = cache_key(run, featurizer)
    entry = os.path.join(root, digest)
    try:
        arrays = read_entry(entry, fields)
    except BadEntry as e:
        run.log(f"warning: frozen-feature cache entry {entry} is damaged or altered ({e}); "
                "recomputing it")
        _discard(entry)
        arrays = None
    if arrays is None:
        arrays = [_extract(env, featurizer, run.ctx) for env in run.dataset]
        os.makedirs(root, exist_ok=True)
        write_entry(entry, fields, arrays)
        STATS["extracted"] += 1
        run.log(f"notice: cached frozen features in {entry}")
    else:
        STATS["loaded"] += 1
    return [torch.from_numpy(np.array(a, dtype=np.float16)) for a in arrays]


def applies(run: Any) -> Any:
    """The run's frozen backbone, when this run trains on cached features; else None.
    The algorithm must hold exactly one backbone (wherever: `featurizer`, a stage-one
    model's ...), so that nothing else is fed the features."""
    found = [m for m in run.algorithm.modules() if isinstance(m, Backbone)]
    if len(found) != 1 or not found[0].linear_probe:
        return None
    if cache_dir_of(run.config) is None or getattr(run.algorithm_cls, "TRANSFORMS_INPUTS", False):
        return None
    return found[0]


def check_not_augmented(run: Any) -> None:
    splits = list(run.minibatches.splits)
    splits += list(run.uda_source.splits) if run.uda_source is not None else []
    if any(_is_augmented(s) for s in splits):
        raise UserError(
            "transfer=linear_probe trains on cached features of the un-augmented images, "
            "but data_augmentation is on; pass --hparams '{\"data_augmentation\": false}', "
            "or --feature_cache_dir none to compute features every step")


def attach(run: Any) -> bool:
    """Train this run on cached features where that applies (see the module docstring):
    called after the model is built and before algorithms' `prepare` hooks see the splits."""
    featurizer = applies(run)
    if featurizer is None:
        return False
    check_not_augmented(run)
    root = cache_dir_of(run.config)
    entry = (os.path.join(root, cache_key(run, featurizer)[1]), id(run.dataset))  # type: ignore[arg-type]
    if _SHARED is not None and entry in _SHARED:
        features, swapped = _SHARED[entry]
    else:
        features, swapped = load_or_extract(run, featurizer, root), {}
        if _SHARED is not None:
            _SHARED[entry] = features, swapped
    env_index = {id(env): i for i, env in enumerate(run.dataset)}

    def swap(split: Any) -> Any:
        key = _split_identity(split)
        if key not in swapped:
            root, indices = _root_indices(split)
            rows = features[env_index[id(root)]][torch.from_numpy(indices)]
            swapped[key] = FeatureSplit(split, rows)
        return swapped[key]

    run.in_splits = [swap(s) for s in run.in_splits]
    run.out_splits = [swap(s) for s in run.out_splits]
    run.uda_splits = [(i, swap(s)) for i, s in run.uda_splits]
    run.named_splits = [(n, e, k, swap(s)) for n, e, k, s in run.named_splits]
    run.minibatches.splits = [swap(s) for s in run.minibatches.splits]
    if run.uda_source is not None:
        run.uda_source.splits = [swap(s) for s in run.uda_source.splits]
    featurizer.takes_features = True
    return True
