"""What selection and the tables read of each block's args and hparams, as integer codes
into tables of distinct values: a sweep of 100,000 runs has a handful of datasets and
algorithms and a few hundred test-env / seed combinations, so grouping works on the
distinct values (in Python) and on the codes (with numpy), never on 100,000 args dicts.

Fields (``KEY_FIELDS``): ``args.dataset``, ``args.algorithm``, ``args.trial_seed``,
``args.hparams_seed``, ``args.test_envs``, ``args.env_names``, the data identity
(``grouping.DATA_KEYS`` values, a list) and the hyperparameter key
(``grouping.hparams_key``: [str(hparams_seed), the sorted JSON of hparams]). A missing arg
and a null one are the same value (every reader asks ``args.get``). Distinct values are
told apart by their JSON text (so 1, 1.0 and true stay three values).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from domainbed.results.grouping import DATA_KEYS

KEY_FIELDS = ("dataset", "algorithm", "trial_seed", "hparams_seed", "test_envs", "env_names",
              "data_key", "hparams_key")
DATASET, ALGORITHM, TRIAL_SEED, HPARAMS_SEED, TEST_ENVS, ENV_NAMES, DATA_KEY, HPARAMS_KEY = \
    range(len(KEY_FIELDS))
_dumps = json.JSONEncoder(default=repr).encode


def key_values(args: Any, hparams: Any) -> tuple[Any, ...]:
    """The KEY_FIELDS values of one block's args and hparams."""
    get = args.get
    return (get("dataset"), get("algorithm"), get("trial_seed"), get("hparams_seed"),
            get("test_envs"), get("env_names"), [get(k) for k in DATA_KEYS],
            [str(get("hparams_seed")), json.dumps(hparams, sort_keys=True, default=str)])


_HPARAMS_JSON: dict[bytes, str] = {}    # hparams JSON bytes -> their sorted dump, as JSON
_encode_string = json.encoder.encode_basestring_ascii   # (what json writes a str as)


def key_texts(args: Any, hparams: Any, hparams_text: bytes | None = None
              ) -> tuple[str, ...]:
    """The JSON texts of `key_values` (what a worker process sends back for a run);
    hparams_text: the hparams' JSON bytes, when known (the sorted dump is made once per
    distinct text)."""
    if hparams_text is None:
        return tuple(map(_dumps, key_values(args, hparams)))
    sorted_text = _HPARAMS_JSON.get(hparams_text)
    if sorted_text is None:
        sorted_text = _encode_string(json.dumps(hparams, sort_keys=True, default=str))
        if len(_HPARAMS_JSON) < 65536:
            _HPARAMS_JSON[hparams_text] = sorted_text
    get = args.get
    seed = get("hparams_seed")
    data = list(map(get, DATA_KEYS))
    return (_text(get("dataset")), _text(get("algorithm")), _text(get("trial_seed")),
            _text(seed), _text(get("test_envs")), _text(get("env_names")),
            _NO_DATA_TEXT if data == _NO_DATA else _dumps(data),
            f"[{_encode_string(str(seed))}, {sorted_text}]")   # (json's list of two str)


_NO_DATA = [None] * len(DATA_KEYS)
_NO_DATA_TEXT = _dumps(_NO_DATA)
_INTS = {int}


def _text(value: Any) -> str:
    """`value`'s JSON text, as json writes it (strings, ints and lists of ints quickly)."""
    kind = type(value)
    if kind is str:
        return _encode_string(value)
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    if kind is list and set(map(type, value)) <= _INTS:
        return f"[{', '.join(map(str, value))}]"
    return _dumps(value)


class RunKeys:
    """Per block, the code of each KEY_FIELDS value (`codes`: blocks x fields, int64), and
    per field the distinct values (`values`) and their JSON texts (`texts`)."""

    def __init__(self, codes: np.ndarray, values: list[list[Any]], texts: list[list[str]]
                 ) -> None:
        self.codes, self.values, self.texts = codes, values, texts

    def __len__(self) -> int:
        return len(self.codes)

    def column(self, field: int) -> np.ndarray:
        return self.codes[:, field]

    def value(self, field: int, block: int) -> Any:
        return self.values[field][int(self.codes[block, field])]

    def subset(self, blocks: np.ndarray) -> RunKeys:
        return RunKeys(self.codes[blocks], self.values, self.texts)

    def args_view(self, block_codes: Sequence[int], fields: Sequence[int]) -> dict[str, Any]:
        """An args dict holding only the key fields `fields` with these codes: what the
        grouping helpers read of a run's args."""
        args: dict[str, Any] = {}
        for field, code in zip(fields, block_codes):
            value = self.values[field][int(code)]
            if field == DATA_KEY:
                args.update(zip(DATA_KEYS, value))
            elif field != HPARAMS_KEY:
                args[KEY_FIELDS[field]] = value
        return args

    def distinct(self, fields: Sequence[int], blocks: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(combos, inverse): the distinct code combinations of `fields` over the blocks
        (rows, in order of first appearance) and each block's combination number."""
        codes = self.codes if blocks is None else self.codes[blocks]
        combos, inverse, _ = distinct_rows(codes[:, list(fields)])
        return combos, inverse


def first_seen(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, firsts): each value's number among the distinct values of an integer
    array, numbered in order of first appearance, and where each first appears (small
    non-negative values by their first positions, no sort of the values)."""
    values = np.asarray(values, dtype=np.int64)
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low <= 4 * n + 1024:
        first = np.full(high - low + 1, n, dtype=np.int64)
        np.minimum.at(first, values - low, np.arange(n, dtype=np.int64))
        present = np.flatnonzero(first < n)
        order = np.argsort(first[present], kind="stable")
        rank = np.empty(len(first), dtype=np.int64)
        rank[present[order]] = np.arange(len(present))
        return rank[values - low], first[present[order]]
    _, first_at, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first_at, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inverse.reshape(-1)], first_at[order]


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(combos, inverse, firsts) of the rows of an integer matrix: the distinct rows in
    order of first appearance, each row's number among them, where each first appears.
    Rows become one integer (mixed radix) where their ranges allow."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2 or len(rows) == 0:
        width = rows.shape[1] if rows.ndim == 2 else 0
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros((0, width), dtype=np.int64), empty, empty
    low = rows.min(axis=0)
    spans = (rows.max(axis=0) - low + 1).tolist()
    size = 1
    for span in spans:
        size *= span
    if size < 2 ** 62:
        key = np.zeros(len(rows), dtype=np.int64)
        for j, span in enumerate(spans):
            key = key * span + (rows[:, j] - low[j])
        inverse, firsts = first_seen(key)
    else:
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        inverse, firsts = rank[inverse.reshape(-1)], first[order]
    return rows[firsts], inverse, firsts


class KeysBuilder:
    """Codes blocks' key values as they are added; `finish` gives the RunKeys."""

    def __init__(self, values: list[list[Any]] | None = None,
                 texts: list[list[str]] | None = None) -> None:
        self.values = [list(v) for v in values] if values else [[] for _ in KEY_FIELDS]
        self.texts = [list(t) for t in texts] if texts else [[] for _ in KEY_FIELDS]
        self._codes_of = [dict(zip(t, range(len(t)))) for t in self.texts]
        self.rows: list[tuple[int, ...]] = []       # blocks added one by one, not flushed
        self._segments: list[np.ndarray] = []
        self._by_objects: dict[tuple[int, int], tuple[int, ...]] = {}

    def code_texts(self, texts: Sequence[str], values: Sequence[Any] | None = None
                   ) -> tuple[int, ...]:
        """The codes of one block's key texts (values: decoded from the texts if None)."""
        codes = []
        for field, text in enumerate(texts):
            code = self._codes_of[field].get(text)
            if code is None:
                code = self._codes_of[field][text] = len(self.texts[field])
                self.texts[field].append(text)
                self.values[field].append(json.loads(text) if values is None
                                          else values[field])
            codes.append(code)
        return tuple(codes)

    def code_text(self, field: int, text: str, value: Any) -> int:
        """The code of one field's value (its JSON text `text`; `value`: None to decode
        it from the text), added when new."""
        code = self._codes_of[field].get(text)
        if code is None:
            code = self._codes_of[field][text] = len(self.texts[field])
            self.texts[field].append(text)
            self.values[field].append(json.loads(text) if value is None else value)
        return code

    def add_texts(self, texts: Sequence[str]) -> None:
        self.rows.append(self.code_texts(texts))

    def add_code_rows(self, codes: np.ndarray) -> None:
        """Many blocks' codes at once (codes into this builder's tables)."""
        self.flush()
        self._segments.append(np.asarray(codes, dtype=np.int64).reshape(-1, len(KEY_FIELDS)))

    def flush(self) -> None:
        if self.rows:
            self._segments.append(np.array(self.rows, dtype=np.int64))
            self.rows = []

    def add_objects(self, args: Any, hparams: Any) -> None:
        """Add a block by its args and hparams objects (worked out once per pair of
        objects: the blocks of a run share them)."""
        shared = (id(args), id(hparams))
        codes = self._by_objects.get(shared)
        if codes is None:
            values = key_values(args, hparams)
            codes = self._by_objects[shared] = self.code_texts(
                [_dumps(v) for v in values], values)
        self.rows.append(codes)

    def finish(self) -> RunKeys:
        self.flush()
        codes = np.concatenate(self._segments) if self._segments else \
            np.zeros((0, len(KEY_FIELDS)), dtype=np.int64)
        for field in (DATA_KEY, HPARAMS_KEY):   # lists from JSON: tuples, as in grouping
            self.values[field] = [tuple(v) if isinstance(v, list) else v
                                  for v in self.values[field]]
        return RunKeys(codes, self.values, self.texts)
