"""How record dicts are grouped for model selection, as DomainBed groups them: the
(trial_seed, dataset, algorithm, test_env) keys, the dataset labels that keep runs on
different data apart, the key of one hyperparameter setting."""
from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

DATA_KEYS = ("data_source", "data_fingerprint", "data_seed", "precision", "weights_sha256")

GroupKey = collections.namedtuple("GroupKey", "trial_seed dataset algorithm test_env")
Record = dict[str, Any]          # one results.jsonl line, with its run_dir
DataKey = tuple[Any, ...]
Labels = dict[tuple[Any, DataKey], str]


def test_envs_of(record: Record) -> list[int]:
    return list(record["args"].get("test_envs") or [])


def num_envs(record: Record) -> int:
    """Number of environments: env_names, else env0_out_acc, env1_out_acc, ... (DomainBed's)."""
    names = (record.get("args") or {}).get("env_names")
    if names:
        return len(names)
    for i in itertools.count():
        if f"env{i}_out_acc" not in record:
            return i
    raise AssertionError("unreachable")  # itertools.count() never ends


def data_key(args: Mapping[str, Any]) -> DataKey:
    """What identifies a run's data (None for DomainBed's own records)."""
    return tuple(map(args.get, DATA_KEYS))


def hparams_key_text(hparams: Any) -> str:
    """The text of `hparams` that identifies the setting (hparams_key's second part)."""
    return json.dumps(hparams, sort_keys=True, default=str)


def hparams_key(record: Record) -> tuple[str, str]:
    """Identifies one hyperparameter setting inside a (trial_seed, dataset, algorithm)."""
    return str(record["args"].get("hparams_seed")), hparams_key_text(record.get("hparams"))


def dataset_labels(records: Iterable[Record]) -> Labels:
    """{(dataset, data_key): label}: the dataset's name, or where one dataset was run on
    several data variants, the name plus the args that tell the variants apart."""
    variants: dict[Any, set[DataKey]] = collections.defaultdict(set)
    seen: set[int] = set()          # id(args): a run's records share one args object
    for r in records:
        args = r["args"]
        if id(args) not in seen:
            seen.add(id(args))
            variants[args.get("dataset")].add(data_key(args))
    labels: Labels = {}
    for dataset, keys in variants.items():
        if len(keys) == 1:
            labels[(dataset, next(iter(keys)))] = str(dataset)
            continue
        ordered = sorted(keys, key=repr)
        differing = [i for i, name in enumerate(DATA_KEYS)
                     if len({k[i] for k in ordered}) > 1]
        for k in ordered:
            parts = []
            for i in differing:
                value = k[i]
                if DATA_KEYS[i] in ("data_fingerprint", "weights_sha256") and \
                        isinstance(value, str):
                    value = value[:8]
                parts.append(f"{DATA_KEYS[i]}={value}")
            labels[(dataset, k)] = f"{dataset}[{','.join(parts)}]"
    return labels


def dataset_label(record: Record, labels: Labels) -> str:
    args = record["args"]
    return labels[(args.get("dataset"), data_key(args))]


def group_keys(record: Record, labels: Labels) -> list[GroupKey]:
    args = record["args"]
    if any(args.get(k) is None for k in ("dataset", "algorithm", "trial_seed")):
        return []
    return [GroupKey(args["trial_seed"], dataset_label(record, labels), args["algorithm"],
                     test_env) for test_env in test_envs_of(record)]


def group_records(records: Iterable[Record], labels: Labels | None = None
                  ) -> dict[GroupKey, list[Record]]:
    """{GroupKey: [records]}; a record with several test envs is in each of their groups."""
    records = list(records)
    labels = dataset_labels(records) if labels is None else labels
    groups: dict[GroupKey, list[Record]] = collections.defaultdict(list)
    for r in records:
        for key in group_keys(r, labels):
            groups[key].append(r)
    return dict(groups)


def hparams_sort_key(key: tuple[str, str]) -> tuple[int, int | str, str]:
    seed = key[0]
    return (0, int(seed), key[1]) if seed.lstrip("-").isdigit() else (1, seed, key[1])
