"""Parsing a whole results.jsonl at once (domainbed.results.lines.parse_whole_file) reads
exactly the records the line-by-line reader reads, or declines (None) and leaves the file
to it: on DomainBed's test sweep, and on files made to differ (NaN, a duplicate key, big
integers, blank lines, CRLF, a bad line, hparams bytes inside args, other key orders)."""
import json
from pathlib import Path

import numpy as np
import pytest

from domainbed.results.columns import file_parts
from domainbed.results.lines import parse_run_lines, parse_whole_file, whole_file_part
from domainbed.results.records import TABLE_FIELDS

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tests" / "data" / "domainbed_test_sweep" / "test_sweep_data"


def _by_lines(data, fields=None):
    records, _ = parse_run_lines("f", data.splitlines(keepends=True), [], fields)
    return records


def _typed(records):
    """Records with every value's type, so 1 == 1.0 and True == 1 do not pass."""
    def typed(value):
        if isinstance(value, dict):
            return [(k, typed(v)) for k, v in value.items()]
        if isinstance(value, list):
            return [typed(v) for v in value]
        return (type(value).__name__, repr(value))
    return [typed(r) for r in records]


def _files():
    return sorted(SWEEP.glob("*/results.jsonl"))


@pytest.mark.parametrize("fields", [None, TABLE_FIELDS])
def test_domainbed_files_are_read_at_once_as_line_by_line(fields):
    files = _files()
    assert len(files) == 40
    for path in files:
        data = path.read_bytes()
        whole = parse_whole_file(data, fields)
        assert whole is not None, path
        assert _typed(whole) == _typed(_by_lines(data, fields))
        assert all(r["args"] is whole[0]["args"] and r["hparams"] is whole[0]["hparams"]
                   for r in whole)


def _variants(data):
    lines = data.decode().splitlines()
    first = json.loads(lines[0])
    reordered = json.dumps(dict(reversed(list(first.items()))))
    inside = dict(first, args=dict(first["args"], extra={"hparams": first["hparams"]}))
    return {
        "NaN value": data.replace(b'"step": 0', b'"step": 0, "env0_in_acc": NaN', 1),
        "NaN in hparams": data.replace(b'"hparams": {', b'"hparams": {"x": NaN, ', 1),
        "duplicate args": data.replace(b'"step": 0', b'"step": 0, "args": {}', 1),
        "big integer": data.replace(b'"step": 0', b'"step": 12345678901234567890', 1),
        "blank line": data.replace(b"\n", b"\n\n", 1),
        "crlf": data.replace(b"\n", b"\r\n"),
        "bad line": data.replace(b"\n", b"\n{not json\n", 1),
        "no newline at the end": data.rstrip(b"\n"),
        "other hparams": data.replace(b'"hparams": {', b'"hparams": {"x": 1, ', 1),
        "hparams bytes inside args": "\n".join([json.dumps(inside)] + lines[1:]).encode(),
        "args not first": "\n".join([reordered] + lines[1:]).encode(),
        "bom": b"\xef\xbb\xbf" + data,
        "lone surrogate": data.replace(b'"ERM"', b'"\\ud800"'),
        "bad step": data.replace(b'"step": 0', b'"step": -1', 1),
        "escaped later args": data.replace(
            b'"step": 300', b'"step": 300, "\\u0061rgs": ' + json.dumps(
                dict(first["args"], trial_seed=99)).encode(), 1),
        "stand-in as a later args": data.replace(
            b'"step": 0', b'"step": 0, "args": "\\u0000oodbed\\u0000"', 1),
        "a line left open inside args": _split_inside(lines, '"uda_holdout_fraction"'),
        "a line left open inside a list": _open_list(lines),
        "args under another name": data.replace(b'{"args": ', b'{"argz": '),
        "args closed twice": data.replace(b'}, "env0_in_acc"', b'}}, "env0_in_acc"'),
        "stand-in as a later hparams": data.replace(
            b'"step": 0', b'"step": 0, "hparams": "\\u0000oodbed\\u0000"', 1),
        "a later hparams string": data.replace(b'"step": ', b'"hparams": "x", "step": '),
        "other args on a later line": _edited(   # (of the same length)
            lines, lambda r: r["args"].update(seed=r["args"]["seed"] + 1)),
        "other hparams on a later line": _edited(
            lines, lambda r: r["hparams"].update(batch_size=r["hparams"]["batch_size"] + 1)),
        "keys in another order on a later line": _edited(
            lines, lambda r: _swap(r, "env0_in_acc", "env0_out_acc")),
        "a null accuracy on every line": b"\n".join(
            _edited(lines, lambda r: r.update(env0_in_acc=None), at).splitlines()[at]
            for at in range(len(lines))),
        "a number after a line's object": data.replace(b"}\n", b"}, 5\n", 1),
        "an int accuracy on a later line": _edited(lines, lambda r: r.update(env0_in_acc=1)),
        "bad step on a later line": _edited(lines, lambda r: r.update(step=-r["step"])),
        "a string left open at a line's end": _open_string(lines),
        "another hparams key before a later line's": _before_hparams(lines, "5"),
        "the shared hparams twice on a later line": _before_hparams(
            lines, _hparams_text(lines)),
        "a later line without hparams": _edited(lines, lambda r: r.pop("hparams")),
    }


def _before_hparams(lines, value, at=2):
    """Line `at` with another "hparams" key holding `value` just before its own (json
    keeps the last: the line reads as it did)."""
    cut = lines[at].index('}, "env0_in_acc"')
    edited = lines[at][:cut] + lines[at][cut:].replace(
        '"hparams": ', f'"hparams": {value}, "hparams": ', 1)
    return "\n".join(lines[:at] + [edited] + lines[at + 1:]).encode()


def _hparams_text(lines):
    """The first line's hparams object (not args' "hparams" key), as written."""
    rest = lines[0][lines[0].index('}, "env0_in_acc"'):]
    at = rest.index('"hparams": ') + len('"hparams": ')
    return rest[at:rest.index("}", at) + 1]


def _edited(lines, edit, at=2):
    """The file with line `at` changed by edit(record) (the others as they are)."""
    record = json.loads(lines[at])
    edit(record)
    return "\n".join(lines[:at] + [json.dumps(record)] + lines[at + 1:]).encode()


def _swap(record, a, b):
    """Keys `a` and `b` of `record` in each other's places."""
    items = [(b if k == a else a if k == b else k, record[b] if k == a else
              record[a] if k == b else v) for k, v in record.items()]
    record.clear()
    record.update(items)


def _open_string(lines):
    """Each line with a first key "x,{" after args, the first line's object followed by
    a string left open (`, {"x`) that the (then bad) second line closes: with a comma
    for the newline they would read as two records with the same keys."""
    cut = lines[0].index('}, "env0_in_acc"') + 3
    head, rests = lines[0][:cut], [line[cut:] for line in lines]
    opened = [head + '"x,{": 1, ' + rests[0] + ', {"x', head + '": 1, ' + rests[1]]
    return "\n".join(opened + [head + '"x,{": 1, ' + rest for rest in rests[2:]]).encode()


def _split_inside(lines, key):
    """The first line cut in two before `key` (two bad lines) and the second line put
    after the first's end: joined into one array they would parse as the two records."""
    at = lines[0].index(", " + key)
    return "\n".join([lines[0][:at], lines[0][at + 2:] + ", " + lines[1]] + lines[2:]).encode()


def _open_list(lines):
    """A first line left open in a list that the (then bad) second line closes."""
    return "\n".join([lines[0][:-1] + ', "m": [1', lines[1] + "]}"] + lines[2:]).encode()


@pytest.mark.parametrize("name", list(_variants(_files()[0].read_bytes())))
def test_a_file_read_at_once_reads_as_line_by_line_or_is_declined(name):
    data = _variants(_files()[0].read_bytes())[name]
    assert data != _files()[0].read_bytes()
    whole = parse_whole_file(data, TABLE_FIELDS)
    if whole is not None:
        assert _typed(whole) == _typed(_by_lines(data, TABLE_FIELDS)), name
    if name in ("NaN value", "duplicate args", "big integer", "blank line", "bad line",
                "other hparams", "args not first", "bom", "bad step",
                "stand-in as a later args", "a line left open inside args",
                "a line left open inside a list", "args under another name",
                "args closed twice", "stand-in as a later hparams", "a later hparams string",
                "a string left open at a line's end", "a number after a line's object"):
        assert whole is None, name        # the line-by-line reader decides these
    if name in ("crlf", "no newline at the end"):
        assert whole is not None, name


def _same_parts(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.layout == y.layout and x.args == y.args and x.hparams == y.hparams
        assert np.array_equal(x.values, y.values, equal_nan=True)
        assert _typed(x.to_records()) == _typed(y.to_records())


@pytest.mark.parametrize("fields", [None, TABLE_FIELDS])
def test_a_file_straight_into_columns_gives_the_line_by_line_blocks(fields):
    for path in _files():
        data = path.read_bytes()
        part = whole_file_part(data, fields)
        assert part is not None, path
        _same_parts([part], file_parts(_by_lines(data, fields)))


@pytest.mark.parametrize("name", list(_variants(_files()[0].read_bytes())))
def test_a_variant_straight_into_columns_gives_the_same_blocks_or_is_declined(name):
    data = _variants(_files()[0].read_bytes())[name]
    part = whole_file_part(data, TABLE_FIELDS)
    if part is not None:
        _same_parts([part], file_parts(_by_lines(data, TABLE_FIELDS)))
    null_value = data.replace(b'"env0_in_acc": ', b'"env0_in_acc": null, "x": ', 1)
    assert whole_file_part(null_value, TABLE_FIELDS) is None    # a null: kept as dicts


def test_worker_processes_read_what_one_process_reads(tmp_path, monkeypatch):
    """Cold reads of many files go to worker processes: the same records, in the same
    order, with the same notes (a corrupt line) and the same unreadable run."""
    from domainbed.results import parallel_read
    from domainbed.results.records import load_records
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for path in _files()[:12]:
        (sweep / path.parent.name).mkdir()
        (sweep / path.parent.name / "results.jsonl").write_bytes(path.read_bytes())
        (sweep / path.parent.name / "done").write_text("done")
    first = sorted(sweep.iterdir())[0] / "results.jsonl"
    first.write_bytes(first.read_bytes() + b"{broken\n")
    linked = sorted(sweep.iterdir())[1] / "results.jsonl"
    linked.unlink()
    linked.symlink_to(first)                   # not a regular file: unreadable
    one = load_records(sweep, quiet=True, fields=TABLE_FIELDS, use_index=False)
    monkeypatch.setattr(parallel_read, "MIN_FILES", 2)
    monkeypatch.setattr(parallel_read, "CHUNK", 5)
    monkeypatch.setattr(parallel_read, "workers", lambda: 2)
    calls = []
    real_pool = parallel_read.multiprocessing.get_context

    def counted(method):
        calls.append(method)
        return real_pool(method)
    monkeypatch.setattr(parallel_read.multiprocessing, "get_context", counted)
    many = load_records(sweep, quiet=True, fields=TABLE_FIELDS, use_index=False)
    assert calls == ["fork"]
    assert _typed(many.records) == _typed(one.records) and len(one.records) > 50
    assert one.skipped_runs == 1 and one.skipped_lines == 1 and len(one.notes) == 2
    assert many.notes == one.notes and many.skipped_runs == one.skipped_runs
    assert many.run_dirs == one.run_dirs


def test_long_digit_runs_in_strings_do_not_decline_a_file_but_long_integers_do():
    data = _files()[0].read_bytes()
    digits = "1234567890" * 3
    in_a_string = data.replace(b'"data_dir": "', f'"data_dir": "{digits}'.encode())
    assert in_a_string != data
    part = whole_file_part(in_a_string, TABLE_FIELDS)
    assert part is not None and part.args["data_dir"].startswith(digits)
    long_integer = data.replace(b'"step": ', f'"big": {digits}, "step": '.encode())
    assert long_integer != data
    assert whole_file_part(long_integer, None) is None     # orjson would make it a float
    records = _by_lines(long_integer)
    assert records[0]["big"] == int(digits) and type(records[0]["big"]) is int


@pytest.mark.parametrize("where", ["args", "args list", "hparams", "kept metric",
                                   "unkept metric", "huge float"])
def test_a_long_integer_anywhere_reads_as_json_reads_it(where):
    """orjson makes an integer literal beyond 64 bits a float (json keeps an int): a file
    holding one in a kept number is declined to the line reader, args and hparams (parsed
    once) are read as json reads them, and what is read straight into columns equals the
    line reader's."""
    data = _files()[0].read_bytes()
    digits = "1234567890" * 3
    edits = {"args": (b'"seed": ', f'"seed": {digits}, "x": '),
             "args list": (b'"test_envs": [', f'"test_envs": [{digits}, '),
             "hparams": (b'"hparams": {', f'"hparams": {{"big": -{digits}, '),
             "kept metric": (b'"step": ', f'"env0_out_acc_big": {digits}, "step": '),
             "unkept metric": (b'"step": ', f'"loss_big": {digits}, "step": '),
             "huge float": (b'"seed": ', '"seed": 1e19, "x": ')}
    old, new = edits[where]
    changed = data.replace(old, new.encode())
    assert changed != data
    by_lines = _by_lines(changed, TABLE_FIELDS)
    part = whole_file_part(changed, TABLE_FIELDS)
    if where in ("unkept metric", "args", "hparams", "huge float"):
        assert part is not None     # the dropped key cannot change what is kept
    elif where == "args list":
        assert by_lines == []       # a test env beyond the environments: every line skipped
    else:
        assert part is None and by_lines, where
    if part is not None:
        _same_parts([part], file_parts(by_lines))
    if where in ("args", "hparams"):
        for args, hparams in ((by_lines[0]["args"], by_lines[0]["hparams"]),
                              (part.args, part.hparams)):
            value = args["seed"] if where == "args" else hparams["big"]
            assert abs(value) == int(digits) and type(value) is int


@pytest.mark.parametrize("depth", [40, 300, 2000])
def test_deeply_nested_hparams_decline_a_file_to_the_line_reader(depth):
    """Nesting beyond the schema's 32 levels (or orjson's 1024) is the line reader's to
    skip, line by line, whatever the whole-file reader's orjson does with it."""
    data = _files()[0].read_bytes()
    nested = "[" * depth + "]" * depth
    changed = data.replace(b'"hparams": {', f'"hparams": {{"deep": {nested}, '.encode())
    assert changed != data
    assert whole_file_part(changed, TABLE_FIELDS) is None
    assert parse_whole_file(changed, TABLE_FIELDS) is None
    notes = []
    records, skipped = parse_run_lines("f", changed.splitlines(keepends=True), notes)
    assert records == [] and skipped == len(data.splitlines()) and "nested" in notes[0]


@pytest.mark.parametrize("where", ['"hparams": {', '"args": {'])
@pytest.mark.parametrize("depth", [30, 31])
def test_nesting_at_the_schemas_limit_reads_as_line_by_line(depth, where):
    """A record nests one level deeper than its args or hparams: 30 levels in a list in
    them (32 in all) fit the schema, 31 do not, whichever reader reads them."""
    data = _files()[0].read_bytes()
    nested = "[" * depth + "]" * depth
    changed = data.replace(where.encode(), f'{where}"deep": {nested}, '.encode())
    assert changed != data
    by_lines = _by_lines(changed, TABLE_FIELDS)
    assert (by_lines != []) == (depth == 30)
    part = whole_file_part(changed, TABLE_FIELDS)
    assert (part is not None) == (depth == 30)
    if part is not None:
        _same_parts([part], file_parts(by_lines))


def test_the_orjson_version_reads_as_numbers():
    from domainbed.results.lines import _version
    assert _version("3.10.0") == (3, 10) > _version("3.9.15") == (3, 9)
    assert _version("") == (0,) and _version("dev") == (0,)


def test_a_file_with_a_line_over_the_cap_is_left_to_the_line_reader(monkeypatch):
    """The line reader skips a line longer than MAX_LINE_BYTES: a file holding one (so
    at least as long) is not read at once."""
    from domainbed.results import lines
    data = _files()[0].read_bytes()
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", min(map(len, data.splitlines())) - 1)
    capped = [line if len(line) <= lines.MAX_LINE_BYTES else None
              for line in data.splitlines(keepends=True)]
    records, skipped = parse_run_lines("f", capped, [], TABLE_FIELDS)
    assert records == [] and skipped == len(capped)
    assert whole_file_part(data, TABLE_FIELDS) is None
    assert parse_whole_file(data, TABLE_FIELDS) is None


def test_a_later_args_key_spelled_with_an_escape_is_read_as_json_reads_it():
    """A line that starts with the previous line's args bytes but holds a later key
    decoding to "args" has that key's args (json keeps the last), not the shared ones."""
    data = _variants(_files()[0].read_bytes())["escaped later args"]
    expected = [json.loads(line) for line in data.splitlines()]
    assert [e["args"]["trial_seed"] for e in expected][:3] == [0, 99, 0]
    assert [r["args"] for r in _by_lines(data)] == [e["args"] for e in expected]
    whole = parse_whole_file(data, TABLE_FIELDS)
    assert whole is None or [r["args"] for r in whole] == [e["args"] for e in expected]


def test_a_negative_step_on_a_later_line_is_skipped_even_where_step_is_not_kept():
    data = _files()[0].read_bytes().replace(b'"step": 300', b'"step": -300', 1)
    fields = ("args", "hparams", "epoch")
    by_lines = _by_lines(data, fields)
    assert len(by_lines) == len(data.splitlines()) - 1          # the line reader skips it
    part = whole_file_part(data, fields)
    assert part is None or len(part.values) == len(by_lines)

