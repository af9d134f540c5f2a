"""Prompts, the six benchmark definitions, their scaling, the validator and the splits CLI."""
import csv
import io
import os
import subprocess
import sys

import pytest

from oodutils.errors import UnknownNameError, UserError
from spawrious import splits as sp
from spawrious.constants import (
    BREEDS,
    CLASS_LIST,
    FUR,
    LOCATIONS,
    NEGATIVE_PROMPT,
    POSES,
    TIMES_OF_DAY,
)
from spawrious.prompts import enumerate_prompts, format_prompt, sample_prompts
from spawrious.validate import validate_counts


def test_prompt_factors_and_template():
    assert BREEDS == ("bulldog", "dachshund", "labrador", "corgi")
    assert CLASS_LIST == ("bulldog", "corgi", "dachshund", "labrador")
    assert TIMES_OF_DAY.count("bright sunny day") == 2 and len(TIMES_OF_DAY) == 6
    assert FUR == ("black", "brown", "white", "") and POSES == ("sitting", "running", "")
    prompts = enumerate_prompts("corgi", "snow")
    assert len(prompts) == 72 == len({(p.fur, p.pose, p.tod_index) for p in prompts})
    text = format_prompt("corgi", "snow", "white", "running", "foggy day")
    assert text.startswith("(((one white welsh corgi dog running))) in a snowy landscape with a "
                           "cabin and a snowball in the background, foggy day. highly detailed")
    assert text.endswith("masterpiece, close up")
    assert "  " not in format_prompt("bulldog", "beach", "", "", "sunset")
    assert format_prompt("bulldog", "beach", "", "", "sunset").startswith(
        "(((one bulldog))) playing")
    assert NEGATIVE_PROMPT.startswith("human, blurry") and NEGATIVE_PROMPT.endswith("two, multiple")


def test_sampling_is_seeded_and_balanced():
    a = sample_prompts("labrador", "dirt", 144, seed=3)
    assert a == sample_prompts("labrador", "dirt", 144, seed=3)
    assert a != sample_prompts("labrador", "dirt", 144, seed=4)
    assert a != sample_prompts("labrador", "dirt", 144, seed=3, pool=1)
    assert len(set(a[:72])) == 72 and len(set(a[72:])) == 72     # each block covers all 72
    assert a[10:20] == sample_prompts("labrador", "dirt", 10, seed=3, start=10)
    with pytest.raises(UnknownNameError, match="valid breeds"):
        enumerate_prompts("poodle", "dirt")
    with pytest.raises(UnknownNameError, match="valid locations"):
        enumerate_prompts("corgi", "moon")


def test_canonical_counts_at_3168():
    split = sp.build_split("o2o_easy")
    c = split.counts()
    assert c[("SC_group_1", "bulldog", "desert")] == 3072
    assert c[("SC_group_1", "bulldog", "beach")] == 96
    assert c[("SC_group_2", "corgi", "snow")] == 2756
    assert c[("SC_group_2", "corgi", "beach")] == 412
    assert c[("Test", "labrador", "desert")] == 2 * 3168
    pools = {(s.env, s.pool) for s in split.selections}
    assert pools == {("SC_group_1", 0), ("SC_group_2", 1), ("Test", 0), ("Test", 1)}
    report, failures = validate_counts(split, c)
    assert not failures
    assert report["env_sizes"] == {"Test": 25344, "SC_group_1": 12672, "SC_group_2": 12672}
    m2m = sp.build_split("m2m_hard")
    assert {s.pool for s in m2m.selections} == {0}
    assert m2m.counts()[("SC_group_1", "bulldog", "dirt")] == 3168
    assert m2m.counts()[("Test", "bulldog", "snow")] == 3168


@pytest.mark.parametrize("n", [1, 7, 100, 333])
def test_counts_scale_like_the_authors_code(n):
    c = sp.build_split("o2o_medium", n).counts()
    assert c[("SC_group_1", "bulldog", "mountain")] == int(0.97 * n)
    assert c.get(("SC_group_1", "bulldog", "desert"), 0) == n - int(0.97 * n)
    assert c[("SC_group_2", "dachshund", "beach")] == int(0.87 * n)
    assert c.get(("SC_group_2", "dachshund", "desert"), 0) == n - int(0.87 * n)


@pytest.mark.parametrize("variant", sp.VARIANTS)
@pytest.mark.parametrize("bench", sp.BENCHMARKS)
def test_every_split_passes_validation(bench, variant):
    split = sp.build_split(bench, 50, variant)
    report, failures = validate_counts(split, split.counts())
    assert failures == []
    if split.kind == "o2o":
        assert report["eq1_pairs"]
    else:
        for values in report["eq2"].values():
            assert values["train"] == pytest.approx(1) and values["Test"] == pytest.approx(-1)


def test_authors_definitions_and_table2_mapping():
    assert sp.CANONICAL["o2o_easy"] == (("desert", "jungle", "dirt", "snow"),
                                        ("dirt", "snow", "desert", "jungle"), "beach")
    assert sp.CANONICAL["o2o_medium"][2] == "desert" and sp.CANONICAL["o2o_hard"][2] == "beach"
    norm = lambda t: {b: (e1, e2, frozenset(ts)) for b, (e1, e2, ts) in t.items()}  # noqa: E731
    code = {b: norm(sp.m2m_table_from_code(*sp.CANONICAL[b][:2]))
            for b in sp.BENCHMARKS if b[:3] == "m2m"}
    paper = {b: norm(t) for b, t in sp.PAPER_TABLE2_M2M.items()}
    assert paper["m2m_easy"] == code["m2m_hard"]
    assert paper["m2m_medium"] == code["m2m_easy"]
    paper_hard = paper["m2m_hard"]
    groups = lambda t: {frozenset((t[b][0], t[b][1])) for b in BREEDS}  # noqa: E731
    assert groups(paper_hard) == groups(code["m2m_medium"])
    assert paper_hard != code["m2m_medium"]
    for b in ("o2o_easy", "o2o_medium", "o2o_hard"):   # Table 2's O2O columns = the code's
        assert sp.build_split(b, 10, "paper_table2").counts() == sp.build_split(b, 10).counts()


def test_validator_catches_broken_splits():
    split = sp.build_split("o2o_easy", 100)
    counts = split.counts()
    broken = dict(counts)
    broken[("SC_group_1", "bulldog", "desert")] -= 5
    assert any("balanced" in f for f in validate_counts(split, broken)[1])
    swapped = {(e, b, "desert" if (e == "Test" and b == "bulldog") else loc): k
               for (e, b, loc), k in counts.items()}
    failures = validate_counts(split, swapped)[1]
    assert any("paired with" in f for f in failures)
    m2m = sp.build_split("m2m_easy", 10)
    mixed = dict(m2m.counts())
    mixed[("Test", "bulldog", "desert")] = mixed.pop(("Test", "bulldog", "dirt"))
    assert any("Eq. 2" in f or "overlap" in f for f in validate_counts(m2m, mixed)[1])


def test_unknown_names():
    with pytest.raises(UnknownNameError, match="o2o_easy"):
        sp.build_split("o2o_trivial")
    with pytest.raises(UnknownNameError, match="paper_table2"):
        sp.build_split("m2m_easy", variant="table3")
    with pytest.raises(UserError):
        sp.build_split("m2m_easy", 0)


def _fake_tree(root, n):
    for pool in (0, 1):
        for loc in LOCATIONS:
            for breed in BREEDS:
                d = os.path.join(root, "spawrious224", str(pool), loc, breed)
                os.makedirs(d)
                for i in range(n):
                    open(os.path.join(d, f"img_{i:03d}.png"), "wb").close()


def _run(*args):
    return subprocess.run([sys.executable, "-m", "spawrious.splits", *args],
                          capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_splits_cli_csv_summary(tmp_path):
    _fake_tree(tmp_path, 20)
    r = _run("--root", str(tmp_path), "--benchmark", "o2o_easy", "--per-cell", "20",
             "--summary", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(rows[0]) == ["env", "breed", "location", "count"]
    got = {(x["env"], x["breed"], x["location"]): int(x["count"]) for x in rows}
    assert got == sp.build_split("o2o_easy", 20).counts()
    assert got[("SC_group_1", "bulldog", "beach")] == 1 and got[("Test", "corgi", "jungle")] == 40
    r = _run("--root", str(tmp_path), "--benchmark", "m2m_hard", "--per-cell", "30")
    assert r.returncode == 2 and "error:" in r.stderr and "found 20" in r.stderr
    r = _run("--root", str(tmp_path), "--benchmark", "o2o_easy", "--per-cell", "20",
             "--summary", "files")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 1 + 8 * 20 + 2 * 4 * 20


def test_splits_cli_errors(tmp_path):
    r = _run("--root", str(tmp_path / "missing"), "--benchmark", "o2o_easy")
    assert r.returncode == 2 and "does not exist" in r.stderr and "spawrious.generate" in r.stderr
    r = _run("--benchmark", "o2o_nothing")
    assert r.returncode == 2 and "unknown benchmark" in r.stderr
    r = _run("--benchmark", "m2m_hard", "--variant", "paper_table2", "--validate")
    assert r.returncode == 0 and "Eq. 2" in r.stdout
