"""Parsing a results.jsonl's bytes into records: line by line (the reference: each line
on its own, a bad one skipped with a note), and a whole file at once where it has the
shape every writer gives it (the same args and hparams bytes on every line), which reads
the same records for a fraction of the work.

Records are untrusted: orjson parses where it reads a line as json would, json decides
elsewhere; each record is held to ``domainbed.results.schema``.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from domainbed.results import rows_kernel
from domainbed.results.columns import Part
from domainbed.results.layouts import layout_shape, take_shape
from domainbed.results.run_keys import key_texts
from domainbed.results.schema import MAX_DEPTH, record_problem, shallow_record_problem
from oodutils.untrusted import parse_json

try:  # parses records about three times faster than json; json where it is absent
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; kept optional at runtime
    _orjson = None  # type: ignore[assignment]

Record = dict[str, Any]


def _version(text: str) -> tuple[int, ...]:
    """(major, minor) of a version string ((0,) where it does not start with numbers)."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:2]]
    return tuple(numbers) if re.match(r"\d", text) else (0,)


# orjson 3.10 and later refuse to nest deeper than 1024 levels with an error (then the
# line reader decides); older ones may crash on thousands: a whole file is counted first
_DEPTH_SAFE = _orjson is not None and _version(getattr(_orjson, "__version__", "")) >= (3, 10)
MAX_LINE_BYTES = 4 << 20  # a record is a few kB; a longer line is skipped, never held


# A line's bytes mapped to their shape (digits to 0, "." and "e" kept, others to a space):
# an integer of 19 digits or more shows as a space then 19 zeros (a fraction's digits
# follow a "."), and the line goes to json (orjson would make it a float)
_NUMBER_SHAPE = bytes(48 if 48 <= b <= 57 else b if b in b".e" else 101 if b == 69 else 32
                      for b in range(256))
_LONG_INTEGER = b" " + b"0" * 19


_MAX_FAST_BRACKETS = 256   # orjson 3.8 crashes on nesting thousands deep: json reads those


def _loads(line: bytes) -> Any:
    """The JSON value of one line, or None. orjson where it reads the line as json would
    (it rejects NaN, big numbers, a BOM and lone surrogates, which json takes, and makes
    integers of 19 digits or more floats, which json does not): then json decides."""
    if _orjson is not None and _LONG_INTEGER not in line.translate(_NUMBER_SHAPE) and \
            line.count(b"[") + line.count(b"{") <= _MAX_FAST_BRACKETS:
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass
    return parse_json(line)


def _kept(record: Record, fields: Sequence[str] | None) -> Record:
    if fields is None:
        return record
    return {k: v for k, v in record.items() if k in fields or k.startswith("env")}


def parse_run_lines(path: str, lines: Iterable[bytes | None], notes: list[str] | None = None,
                    fields: Sequence[str] | None = None) -> tuple[list[Record], int]:
    """(records, skipped) of the lines of one results.jsonl (None: an over-long line).

    Lines of one run carry the same ``args`` and ``hparams``: a line whose objects are the
    previous record's (the same bytes, or the same values of the same types) gets those very
    objects, so they are held once and checked once.
    fields: keep only these keys and the ``env*`` ones (TABLE_FIELDS: what the tables read)."""
    records: list[Record] = []
    skipped = 0
    checked: Record | None = None
    args_prefix = b""
    for number, raw in enumerate(lines, start=1):
        problem: str | None = None
        if raw is None:
            problem = f"longer than {MAX_LINE_BYTES} bytes"
        elif not raw.strip():
            continue
        else:
            record = _loads(raw)
            if record is None:
                problem = "not JSON (corrupt, truncated or nested too deeply)"
            else:
                if checked is not None and isinstance(record, dict):
                    same_bytes = bool(args_prefix) and raw.startswith(args_prefix) and \
                        _leading_args_rule(raw, args_prefix)
                    _share(record, checked, same_bytes)
                problem = record_problem(record, checked)
        if problem is not None:
            skipped += 1
            if notes is not None:
                notes.append(f"{path} line {number}: {problem}")
            continue
        if checked is None or record["args"] is not checked["args"]:
            args_prefix = _args_prefix(raw)  # type: ignore[arg-type]
            if not _leading_args_rule(raw, args_prefix):  # type: ignore[arg-type]
                args_prefix = b""
        checked = record
        records.append(_kept(record, fields))
    return records, skipped


def _leading_args_rule(raw: bytes, prefix: bytes) -> bool:
    """Whether the args a line starts with (`prefix`) are the line's args: no later key
    reads as "args", spelled out or with an escape (json keeps the last)."""
    return raw.count(b'"args"') == 1 and b"\\" not in raw[len(prefix):]


_ARGS_START = b'{"args": '
_DECODER = json.JSONDecoder()


def _args_prefix(raw: bytes) -> bytes:
    """The bytes of `raw` up to the end of its leading ``{"args": {...}`` (a line that
    starts with them has the same args), or b"" when the line does not start so."""
    if not raw.startswith(_ARGS_START):
        return b""
    try:
        text = raw.decode("utf-8")
        _, end = _DECODER.raw_decode(text, len(_ARGS_START))
    except (ValueError, RecursionError):
        return b""
    return text[:end].encode("utf-8")


def _share(record: Record, previous: Record, same_args_bytes: bool) -> None:
    """Give `record` the previous record's args / hparams objects where they are the same
    value: equal, and equal in repr (so 1 and 1.0, True and 1, 0.0 and -0.0, or another key
    order never pass for each other)."""
    if "args" in record and (same_args_bytes or _same(record["args"], previous["args"])):
        record["args"] = previous["args"]
    if "hparams" in record and "hparams" in previous and \
            _same(record["hparams"], previous["hparams"]):
        record["hparams"] = previous["hparams"]


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types and key order (repr decides where values nest or where
    a zero could be -0.0)."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if type(a) is dict:
        types = list(map(type, a.values()))
        if list(a) != list(b) or types != list(map(type, b.values())):
            return False
        if dict not in types and list not in types and 0.0 not in a.values():
            return True
    return repr(a) == repr(b)


_STAND_IN = b'"\\u0000oodbed\\u0000"'     # a JSON string no writer puts in a record
_STAND_IN_VALUE = json.loads(_STAND_IN)
_EXACT_INT = 2 ** 53
_HPARAMS_AT = b', "hparams": {'


def parse_whole_file(data: bytes, fields: Sequence[str] | None = None
                     ) -> list[Record] | None:
    """The records of a whole results.jsonl, as `parse_run_lines` reads them, when every
    line starts with the same ``{"args": {...}`` bytes, holds the first line's
    ``"hparams": {...}`` bytes once, and fits the schema (what DomainBed and we write); else
    None, and the line-by-line reader decides (it also names any bad line).

    The shared objects are parsed once; the rest of every line, with a stand-in for them,
    in one orjson call."""
    found = _parse_shared(data)
    if found is None:
        return None
    parsed, args, hparams = found[:3]
    return _shared_records(parsed, args, hparams, fields)


def whole_file_part(data: bytes, fields: Sequence[str] | None = None) -> Part | None:
    """`parse_whole_file`'s records as one lossless Part, straight from the parsed lines
    (no record dict is built), where every line has the same keys with the same types,
    floats and ints a float64 holds; else None (then ask `parse_whole_file`)."""
    found = _whole_file(data, fields)
    return found[0] if found is not None else None


def whole_file_coded(data: bytes, fields: Sequence[str] | None = None
                     ) -> tuple[Part, tuple[str, ...]] | None:
    """`whole_file_part`'s Part with its args and hparams as their JSON bytes in the file
    (what crosses between processes and goes into the records index; ``parse_json_value``
    gives the objects back), and its ``run_keys.key_texts``."""
    found = _whole_file(data, fields)
    if found is None:
        return None
    part, args_text, hparams_text = found
    return Part(part.layout, args_text, hparams_text, part.values, part.records), \
        key_texts(part.args, part.hparams, hparams_text)


def parse_json_value(text: bytes) -> Any:
    """A JSON value as the readers parse it (orjson where it reads as json would)."""
    return _loads(text)


def _whole_file(data: bytes, fields: Sequence[str] | None
                ) -> tuple[Part, bytes, bytes] | None:
    """(part, args JSON, hparams JSON) of a file whose lines all parse as json would
    parse each, with the same keys in the same order, values of the same types, args and
    hparams objects that serialize alike (so the line reader shares them too), numbers a
    float64 holds, fitting the schema; else None. Files of the usual shape take the
    quick way (`_shared_file`), others have every line parsed whole (`_parsed_file`)."""
    found = _shared_file(data, fields)
    return found if found is not None else _parsed_file(data, fields)


def _parsed_file(data: bytes, fields: Sequence[str] | None
                 ) -> tuple[Part, bytes, bytes] | None:
    """`_whole_file` with every line parsed whole, checked key by key (one column of
    values per key), not line by line."""
    if _orjson is None or not data.startswith(b"{") or len(data) >= MAX_LINE_BYTES or \
            data.endswith(b"\n\n") or (not _DEPTH_SAFE and _too_nested(data)):
        return None   # (nesting within 1024 levels: the schema check of args / hparams)
    try:   # line by line: lines joined into one array could parse where each does not
        parsed = list(map(_orjson.loads, data.rstrip(b"\n").split(b"\n")))
    except _orjson.JSONDecodeError:
        return None
    if not parsed or set(map(type, parsed)) != {dict}:
        return None
    keys = tuple(parsed[0])
    if len(set(map(tuple, parsed))) != 1 or "args" not in keys or "hparams" not in keys:
        return None
    column_of = dict(zip(keys, zip(*map(itemgetter(*keys), parsed))))
    kind_sets = [set(map(type, column)) for column in column_of.values()]
    if any(len(kinds) != 1 for kinds in kind_sets):
        return None
    kind_of = dict(zip(keys, (kinds.pop() for kinds in kind_sets)))
    kinds = list(kind_of.values())
    if list in kinds or kinds.count(dict) != 2 or kind_of["args"] is not dict or \
            kind_of["hparams"] is not dict:
        return None
    first = parsed[0]
    if record_problem(first) is not None:
        return None   # (first: what follows recurses into args and hparams)
    dumps = _orjson.dumps
    args_text, hparams_text = dumps(first["args"]), dumps(first["hparams"])
    rows = len(parsed)    # (counted, not put in a set: a set would hash every text)
    if list(map(dumps, column_of["args"])).count(args_text) != rows or \
            list(map(dumps, column_of["hparams"])).count(hparams_text) != rows:
        return None
    if _holds_huge_float(first["args"]) or _holds_huge_float(first["hparams"]):
        return None   # perhaps an integer of 19 digits or more that orjson made a float
    return _layout_part(first, kind_of, column_of, fields, args_text, hparams_text)


_HUGE = 1e18   # an integer literal orjson reads otherwise than json is a float beyond it


def _holds_huge_float(value: Any) -> bool:
    """Whether `value` holds a float of magnitude 1e18 or more (or NaN) anywhere within."""
    kind = type(value)
    if kind is float:
        return not -_HUGE < value < _HUGE
    if kind is not dict and kind is not list:
        return False
    items = value.values() if kind is dict else value
    kinds = set(map(type, items))
    if float in kinds and any(not -_HUGE < v < _HUGE for v in items if type(v) is float):
        return True
    return (dict in kinds or list in kinds) and \
        any(map(_holds_huge_float, (v for v in items if type(v) in _CONTAINERS)))


_CONTAINERS = (dict, list)


def _layout_part(first: Record, kind_of: dict[str, type], column_of: dict[str, Any],
                 fields: Sequence[str] | None, args_text: bytes, hparams_text: bytes
                 ) -> tuple[Part, bytes, bytes] | None:
    """The Part of lines of one layout (`kind_of` each key's type; `column_of` its values,
    line by line) whose first line is `first` (found to fit the schema: every line has
    its args and hparams, and its keys of the same types), when its numbers fit a float64
    (and none kept is a float an integer literal may have become) and every step is >= 0."""
    shape = layout_shape(kind_of, fields)
    if shape is None or any(min(column_of[k]) < -_EXACT_INT or max(column_of[k]) > _EXACT_INT
                            for k in shape.ints):
        return None
    if "step" in column_of and min(column_of["step"]) < 0:
        return None   # (kept or not: every line's step is checked, as the line reader does)
    no_number = (np.nan,) * len(column_of["args"])
    by_key = np.array([no_number if t in "ah" else column_of[k]
                       for k, t in zip(shape.kept, shape.types)], dtype=np.float64)
    if (np.abs(by_key) >= _HUGE).any():    # (NaN is not)
        return None
    values = np.ascontiguousarray(by_key.T)
    return Part((shape.kept, shape.types), first["args"], first["hparams"], values, None), \
        args_text, hparams_text


def _too_nested(data: bytes) -> bool:
    """Whether some line of `data` nests deeper than orjson reads safely (json reads it)."""
    return data.count(b"[") + data.count(b"{") > _MAX_FAST_BRACKETS and \
        any(line.count(b"[") + line.count(b"{") > _MAX_FAST_BRACKETS
            for line in data.split(b"\n"))


def _parse_shared(data: bytes) -> tuple[list[Any], Any, Any, bytes, bytes] | None:
    """(the parsed lines with stand-ins for args and hparams, args, hparams), or None
    where the file does not have the shape `parse_whole_file` reads. Works on the whole
    file's bytes at once: a raw newline ends a line (JSON strings escape theirs), so a
    prefix found after every newline starts every line."""
    if _orjson is None or not data.startswith(_ARGS_START) or \
            len(data) >= MAX_LINE_BYTES or data.endswith(b"\n\n"):
        return None
    if _too_nested(data) or b"\\u0000" in data:
        return None   # (a string decoding to the stand-in holds that escape: json's choice)
    shared = _shared_bytes(data[:data.find(b"\n")] if b"\n" in data else data)
    if shared is None:
        return None
    prefix, hparams_bytes = shared
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if data.count(b"\n" + prefix) != lines - 1 or data.count(hparams_bytes) != lines:
        return None       # (a line holding them twice leaves another without: see below)
    body = (b"\n" + data.rstrip(b"\n")).replace(b"\n" + prefix, b'\n{"args": ' + _STAND_IN)
    body = body.replace(hparams_bytes, b', "hparams": ' + _STAND_IN).replace(b"\n", b",")
    if _LONG_INTEGER in body.translate(_NUMBER_SHAPE):   # orjson would make it a float
        return None
    try:
        parsed = _orjson.loads(b"[" + body[1:] + b"]")
    except _orjson.JSONDecodeError:
        return None
    if len(parsed) != lines:
        return None   # (one line left open, the next closing it: one record of two bad lines)
    args_text, hparams_text = prefix[len(_ARGS_START):], hparams_bytes[len(_HPARAMS_AT) - 1:]
    args, hparams = _loads(args_text), _loads(hparams_text)
    if type(args) is not dict or type(hparams) is not dict:
        return None
    return parsed, args, hparams, args_text, hparams_text   # callers check each stand-in


def _shared_bytes(line: bytes) -> tuple[bytes, bytes] | None:
    """(the ``{"args": {...}`` prefix, the ``, "hparams": {...}`` bytes) of a line."""
    prefix = _args_prefix(line)
    start = line.find(_HPARAMS_AT, len(prefix)) if prefix else -1
    if start < 0:
        return None
    try:
        text = line[start:].decode("utf-8")
        _, end = _DECODER.raw_decode(text, len(_HPARAMS_AT) - 1)
    except (ValueError, RecursionError):
        return None
    return prefix, text[:end].encode("utf-8")


def _shared_records(parsed: Any, args: Any, hparams: Any, fields: Sequence[str] | None
                    ) -> list[Record] | None:
    """The parsed lines with the shared objects in their places, all fitting the schema;
    None where one does not (the line-by-line reader then notes it)."""
    stand_in = _STAND_IN_VALUE
    records = []
    checked: Record | None = None
    for record in parsed:
        if not isinstance(record, dict) or record.get("args") != stand_in or \
                record.get("hparams") != stand_in:
            return None
        record["args"], record["hparams"] = args, hparams
        if record_problem(record, checked) is not None:
            return None
        checked = record
        records.append(_kept(record, fields))
    return records


_ARGS_OBJECT = _ARGS_START + b"{"
_HPARAMS_KEY = b'"hparams": '
_ROW_SEPARATOR = b"\n,{"   # (a raw newline: no string of one line runs on into the next)
_DICTS = {dict}


def _shared_file(data: bytes, fields: Sequence[str] | None
                 ) -> tuple[Part, bytes, bytes] | None:
    """`_whole_file`'s answer for a file of the usual shape, with its args and hparams
    parsed once, not once a line: every line starts with the first line's
    ``{"args": {...}, `` bytes, which are left out, and holds its ``"hparams": {...}``
    bytes; what is left of every line (numbers only) is read by the compiled reader
    (`rows_kernel`) or, where it declines or is not built, in one orjson call
    (`_spliced_numbers`). None where the file has another shape (then `_parsed_file`
    reads it): each check keeps what is read equal to what the line reader reads."""
    if not data.startswith(_ARGS_OBJECT) or len(data) >= MAX_LINE_BYTES or \
            (b"\\" in data and b"\\u0000" in data) or (not _DEPTH_SAFE and _too_nested(data)):
        return None   # (a string decoding to the stand-in holds that escape)
    shared = _first_line_objects(data)
    if shared is None:
        return None
    head, args_text, args, hparams_text, hparams = shared
    if _brackets(args_text) >= MAX_DEPTH or _brackets(hparams_text) >= MAX_DEPTH:
        return None   # (then a line of them and numbers may nest too deep: see below)
    read = rows_kernel.load()
    found = None if read is None else _kernel_numbers(read, data, len(head), hparams_text)
    if found is None:
        found = _spliced_numbers(data, len(head), hparams_text)
        if found is None:
            return None
    keys, kinds, numbers, first_row = found
    shape = take_shape(keys, kinds, fields)
    if shape is None:
        return None
    first = {"args": args, **first_row}
    first["hparams"] = hparams     # (nesting one level deeper than args or hparams)
    if shallow_record_problem(first) is not None:
        return None
    numbers[shape.hparams] = np.nan
    return Part(shape.layout, args, hparams,
                numbers.take(shape.taken(len(numbers) // shape.width)), None), \
        args_text, hparams_text


_Numbers = tuple[list[str], list[type], np.ndarray, Record]


def _kernel_numbers(read: Any, data: bytes, cut: int, hparams_text: bytes) -> _Numbers | None:
    """(keys of a line, their kinds (str: hparams), every line's numbers one after the
    other (0 for hparams), the first line's record without args) from the compiled
    reader, which checks what `_spliced_numbers` checks; None where it declines."""
    found = rows_kernel.read_rows(read, data, cut, hparams_text)
    if found is None:
        return None
    layout, numbers = found
    first_row = dict(zip(layout.keys, numbers[0].tolist()))
    for key in layout.int_keys:
        first_row[key] = int(first_row[key])
    return layout.keys, layout.kinds, numbers.reshape(-1), first_row


def _spliced_numbers(data: bytes, cut: int, hparams_text: bytes) -> _Numbers | None:
    """`_kernel_numbers`'s answer in Python: each line without its first `cut` bytes and
    with a stand-in for the first ``"hparams": `` key's object, spliced into a JSON array
    parsed in one orjson call; None unless every line has the first line's keys in its
    order, of the same kinds, numbers but for hparams (the stand-in, no later "hparams"
    key replacing it), a float64 holding every number and "step" >= 0."""
    found = _stand_in_rows(data, cut, hparams_text)
    if found is None:
        return None
    try:
        parsed = _orjson.loads(found[0])
    except _orjson.JSONDecodeError:
        return None
    rows = found[1]
    if set(map(type, parsed)) != _DICTS:
        return None
    keys = list(parsed[0])
    width = len(keys)
    if list(chain.from_iterable(parsed)) != keys * rows:
        return None   # (so each of the `rows` objects has these keys in this order)
    values = list(chain.from_iterable(map(dict.values, parsed)))
    kinds = list(map(type, values[:width]))
    if list(map(type, values)) != kinds * rows or "hparams" not in keys or \
            "step" not in keys:
        return None
    at = keys.index("hparams")
    if values[at::width].count(_STAND_IN_VALUE) != rows or \
            any(kind is not int and kind is not float for kind in kinds[:at] + kinds[at + 1:]):
        return None
    values[at::width] = (0.0,) * rows
    if min(values[keys.index("step")::width]) < 0:
        return None
    numbers = np.array(values, dtype=np.float64)
    if np.abs(numbers).max() >= _EXACT_INT:
        return None   # (an int a float64 may not hold, or what orjson made of one)
    return keys, kinds, numbers, parsed[0]


def _brackets(text: bytes) -> int:
    """How many "[" and "{" a JSON text holds: no fewer than the levels it nests."""
    return text.count(b"[") + text.count(b"{")


def _first_line_objects(data: bytes) -> tuple[bytes, bytes, Any, bytes, Any] | None:
    """(head, args JSON, args, hparams JSON, hparams) of the first line: its
    ``{"args": {...}, `` bytes, and its first ``"hparams": `` key's object."""
    stop = data.find(b"\n")
    stop = len(data) if stop < 0 else stop
    found = _object_at(data, len(_ARGS_START), stop)
    if found is None:
        return None
    args_text, args = found
    cut = len(_ARGS_START) + len(args_text)
    if not data.startswith(b", ", cut):
        return None
    at = data.find(_HPARAMS_KEY, cut + 2, stop)
    hparams = _object_at(data, at + len(_HPARAMS_KEY), stop) if at >= 0 else None
    if hparams is None:
        return None
    return data[:cut + 2], args_text, args, hparams[0], hparams[1]


def _object_at(data: bytes, start: int, stop: int) -> tuple[bytes, Any] | None:
    """(JSON bytes, value) of the object that starts at data[start], within `stop`, as
    json reads it; None where none does. Tried first up to the next "}" (an object
    holding no object)."""
    end = data.find(b"}", start, stop) + 1
    if end > 0:
        value = _loads(data[start:end])
        if type(value) is dict:
            return data[start:end], value
    try:
        text = data[start:stop].decode("utf-8")
        value, end = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return (text[:end].encode("utf-8"), value) if type(value) is dict else None


def _stand_in_rows(data: bytes, cut: int, hparams_text: bytes) -> tuple[bytes, int] | None:
    """(a JSON array of every line's object without its first `cut` bytes, with the
    stand-in for the first ``"hparams": `` key's object, lines)."""
    head, size, total = data[:cut], len(hparams_text), len(data)
    find, starts = data.find, data.startswith
    pieces = [b"[{"]
    start = 0
    while start < total:
        end = find(b"\n", start)
        end = total if end < 0 else end
        at = find(_HPARAMS_KEY, start + cut, end) + len(_HPARAMS_KEY)
        if not starts(head, start) or at < len(_HPARAMS_KEY) or not starts(hparams_text, at):
            return None
        pieces += (data[start + cut:at], _STAND_IN, data[at + size:end], _ROW_SEPARATOR)
        start = end + 1
    pieces[-1] = b"]"
    return b"".join(pieces), len(pieces) // 4
