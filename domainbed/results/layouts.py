"""What a layout of record keys keeps, worked out once per layout (a sweep repeats the
same few layouts a million times): which keys the tables keep (`fields`: those and the
``env*`` ones) and the letters of their kinds (``a`` args, ``h`` hparams, ``i`` int, ``f``
float), for the two whole-file readers of `lines.py`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


class LayoutShape(NamedTuple):
    """What a layout of keys and types keeps: `kept` keys, their `types` string, and the
    `ints` among them."""
    kept: tuple[str, ...]
    types: str
    ints: tuple[str, ...]


_LAYOUT_SHAPES: dict[tuple[Any, ...], LayoutShape | None] = {}   # (keys, kinds, fields) -> shape


def layout_shape(kind_of: dict[str, type], fields: Sequence[str] | None) -> LayoutShape | None:
    """The LayoutShape of a layout (worked out once per layout), or None where a kept key is
    neither a number nor args / hparams."""
    cache_key = (tuple(kind_of), tuple(kind_of.values()),
                 tuple(fields) if fields else None)
    found = _LAYOUT_SHAPES.get(cache_key, False)
    if found is not False:
        return found   # type: ignore[return-value]
    keys = list(kind_of)
    kept = [k for k in keys if k in fields or k.startswith("env")] if fields else keys
    numeric = [k for k in kept if k not in ("args", "hparams")]
    found = None
    if all(kind_of[k] in (float, int) for k in numeric):
        types = "".join("a" if k == "args" else "h" if k == "hparams" else
                        "i" if kind_of[k] is int else "f" for k in kept)
        found = LayoutShape(tuple(kept), types, tuple(k for k in numeric if kind_of[k] is int))
    if len(_LAYOUT_SHAPES) < 1024 and sum(map(len, keys)) < 4096:
        _LAYOUT_SHAPES[cache_key] = found
    return found


class TakeShape(NamedTuple):
    """What a layout of keys and kinds keeps: its `layout` (kept keys, kinds), where its
    `hparams` and `step` are among a line's `width` values, and `columns`, where each
    kept one is (args: the hparams stand-in's place)."""
    layout: tuple[tuple[str, ...], str]
    hparams: int
    step: int
    width: int
    columns: np.ndarray
    takes: dict[int, np.ndarray]

    def taken(self, rows: int) -> np.ndarray:
        """Indices into `rows` lines' values, one line a row (the first line's hparams
        stand-in where it keeps args / hparams)."""
        found = self.takes.get(rows)
        if found is None:
            found = np.arange(rows)[:, None] * self.width + self.columns
            found[:, self.columns == self.hparams] = self.hparams
            if len(self.takes) < 64:
                self.takes[rows] = found
        return found


_TAKE_SHAPES: dict[tuple[Any, ...], TakeShape | None] = {}


def take_shape(keys: list[str], kinds: list[type], fields: Sequence[str] | None
                ) -> TakeShape | None:
    """The TakeShape of lines of these keys and kinds (worked out once), or None where
    a key other than hparams is not a number (a later args key is the first line's
    args: `record_problem` sees it)."""
    cache_key = (tuple(keys), tuple(kinds), tuple(fields) if fields else None)
    found = _TAKE_SHAPES.get(cache_key, False)
    if found is not False:
        return found   # type: ignore[return-value]
    found = None
    numbers = [k for k, kind in zip(keys, kinds) if kind is int or kind is float]
    if "hparams" in keys and "step" in keys and len(numbers) == len(keys) - 1:
        everything = ["args", *keys]
        kept = [k for k in everything if k in fields or k.startswith("env")] if fields \
            else everything
        at = keys.index("hparams")
        kind_of = dict(zip(keys, kinds))
        types = "".join("a" if k == "args" else "h" if k == "hparams" else
                        "i" if kind_of[k] is int else "f" for k in kept)
        columns = [at if k == "args" else keys.index(k) for k in kept]
        found = TakeShape((tuple(kept), types), at, keys.index("step"), len(keys),
                           np.array(columns, dtype=np.int64), {})
    if len(_TAKE_SHAPES) < 1024 and sum(map(len, keys)) < 4096:
        _TAKE_SHAPES[cache_key] = found
    return found
