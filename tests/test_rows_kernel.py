"""The compiled reader of results files (domainbed.results.rows_kernel) reads what the
Python whole-file reader reads, or declines the file to it: on DomainBed's test sweep, on
the variants of tests/test_record_lines.py, on numbers of every form JSON allows, and on
thousands of random edits; without a compiler the Python reader reads every file."""
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest

from domainbed.results import lines, rows_kernel
from domainbed.results.records import TABLE_FIELDS
from tests.requirements import need_records_kernel
from tests.test_record_lines import _by_lines, _files, _same_parts, _variants


@pytest.fixture
def kernel():
    return need_records_kernel()


def _python_reader(data, fields, monkeypatch):
    """`_shared_file(data, fields)` read by the Python reader alone."""
    monkeypatch.setattr(rows_kernel, "load", lambda: None)
    try:
        return lines._shared_file(data, fields)
    finally:
        monkeypatch.undo()


def _same_answer(data, fields, monkeypatch):
    """The kernel-backed and the Python reader give the same answer; that answer."""
    fast = lines._shared_file(data, fields)
    slow = _python_reader(data, fields, monkeypatch)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert fast[1:] == slow[1:]
        _same_parts([fast[0]], [slow[0]])
        assert fast[0].values.tobytes() == slow[0].values.tobytes()   # (-0.0, NaN bits)
    return fast


def _kernel_rows(kernel, data):
    head, _, _, hparams_text, _ = lines._first_line_objects(data)
    return rows_kernel.read_rows(kernel, data, len(head), hparams_text)


@pytest.mark.parametrize("fields", [None, TABLE_FIELDS])
def test_every_file_of_domainbeds_sweep_is_read_by_the_kernel_as_by_python(
        kernel, fields, monkeypatch):
    for path in _files():
        data = path.read_bytes()
        assert _kernel_rows(kernel, data) is not None, path   # not declined: read in C
        assert _same_answer(data, fields, monkeypatch) is not None, path


@pytest.mark.parametrize("name", list(_variants(_files()[0].read_bytes())))
def test_a_variant_is_read_as_python_reads_it(kernel, name, monkeypatch):
    data = _variants(_files()[0].read_bytes())[name]
    for fields in (None, TABLE_FIELDS):
        _same_answer(data, fields, monkeypatch)


NUMBERS = {   # token -> whether the kernel reads it (else it declines the file)
    "0": True, "-0": True, "7": True, "-12": True, "9007199254740991": True,
    "9007199254740992": False, "1234567890123456": True, "12345678901234567": False,
    "0.0": True, "-0.0": True,
    "0.47048638193502795": True, "0.6571075604516846": True, "1e-05": True,
    "2.7028930742148706e-05": True, "1E+2": True, "1e2": True, "-3.5e-7": True,
    "100000000000000000000000e-10": True, "0.30000000000000004": True,
    "1.7976931348623157e308": False, "9007199254740993.0": False, "1e22": False,
    "123456.789e-3": True, "0.000000000000000000000000001": True, "5e-324": False,
    "1e-400": False, "4.9406564584124654e-324": False, "0.1e1": True,
    "0." + "1" * 70: False, "1.00000000000000000000001": True,
}
NOT_NUMBERS = ["01", "1.", ".5", "+1", "1e", "1e+", "-", "--1", "0x10", "NaN", "Infinity",
               "1.5.2", "1e5e5", '"1"', "true", "null", "1 ", " 1"]


def _with_value(data, token):
    """`data` with a key "env0_x_acc" before "step" on every line, holding `token`."""
    return data.replace(b'"step": ', b'"env0_x_acc": ' + token.encode() + b', "step": ')


@pytest.mark.parametrize("token", list(NUMBERS))
def test_numbers_of_every_form_read_exactly_as_json_reads_them(kernel, token, monkeypatch):
    data = _with_value(_files()[0].read_bytes(), token)
    found = _kernel_rows(kernel, data)
    assert (found is not None) == NUMBERS[token], token
    if found is not None:
        layout, numbers = found
        column = layout.keys.index("env0_x_acc")
        value = json.loads(token)
        assert layout.kinds[column] is type(value)
        assert {np.float64(value).tobytes()} == {v.tobytes() for v in numbers[:, column]}
    answer = _same_answer(data, None, monkeypatch)
    assert (answer is not None) == (abs(json.loads(token)) < 2 ** 53)


@pytest.mark.parametrize("token", NOT_NUMBERS)
def test_what_is_not_a_json_number_is_declined(kernel, token, monkeypatch):
    data = _with_value(_files()[0].read_bytes(), token)
    assert _kernel_rows(kernel, data) is None
    _same_answer(data, None, monkeypatch)


@pytest.mark.parametrize("edit", [
    lambda d: d.replace(b'"step": ', b'"step":  ', 1),            # other whitespace
    lambda d: d.replace(b'"loss": ', b'"lo\\u0073s": ', 1),        # an escape in a key
    lambda d: d.replace(b'"loss": ', '"löss": '.encode(), 1),     # a non-ASCII key
    lambda d: d.replace(b'"loss": ', b'"step": ', 1),             # a repeated key
    lambda d: d.replace(b'"step": ', b'"args": 1, "step": ', 1),  # a later args
    lambda d: d.replace(b'"step": 0', b'"step": -1', 1),          # a step below 0
    lambda d: d.replace(b"}\n", b"} \n", 1),                      # a space after the object
    lambda d: d + b"\n",                                          # a blank last line
    lambda d: d.replace(b'"step": ', b"".join(                    # more keys than it holds
        b'"m%d": 1, ' % i for i in range(rows_kernel.MAX_KEYS)) + b'"step": '),
])
def test_anything_outside_the_usual_shape_is_declined_to_python(kernel, edit, monkeypatch):
    data = edit(_files()[0].read_bytes())
    assert data != _files()[0].read_bytes()
    assert _kernel_rows(kernel, data) is None
    _same_answer(data, None, monkeypatch)


def test_random_edits_read_as_python_reads_them(kernel, monkeypatch):
    """Thousands of files, each with a few bytes changed, inserted or removed where the
    kernel reads (after args): the same answer from both readers every time."""
    alphabet = b'0123456789-+.eE" ,:}{\n\\a\x00\xc3'
    rng = random.Random(0)
    originals = [path.read_bytes() for path in _files()[:4]]
    accepted = 0
    for _ in range(3000):
        data = bytearray(rng.choice(originals))
        first_end = data.index(b"\n")
        cut = data.index(b'}, "env0_in_acc"') + 3
        for _ in range(rng.randint(1, 3)):
            line_start = rng.choice([0, first_end + 1])
            at = rng.randrange(line_start + cut, len(data))
            kind = rng.randrange(3)
            if kind == 0:
                data[at] = rng.choice(alphabet)
            elif kind == 1:
                data.insert(at, rng.choice(alphabet))
            else:
                del data[at]
        accepted += _same_answer(bytes(data), TABLE_FIELDS, monkeypatch) is not None
    assert 100 < accepted < 3000    # (edits a reader accepts, such as another digit)


@pytest.mark.parametrize("why", ["asked for", "not built"])
def test_without_the_kernel_the_python_reader_reads_every_file(why, monkeypatch):
    """DOMAINBED_RECORDS_KERNEL=python, or no kernel built (no compiler, a failed build:
    oodutils.c_kernel.build, tested with the probe kernel): the Python reader reads."""
    if why == "asked for":
        monkeypatch.setenv("DOMAINBED_RECORDS_KERNEL", "python")
    else:
        monkeypatch.setattr(rows_kernel.c_kernel, "build", lambda *args: None)
    data = _files()[0].read_bytes()
    rows_kernel.load.cache_clear()
    try:
        assert rows_kernel.load() is None
        part = lines.whole_file_part(data, TABLE_FIELDS)
        assert part is not None and len(part.values) == len(_by_lines(data))
    finally:
        rows_kernel.load.cache_clear()


def _random_tokens(rng, count):
    """Float literals as writers print them (shortest repr, 17 digits, other exponents)
    and as people write them (long fractions, exponents of every size)."""
    tokens = []
    for _ in range(count):
        kind = rng.randrange(5)
        if kind == 0:
            tokens.append(repr(rng.random()))
        elif kind == 1:
            tokens.append(f"{rng.random():.17g}")
        elif kind == 2:
            tokens.append(repr(rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-30, 8)))
        elif kind == 3:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 21)))
            tokens.append(f"{rng.choice(['', '-'])}0.{digits}e{rng.randint(-25, 14)}")
        else:
            whole = str(rng.randint(1, 10 ** rng.randint(1, 15)))
            tokens.append(f"{whole}.{rng.randint(0, 10 ** 6)}")
    return tokens


def test_random_floats_read_to_the_same_bits_as_pythons_float(kernel):
    """50,000 float literals in files of 400 keys a line: every value the kernel reads is
    float(token), bit for bit (its integer rounding of long significands included)."""
    rng = random.Random(1)
    head = b'{"args": {"algorithm": "ERM", "dataset": "D", "test_envs": [0]}, '
    read = 0
    for _ in range(125):
        tokens = _random_tokens(rng, 400)
        keys = [f"env0_m{i}_acc" for i in range(len(tokens))]
        pairs = ", ".join(f'"{k}": {t}' for k, t in zip(keys, tokens))
        line = head + f'{pairs}, "hparams": {{"lr": 0.1}}, "step": 0}}'.encode()
        found = rows_kernel.read_rows(kernel, line, len(head), b'{"lr": 0.1}')
        if found is None:
            # declined: a value beyond 2^53, or beyond the kernel (underflow, 64+ bytes)
            assert any(abs(float(t)) >= 2 ** 53 or 0 < abs(float(t)) < 1e-300 or
                       len(t) > 63 for t in tokens)
            continue
        read += 1
        numbers = found[1][0]
        expected = np.array([float(t) for t in tokens])
        assert numbers[:len(tokens)].tobytes() == expected.tobytes()
    assert read > 100


def test_an_unwritable_cache_builds_the_kernel_in_a_temporary_folder(tmp_path, monkeypatch,
                                                                     capsys):
    """A cache that cannot be made (a read-only home) is no warning: the kernel is built
    in a private temporary folder and reads as the cached one does."""
    need_records_kernel()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    rows_kernel.load.cache_clear()
    try:
        temporary = tmp_path / "tmp"
        temporary.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(temporary))
        built = []
        compile_source = rows_kernel.c_kernel.compile_source
        monkeypatch.setattr(rows_kernel.c_kernel, "compile_source",
                            lambda *args: built.append(compile_source(*args)) or built[-1])
        read = rows_kernel.load()
        assert read is not None and "warning" not in capsys.readouterr().err
        assert Path(built[0]).parent.parent == temporary
        assert list(temporary.iterdir()) == []    # (its folder removed once it is loaded)
        data = _files()[0].read_bytes()
        assert _kernel_rows(read, data) is not None
    finally:
        rows_kernel.load.cache_clear()
