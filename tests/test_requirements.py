"""tests.requirements: a missing need skips locally with its reason and fails in CI."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import requirements

REPO = Path(__file__).resolve().parents[1]
SKIPPED, FAILED = pytest.skip.Exception, pytest.fail.Exception


@pytest.fixture
def local(monkeypatch):
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture
def ci(monkeypatch):
    monkeypatch.setenv("CI", "true")


@pytest.mark.parametrize("value, expected", [("true", True), ("1", True), ("yes", True),
                                             ("TRUE", True), ("false", False), ("0", False),
                                             ("", False), ("off", False)])
def test_ci_is_read_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("CI", value)
    assert requirements.in_ci() is expected


def test_present_data_is_returned(local, tmp_path):
    (tmp_path / "golden.json").write_text("{}")
    assert requirements.need_data(tmp_path / "golden.json") == tmp_path / "golden.json"
    assert requirements.need_data(str(tmp_path)) == tmp_path


def test_missing_data_skips_locally_with_where_it_looked(local, tmp_path):
    with pytest.raises(SKIPPED, match=r"DomainBed's test sweep not found at .*absent"):
        requirements.need_data(tmp_path / "absent", "DomainBed's test sweep")


def test_missing_data_fails_in_ci(ci, tmp_path):
    with pytest.raises(FAILED, match=r"not found at .*absent.*CI is set"):
        requirements.need_data(tmp_path / "absent")


def test_packages(local):
    assert requirements.need_package("json") is sys.modules["json"]
    with pytest.raises(SKIPPED, match=r"no_such_package_4711 is not importable.*test extra"):
        requirements.need_package("no_such_package_4711")


def test_missing_package_fails_in_ci(ci):
    with pytest.raises(FAILED, match="no_such_package_4711"):
        requirements.need_package("no_such_package_4711")


def test_missing_browser_names_what_is_missing(monkeypatch, local):
    monkeypatch.setattr(requirements, "need_package", lambda name: None)
    monkeypatch.setattr(requirements, "first_existing", lambda paths: None)
    with pytest.raises(SKIPPED, match="chromium and chromedriver not found"):
        requirements.need_browser()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(FAILED, match="chromium and chromedriver not found"):
        requirements.need_browser()


def test_shipped_reference_data_is_found(local):
    """The data the parity tests need ships in tests/data (no folder beside the clone)."""
    for name, inside in [("domainbed_golden", "golden_zoo.json"),
                         ("domainbed_golden", "golden.json"),
                         ("domainbed_test_sweep", "test_sweep_results.txt"),
                         ("domainbed_published", "results.tex"),
                         ("aotl_reference", "PACS/env0_out_acc.csv.gz")]:
        path = requirements.data_dir(name) / inside
        assert path.is_file() and REPO / "tests" / "data" in path.parents, path


def test_a_pytest_run_reports_the_skip_or_fails(tmp_path):
    """End to end: the same test file skips with its reason without CI and fails with CI."""
    test_file = tmp_path / "test_needs_data.py"
    test_file.write_text(textwrap.dedent(f"""
        from tests.requirements import need_data

        def test_needs():
            need_data({str(tmp_path / 'absent')!r}, "the reference sweep")
    """))
    runs = {}
    for ci_value in ("", "true"):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "CI": ci_value}
        runs[ci_value] = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
             "-p", "no:xdist", str(test_file)], capture_output=True, text=True, env=env,
            cwd=tmp_path, timeout=120)
    assert runs[""].returncode == 0, runs[""].stdout
    assert "SKIPPED" in runs[""].stdout and "the reference sweep not found" in runs[""].stdout
    assert runs["true"].returncode == 1, runs["true"].stdout
    assert "1 failed" in runs["true"].stdout and "CI is set" in runs["true"].stdout
