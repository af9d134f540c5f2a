"""The other CLIs: every bad input is one `error:` line, exit 2, nothing written
(ood_bench quantify/summarize, spawrious info.json, prediction files, oodselect)."""
import json
import math
import os

import numpy as np
import pytest

from oodutils.errors import UserError, run_cli


def cli_error(main, argv, capsys):
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def _valid_features(path):
    rng = np.random.RandomState(0)
    np.savez(path, z_p=rng.randn(40, 2), y_p=rng.randint(0, 2, 40), z_q=rng.randn(40, 2),
             y_q=rng.randint(0, 2, 40))


@pytest.mark.parametrize("content", ["garbage", "truncated", "empty", "shapes"])
def test_quantify_on_unreadable_features(tmp_path, capsys, content):
    from ood_bench import quantify
    path = tmp_path / "f.npz"
    _valid_features(path)
    data = path.read_bytes()
    if content == "garbage":
        path.write_bytes(b"PK\x03\x04" + os.urandom(200))
    elif content == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif content == "empty":
        path.write_bytes(b"")
    else:
        np.savez(path, z_p=np.zeros((5, 2)), y_p=np.zeros(4), z_q=np.zeros((5, 2)),
                 y_q=np.zeros(5))
    out = tmp_path / "r.json"
    err = cli_error(quantify.main, ["--features", str(path), "--out", str(out)], capsys)
    assert str(path) in err and not out.exists()


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ('{"diversity": "high", "correlation": 0.1}', "diversity must be a number"),
    (None, "cannot read result file"),
])
def test_summarize_on_bad_results(tmp_path, capsys, content, message):
    from ood_bench.cli import main
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "summary.json"
    err = cli_error(main, ["summarize", "--results", str(path), "--out", str(out)], capsys)
    assert message in err and not out.exists()


def test_out_under_a_file_fails_before_work(tmp_path, capsys):
    from ood_bench.cli import main
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    result = tmp_path / "result.json"
    result.write_text('{"diversity": 0.1, "correlation": 0.2}')
    err = cli_error(main, ["summarize", "--results", str(result), "--out",
                           str(blocker / "summary.json")], capsys)
    assert "which is a file" in err and blocker.read_text() == "x"


@pytest.mark.parametrize("info, message", [
    ({"per_cell": "ten"}, "has per_cell 'ten'"),
    ({"per_cell": 2.5}, "has per_cell 2.5"),
    ({"seed": 1}, "has no per_cell"),
    ([{"per_cell": 4}], "must hold a JSON object, got list"),
])
def test_spawrious_info_json(tmp_path, info, message):
    from spawrious.layout import INFO_FILE, read_info
    (tmp_path / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        read_info(str(tmp_path))


def test_prediction_arrays_of_different_lengths(tmp_path):
    from domainbed.predictions import prediction_matrix
    run = tmp_path / "run"
    (run / "predictions").mkdir(parents=True)
    n = 6
    np.savez(run / "predictions" / "step_0000000.npz", id=np.arange(n),
             env=np.zeros(n, np.int16), split=np.zeros(n, np.int8), label=np.zeros(n),
             pred=np.zeros(n), correct=np.ones(n - 2, np.uint8), group=-np.ones(n))
    with pytest.raises(UserError, match="arrays differ in length"):
        prediction_matrix([{"run_dir": str(run), "step": 0}], env=0)


def test_constant_accuracy_correlation_is_undefined_with_a_note():
    from analysis import oodselect as core
    from analysis.oodselect.protocol import _row
    A = np.zeros((12, 4), np.uint8)      # every model misses every example
    A[:, 3] = np.arange(12) % 2
    y = np.linspace(0.5, 0.9, 12)
    assert math.isnan(core.subset_correlation(A, y, [0, 1]))
    assert math.isnan(core.subset_correlation(A, y, [0, 1], method="spearman"))
    assert not math.isnan(core.subset_correlation(A, y, [3]))
    parts = (np.arange(0, 6), np.arange(6, 9), np.arange(9, 12))
    row = _row("hard", 2, A, y, parts, [0, 1])
    assert math.isnan(row["r_test"]) and "undefined" in row["note"]


@pytest.mark.parametrize("extra, message", [
    (("--steps", "0"), "--steps must be at least 1"),
    (("--lr", "nan"), "--lr must be a finite number"),
    (("--lr", "inf"), "--lr must be a finite number"),
    (("--fractions", "0.5", "0.2", "0.2"), "--fractions must be three numbers >= 0 summing"),
    (("--fractions", "1.2", "-0.1", "-0.1"), "--fractions must be three numbers >= 0"),
])
def test_oodselect_bad_numbers(tmp_path, capsys, extra, message):
    from analysis.oodselect.cli import main
    out = tmp_path / "out"
    err = cli_error(main, ["--matrix", str(tmp_path / "m.npz"), "--out", str(out), *extra],
                    capsys)
    assert message in err and not out.exists()


def test_oodselect_out_is_a_file_and_duplicate_ids(tmp_path, capsys):
    from analysis.oodselect.cli import main
    from analysis.oodselect.data import from_arrays
    out = tmp_path / "out"
    out.write_text("mine")
    err = cli_error(main, ["--matrix", str(tmp_path / "m.npz"), "--out", str(out)], capsys)
    assert "is a file, not a directory" in err and out.read_text() == "mine"
    rng = np.random.RandomState(0)
    with pytest.raises(UserError, match="id 3 appears more than once"):
        from_arrays(rng.randint(0, 2, (6, 4)), np.linspace(.5, .9, 6),
                    example_id=[1, 3, 3, 4])
    matrix = tmp_path / "m.npz"
    np.savez(matrix, A=rng.randint(0, 2, (6, 4)), y=np.linspace(.5, .9, 6),
             example_id=np.array([1, 3, 3, 4]))
    err = cli_error(main, ["--matrix", str(matrix), "--out", str(tmp_path / "o2")], capsys)
    assert "appears more than once" in err and not (tmp_path / "o2").exists()
