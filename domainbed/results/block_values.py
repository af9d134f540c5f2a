"""A value per block (its args or hparams: an object, or the JSON bytes it is decoded
from on first use) without a Python object per block where the values come from a
records index: `Texts` cuts each block's bytes from one blob only when asked for (a
report never asks: it reads key codes), `BlockValues` strings such pieces and plain lists
together in block order, and `ValuesBuilder` gathers them as a table is built."""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, Protocol, Union

import numpy as np


class Blob(Protocol):
    """Bytes, or what gives bytes when cut (``record_index.FileTail``: a file's tail read
    on the first cut)."""

    def __getitem__(self, cut: slice, /) -> bytes: ...


class Texts(Sequence[bytes]):
    """Byte strings cut from one blob on access: item i is ``blob[starts[i]:ends[i]]``."""
    __slots__ = ("blob", "starts", "ends", "_bounds")

    def __init__(self, blob: Blob, starts: np.ndarray, ends: np.ndarray) -> None:
        self.blob, self.starts, self.ends = blob, starts, ends
        self._bounds: tuple[list[int], list[int]] | None = None

    @classmethod
    def from_ends(cls, blob: Blob, ends: np.ndarray, at: int = 0) -> Texts:
        """The texts laid end to end in `blob` from offset `at`, each ending at its
        `ends` offset (counted from `at`)."""
        starts = np.full(len(ends), at, dtype=np.int64)
        starts[1:] += ends[:-1]
        return cls(blob, starts, ends + at)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        if self._bounds is None:      # Python ints: a numpy scalar index costs more
            self._bounds = (self.starts.tolist(), self.ends.tolist())
        starts, ends = self._bounds
        return self.blob[starts[i]:ends[i]]

    def take(self, index: np.ndarray) -> Texts:
        """These items (numbers into this sequence), cut from the same blob."""
        return Texts(self.blob, self.starts[index], self.ends[index])

    def tolist(self) -> list[bytes]:
        blob = self.blob
        return [blob[a:b] for a, b in zip(self.starts.tolist(), self.ends.tolist())]


_UNSET = object()


class BlockValues(Sequence[Any]):
    """One value per block from pieces (lists, or Texts) laid end to end; ``values[i] =
    x`` replaces one (the object decoded from its bytes)."""

    def __init__(self, pieces: Sequence[Sequence[Any]]) -> None:
        self.pieces = [p for p in pieces if len(p)]
        self.firsts = np.cumsum([0] + [len(p) for p in self.pieces]).tolist()
        self.replaced: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.firsts[-1]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        found = self.replaced.get(i, _UNSET)
        if found is not _UNSET:
            return found
        piece = bisect_right(self.firsts, i) - 1
        return self.pieces[piece][i - self.firsts[piece]]

    def tolist(self) -> list[Any]:
        """Every value, in one pass over the pieces (not one lookup each)."""
        values: list[Any] = []
        for piece in self.pieces:
            values += piece.tolist() if isinstance(piece, Texts) else piece
        for i, value in self.replaced.items():
            values[i] = value
        return values

    def __setitem__(self, i: int, value: Any) -> None:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        self.replaced[i] = value


Values = Union[list[Any], BlockValues]


def as_list(values: Values) -> list[Any]:
    return values.tolist() if isinstance(values, BlockValues) else values


def take(values: Values, index: np.ndarray) -> Values:
    """values[index] (numbers into `values`), still cut on access where it is one piece
    of Texts."""
    if isinstance(values, BlockValues) and len(values.pieces) == 1 and \
            not values.replaced and isinstance(values.pieces[0], Texts):
        return BlockValues([values.pieces[0].take(index)])
    return [values[i] for i in index.tolist()]


class ValuesBuilder:
    """Gathers the values of blocks added one by one (`append`) or many at once
    (`extend`; Texts are kept as they are); `finish` gives a list where none were Texts."""

    def __init__(self) -> None:
        self.pieces: list[Sequence[Any]] = []
        self._tail: list[Any] = []
        self.append = self._tail.append

    def extend(self, values: Sequence[Any]) -> None:
        if isinstance(values, Texts):
            if self._tail:
                self.pieces.append(self._tail)
                self._tail = []
                self.append = self._tail.append
            self.pieces.append(values)
        else:
            self._tail.extend(values)

    def __len__(self) -> int:
        return sum(map(len, self.pieces)) + len(self._tail)

    def finish(self) -> Values:
        if not self.pieces:
            return self._tail
        return BlockValues([*self.pieces, self._tail])
