"""The polars records reader (domainbed.results.reader) and its cache
(domainbed.results.cache): the fast reader gives exactly what json gives line by line,
hands every file it cannot read exactly to the line reader, and the cache never changes a
number."""
import json
import math
import os
import random
import shutil

import pytest

from domainbed.results import cache as cache_module
from domainbed.results import reader
from domainbed.results.records import TABLE_FIELDS, load_records
from domainbed.results.report import build_report
from domainbed.results.tables import render
from tests.builders import record as make_record
from tests.builders import record_line, run_args, write_run
from tests.requirements import data_dir

SWEEP = data_dir("domainbed_test_sweep") / "test_sweep_data"
NO_CACHE = shutil.ignore_patterns(cache_module.CACHE_FILE)


def record(step=0, envs=3, test_envs=(0,), extra="", dataset="Toy", acc=None, **args):
    """One DomainBed-style line (sorted keys, args first)."""
    values = [acc if acc is not None else 0.1 * (i + 1) + step / 1000 for i in range(envs)]
    line = make_record(step, run_args(dataset, test_envs=test_envs, **args), {"lr": 1e-4},
                       {i: (v, v) for i, v in enumerate(values)}, epoch=step / 10)
    text = record_line(line, sort_keys=True).rstrip("\n")
    return text[:-1] + extra + "}" if extra else text


def by_lines(top):
    """What json reads line by line: TABLE_FIELDS kept, null values left out (as the
    frame's record dicts leave them out)."""
    records = load_records(top, fields=None, quiet=True).records
    kept = []
    for r in records:
        r = {k: v for k, v in r.items() if (k in TABLE_FIELDS or k.startswith("env") or
                                            k == "run_dir") and v is not None}
        kept.append(r)
    return kept


def fast_reads(monkeypatch):
    """A list that collects the run_dir of each file the line reader parses."""
    seen = []
    parse_lines = reader.parse_lines

    def spy(path, *args):
        seen.append(os.path.dirname(path))
        return parse_lines(path, *args)
    monkeypatch.setattr(reader, "parse_lines", spy)
    return seen


def same_values(a, b):
    """Record lists equal, NaN equal to NaN."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            u, v = x[key], y[key]
            if isinstance(u, float) and math.isnan(u):
                assert isinstance(v, float) and math.isnan(v), key
            else:
                assert u == v and type(u) is type(v) or \
                    (isinstance(u, (int, float)) and float(u) == float(v)), (key, u, v)


def test_fast_reader_reads_the_test_sweep_and_equals_the_line_reader(tmp_path, monkeypatch):
    shutil.copytree(SWEEP, tmp_path / "s", ignore=NO_CACHE)
    lined = fast_reads(monkeypatch)
    fast = load_records(tmp_path / "s", fields=TABLE_FIELDS, use_cache=False).records
    assert lined == []          # every DomainBed file read by polars
    same_values(fast, by_lines(tmp_path / "s"))


ODD_LINES = {
    "nan": record(extra=', "env0_in_acc": NaN'),
    "duplicate key": record(extra=', "env1_out_acc": 0.99'),
    "null value": record(extra=', "env5_in_acc": null'),
    "float step": record().replace('"step": 0', '"step": 1.0'),
    "int dataset": record().replace('"dataset": "Toy"', '"dataset": 7'),
    "string accuracy": record().replace('"env0_in_acc": 0.1', '"env0_in_acc": "0.1"'),
    "bool accuracy": record().replace('"env0_in_acc": 0.1', '"env0_in_acc": true'),
    "lone surrogate": record(dataset="T\\ud800y").replace("\\\\ud800", "\\ud800"),
    "escaped key": record().replace('"step"', '"st\\u0065p"'),
    "huge exponent": record(extra=', "env9_in_acc": 0.' + "0" * 2000 + '95e100000'),
    "long mantissa": record(extra=', "env9_in_acc": 0.1' + "0" * 40 + "1"),
    "big int": record(extra=', "env9_in_acc": 123456789012345678901234567890'),
    "deep": record(extra=', "x": ' + "[" * 40 + "]" * 40),
    "nested args key": record(extra=', "x": {"args": 1}'),
    "bom": "\ufeff" + record(),
    "blank line": "   ",
    "truncated": record()[:50],
    "not an object": "[1, 2]",
    "invalid utf-8": record().encode().replace(b"Toy", b"T\xffy"),
    "crlf": record() + "\r",
    "hparams twice": record(extra=', "hparams": {"lr": 1}'),
    "no hparams": record().replace('"hparams": {"lr": 0.0001}, ', ""),
    "list accuracy": record(extra=', "env7_in_acc": [1]'),
    "args twice": record(extra=', "args": ' + json.dumps(
        {"dataset": "Toy", "algorithm": "ERM", "test_envs": [0], "trial_seed": 7})),
    "other args": record(1, trial_seed=5),
    "other hparams": record().replace('"lr": 0.0001', '"lr": 0.5'),
    "hparams twice, a number": record(extra=', "hparams": 5'),
    "args twice, a number": record(extra=', "args": 5'),
    "args twice, a string": record(extra=', "args": "x"'),
    "args twice, spaced": record(extra=', "args" :5'),
    "infinity in args": record(x=float("inf")),
    "infinity in hparams": record().replace('"lr": 0.0001', '"lr": -Infinity'),
    "hparams twice, spaced": record(extra=', "hparams" : 5'),
    "hparams a string": record().replace('"hparams": {"lr": 0.0001}', '"hparams": "{}"'),
    "hparams nested before": record().replace('"epoch": ', '"b": {"hparams": {"lr": 5}}, '
                                                           '"epoch": '),
    "env string": record(extra=', "note": "env0_in_acc"'),
    "null step": record().replace('"step": 0', '"step": null'),
    "no newline between": record() + record(2),
    **{f"args {n} deep": record(x=json.loads("[" * n + "]" * n)) for n in (29, 30, 31, 40)},
    "int beyond a float": record(extra=', "env9_in_acc": 1' + "0" * 400),
    "step beyond 64 bits": record().replace('"step": 0', '"step": ' + "9" * 30),
    "trial seed beyond 64 bits": record(trial_seed=10 ** 30),
}


@pytest.mark.parametrize("case", sorted(ODD_LINES))
def test_an_odd_line_reads_as_json_reads_it(tmp_path, monkeypatch, case):
    """A file holding one odd line among good ones: the same records, notes and numbers
    as json line by line gives (the file goes to the line reader, or the fast reader
    reads it exactly); the good files of its batch stay with the fast reader."""
    top = tmp_path / "s"
    for i in range(12):
        write_run(top / f"a{i:02d}", [record(0, trial_seed=i), record(1, trial_seed=i)])
    write_run(top / "b", [record(0), ODD_LINES[case], record(2)])
    write_run(top / "c", [record(5, envs=4)])
    lined = fast_reads(monkeypatch)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False, quiet=True)
    assert set(lined) <= {str(top / "b")}
    monkeypatch.undo()
    slow = load_records(top, fields=None, quiet=True)
    same_values(fast.records, by_lines(top))
    assert fast.notes == slow.notes and fast.skipped_lines == slow.skipped_lines
    for r in fast.records:     # every string encodes: a surrogate was replaced
        json.dumps(r, ensure_ascii=False).encode("utf-8")


INJECTED_KEYS = ['"args"', '"hparams"', '"step"', '"epoch"', '"env0_in_acc"', '"env9_in_acc"',
                 '"env0_in_wga"', '"x"', '"env_names"', '"test_envs"', '"trial_seed"',
                 '"dataset"', '"envx_acc"']
INJECTED_VALUES = ["5", "-1", "1.5", '"x"', "null", "true", "{}", '{"lr": 1}', "[]", "[1]",
                   "1e400", "5e-06", '"env0_in_acc"', '"args"', "-0.0", "NaN", "-Infinity",
                   "9" * 25, '["a", "b"]', "[0, 1]"]


def _injected(rng, line):
    """`line` with one key (however spaced) and value put into the record, its args or
    its hparams, at the front or at the back."""
    pair = rng.choice(INJECTED_KEYS) + rng.choice([": ", ":", " : "]) + \
        rng.choice(INJECTED_VALUES)
    opening = rng.choice(["{", '"args": {', '"hparams": {'])
    at = line.index(opening) + len(opening)
    if rng.random() < 0.5:
        return line[:at] + pair + ", " + line[at:]
    end = len(line) - 1 if opening == "{" else line.index("}", at)
    return line[:end] + ", " + pair + line[end:]


@pytest.mark.parametrize("every_line", [False, True])
def test_injected_keys_read_as_json_reads_them(tmp_path, every_line):
    """200 runs, each with a key injected into its middle line (or into every line, so
    that the fast reader's first-line args and hparams hold it): both readers give the
    same records, and no value crashes either."""
    rng, top = random.Random(7), tmp_path / "s"
    for i in range(200):
        state = rng.getstate()
        lines = []
        for step in range(3):
            if every_line:
                rng.setstate(state)
            lines.append(_injected(rng, record(step)) if every_line or step == 1
                         else record(step))
        write_run(top / f"r{i:03d}", lines)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False, quiet=True).records
    numbers = [{k: v for k, v in r.items()    # (the frame keeps env keys holding numbers)
                if not k.startswith("env") or type(v) in (int, float)} for r in by_lines(top)]
    assert sum(r["run_dir"] != numbers[0]["run_dir"] for r in fast) > 200   # (most kept)
    same_values(fast, numbers)


def test_numbers_equal_json_loads(tmp_path):
    """Float literals of every shape (random doubles, short and long spellings, huge and
    tiny exponents) read as json.loads reads them, through either reader."""
    rng = random.Random(0)
    literals = ["0.95", "1e-320", "-0.0", "1E5", "5e-05", "0.1", "1e308", "2.5e-308",
                "0." + "0" * 100_000 + "95e1000000", "1" * 30, "9007199254740993"]
    for _ in range(300):
        x = rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)
        literals += [repr(x), f"{x:.25e}", f"{x:.3g}"]
    top = tmp_path / "s"
    lines = [record(i, extra=f', "env9_in_acc": {text}') for i, text in enumerate(literals)]
    write_run(top / "a", lines)
    got = [r["env9_in_acc"] for r in load_records(top, fields=TABLE_FIELDS,
                                                  use_cache=False).records]
    want = [float(json.loads(text)) for text in literals]
    assert got == want


def test_ordinary_exponents_stay_with_the_fast_reader(tmp_path, monkeypatch):
    """Exponents of up to 3 digits (what Python writes) are read by polars, as json."""
    top = tmp_path / "s"
    write_run(top / "a", [record(i, extra=f', "env9_in_acc": {x!r}, "loss": {x / 3!r}')
                   for i, x in enumerate([1.5e-05, 2e-300, 7.25e+100, 3e-07])])
    lined = fast_reads(monkeypatch)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False).records
    assert lined == []
    assert [r["env9_in_acc"] for r in fast] == [1.5e-05, 2e-300, 7.25e+100, 3e-07]


def test_a_digest_that_looks_like_an_exponent_stays_with_the_fast_reader(tmp_path,
                                                                        monkeypatch):
    """Only a number's exponent of 4 digits sends a file to json: a hex digest in a string
    (``...8ae52563...``) does not."""
    top = tmp_path / "s"
    write_run(top / "a", [record(i, output_dir="sweep/07ea18ae52563b2e1234") for i in range(3)])
    lined = fast_reads(monkeypatch)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False).records
    assert lined == []
    same_values(fast, by_lines(top))


@pytest.mark.parametrize("literal", ["1.5e-0005", "2E0300", "3e+1000"])
def test_an_exponent_of_four_digits_goes_line_by_line(tmp_path, monkeypatch, literal):
    """polars' number parser wraps long exponents: a file with one is read by json."""
    top = tmp_path / "s"
    write_run(top / "a", [record(0)])
    write_run(top / "b", [record(0), record(1, extra=f', "env9_in_acc": {literal}')])
    lined = fast_reads(monkeypatch)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False).records
    assert lined == [str(top / "b")]
    same_values(fast, by_lines(top))


def test_an_env_value_beyond_its_files_env_count_goes_line_by_line(tmp_path, monkeypatch):
    """A key another file's first line brings into the batch's schema (env3_...) in a
    file of 3 named environments: json's schema skips that line, and so does the read."""
    top = tmp_path / "s"
    names = ["A", "B", "C"]
    write_run(top / "a", [record(0, envs=4)])
    write_run(top / "b", [record(0, env_names=names),
                   record(1, env_names=names, extra=', "env3_in_acc": 0.5')])
    lined = fast_reads(monkeypatch)
    fast = load_records(top, fields=TABLE_FIELDS, use_cache=False, quiet=True)
    assert lined == [str(top / "b")]
    same_values(fast.records, by_lines(top))
    assert fast.skipped_lines == 1


def test_a_fifo_a_symlink_and_a_long_line_are_skipped_with_a_note(tmp_path, monkeypatch):
    top = tmp_path / "s"
    write_run(top / "a", [record(0)])
    os.mkfifo(write_run(top / "b", [record(0)]) / "fifo")
    os.remove(top / "b" / "results.jsonl")
    os.rename(top / "b" / "fifo", top / "b" / "results.jsonl")
    os.remove(write_run(top / "c", [record(0)]) / "results.jsonl")
    os.symlink(top / "a" / "results.jsonl", top / "c" / "results.jsonl")
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1000)
    write_run(top / "d", [record(0), record(1, extra=', "x": "' + "y" * 2000 + '"')])
    loaded = load_records(top, fields=TABLE_FIELDS, quiet=True)
    assert len(loaded) == 2 and loaded.skipped_runs == 2 and loaded.skipped_lines == 1
    assert any("line 2: longer than 1000 bytes" in n for n in loaded.notes)
    assert sum("unreadable" in n for n in loaded.notes) == 2


@pytest.mark.parametrize("spare", [-2, -1, 0, 1])
def test_a_line_at_the_length_cap_reads_as_the_line_reader_reads_it(tmp_path, monkeypatch,
                                                                     spare):
    """A line of exactly MAX_LINE_BYTES (its newline included, as the line reader counts),
    and one byte either side: both readers keep or skip the same lines."""
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1000)
    line = record(1, extra=', "x": "y"')
    line = line[:-2] + "y" * (1000 - len(line) - 1 + spare) + '"}'
    write_run(tmp_path / "s" / "a", [record(0), line])
    fast = load_records(tmp_path / "s", fields=TABLE_FIELDS, use_cache=False, quiet=True)
    slow = load_records(tmp_path / "s", fields=None, quiet=True)
    assert fast.notes == slow.notes and len(fast) == len(slow) == (2 if spare <= 0 else 1)


def report_text(top, **options):
    return render(build_report(load_records(top, fields=TABLE_FIELDS, quiet=True,
                                            **options)), "text")


def test_the_cache_serves_unchanged_files_and_reads_changed_ones(tmp_path, monkeypatch):
    top = tmp_path / "s"
    shutil.copytree(SWEEP, top, ignore=NO_CACHE)
    monkeypatch.setattr(cache_module, "SETTLE_NS", 0)
    want = report_text(top, use_cache=False)
    assert report_text(top) == want
    assert (top / cache_module.CACHE_FILE).is_file()
    reads = []
    read = reader.read_head_stat
    monkeypatch.setattr(reader, "read_head_stat", lambda p, n: reads.append(p) or read(p, n))
    assert report_text(top) == want and reads == []
    changed = sorted(top.glob("*/results.jsonl"))[3]
    lines = changed.read_text().splitlines()
    lines[-1] = lines[-1].replace('"env0_in_acc": ', '"env0_in_acc": 0.5, "x": ')
    changed.write_text("\n".join(lines) + "\n")
    got = report_text(top)
    assert reads == [str(changed)]
    assert got == report_text(top, use_cache=False)


def test_random_byte_flips_of_the_cache_never_change_a_number(tmp_path, monkeypatch, caplog):
    top = tmp_path / "s"
    shutil.copytree(SWEEP, top, ignore=NO_CACHE)
    monkeypatch.setattr(cache_module, "SETTLE_NS", 0)
    want = report_text(top, use_cache=False)
    report_text(top)
    good = (top / cache_module.CACHE_FILE).read_bytes()
    rng = random.Random(1)
    for _ in range(60):
        flipped = bytearray(good)
        for _ in range(rng.choice((1, 1, 4))):
            at = rng.randrange(len(flipped))
            flipped[at] ^= 1 << rng.randrange(8)
        (top / cache_module.CACHE_FILE).write_bytes(bytes(flipped))
        assert report_text(top) == want


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder", "foreign", "stale"])
def test_anything_else_in_the_caches_place_is_ignored_with_a_warning(tmp_path, monkeypatch,
                                                                     kind):
    top = tmp_path / "s"
    shutil.copytree(SWEEP, top, ignore=NO_CACHE)
    monkeypatch.setattr(cache_module, "SETTLE_NS", 0)
    want = report_text(top, use_cache=False)
    path = top / cache_module.CACHE_FILE
    if kind == "symlink":
        report_text(top)
        os.rename(path, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:   # another sweep's cache, with other numbers (the same paths, other files)
        other = tmp_path / "other"
        shutil.copytree(SWEEP, other, ignore=NO_CACHE)
        for f in other.glob("*/results.jsonl"):
            f.write_text(f.read_text().replace('"env0_in_acc": 0.', '"env0_in_acc": 0.0'))
        report_text(other)
        shutil.copy(other / cache_module.CACHE_FILE, path)
    loaded = load_records(top, fields=TABLE_FIELDS, quiet=True)
    assert render(build_report(loaded), "text") == want
    warned = [n for n in loaded.notes if "ignored the records cache" in n]
    assert len(warned) == (1 if kind in ("symlink", "fifo", "folder") else 0)


def test_a_checksummed_cache_with_other_numbers_is_refused(tmp_path, monkeypatch):
    """A cache whose values were changed and whose checksum was not: ignored."""
    import polars as pl
    top = tmp_path / "s"
    shutil.copytree(SWEEP, top, ignore=NO_CACHE)
    monkeypatch.setattr(cache_module, "SETTLE_NS", 0)
    want = report_text(top, use_cache=False)
    report_text(top)
    path = top / cache_module.CACHE_FILE
    meta = pl.read_parquet_metadata(path)
    table = pl.read_parquet(path).with_columns(env0_in_acc=pl.col("env0_in_acc") * 0.5)
    table.write_parquet(path, metadata={k: v for k, v in meta.items()
                                        if not k.startswith("ARROW")})
    loaded = load_records(top, fields=TABLE_FIELDS, quiet=True)
    assert render(build_report(loaded), "text") == want
    assert any("checksum" in n for n in loaded.notes)


def test_arithmetic_filter_and_the_note_on_tables_that_mix_them(tmp_path, capsys):
    """Records without args.arithmetic count as single; a table mixing arithmetics says
    so under it (and the leaderboard marks its cells); --arithmetic NAME keeps one."""
    from domainbed.leaderboard import model as lbmodel
    from domainbed.leaderboard import pages
    from domainbed.scripts import collect_results
    from oodutils.errors import UserError
    top = tmp_path / "s"
    write_run(top / "a", [record(0, hparams_seed=0), record(1, hparams_seed=0)])
    write_run(top / "b", [record(0, trial_seed=1, arithmetic="fused-batched")])
    collect_results.main(["--input_dir", str(top), "--no_save"])
    out = capsys.readouterr().out
    assert "mixes runs computed by different arithmetics (fused-batched, single)" in out
    collect_results.main(["--input_dir", str(top), "--no_save", "--arithmetic", "single"])
    only = capsys.readouterr().out
    assert "mixes" not in only and "Total records: 2" in only
    with pytest.raises(UserError, match="fused-exact.*found: fused-batched, single"):
        collect_results.main(["--input_dir", str(top), "--no_save", "--arithmetic",
                              "fused-exact"])
    model = lbmodel.build_model(load_records(top, fields=TABLE_FIELDS), {})
    table = model["sections"][0]["tables"][0]
    assert table["arithmetics"] == ["fused-batched", "single"]
    [dataset] = model["datasets"]
    page = pages.render_dataset(model, dataset)
    assert "computed by fused-batched, single; this table mixes runs" in page
