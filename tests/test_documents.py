"""The project's reference documents keep their form: docs/CONTRACTS.md stays a short
reference whose modules exist, CHANGELOG.md follows Keep a Changelog with a section for the
package's version, CONTRIBUTING.md carries no results log."""
import ast
import io
import json
import re
import tokenize

import domainbed
from tests.test_readme import REPO

PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
CONTRACTS = REPO / "docs" / "CONTRACTS.md"
CHANGELOG = REPO / "CHANGELOG.md"
# dotted names in the contracts that are not modules: entry-point groups and MLflow tags
NOT_MODULES = {"domainbed.trackers", "domainbed.identity", "domainbed.run_dir"}


def test_contracts_is_a_short_reference():
    lines = CONTRACTS.read_text().splitlines()
    assert len(lines) <= 400, f"docs/CONTRACTS.md has {len(lines)} lines (at most 400)"
    assert sum(line.startswith("|") for line in lines) > len(lines) / 2, "mostly tables"


def test_contracts_names_only_modules_that_exist():
    """Every `package.module` the contracts name is a module or package of the repository,
    so a module that moves takes its line here with it."""
    named = set(re.findall(r"`(?:python -m )?((?:%s)\.\w+)" % "|".join(PACKAGES),
                           CONTRACTS.read_text()))
    missing = []
    for name in sorted(named - NOT_MODULES):
        path = REPO.joinpath(*name.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
                or _attribute_of_package(name)):
            missing.append(name)
    assert not missing, f"docs/CONTRACTS.md names modules that do not exist: {missing}"


def _attribute_of_package(name):
    """`domainbed.RunConfig`, `domainbed.train`: a name the package's __init__ defines."""
    package, attribute = name.split(".")
    init = (REPO / package / "__init__.py").read_text()
    return re.search(r"\b%s\b" % re.escape(attribute), init) is not None


def test_changelog_keeps_a_changelog_with_this_version():
    text = CHANGELOG.read_text()
    lines = text.splitlines()
    assert lines[0] == "# Changelog"
    assert "https://keepachangelog.com/en/1.1.0/" in text
    assert "https://semver.org/spec/v2.0.0.html" in text
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert releases[0] == ("Unreleased", ""), "the first section is [Unreleased]"
    versions = [version for version, _ in releases[1:]]
    assert domainbed.__version__ in versions, f"no section for {domainbed.__version__}"
    assert all(date for _, date in releases[1:]), "every release is dated YYYY-MM-DD"
    allowed = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    kinds = re.findall(r"^### (.+)$", text, re.M)
    assert kinds and set(kinds) <= allowed, f"change kinds outside {sorted(allowed)}"
    headings = [line for line in lines if line.startswith("#")]
    assert all(re.match(r"^(# Changelog|## \[[^\]]+\].*|### \w+)$", h) for h in headings)
    for version, _ in releases:   # each section heading is a link to its tag or comparison
        assert re.search(r"^\[%s\]: \S+$" % re.escape(version), text, re.M), version


def test_contributing_keeps_no_results_log():
    text = (REPO / "CONTRIBUTING.md").read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in CHANGELOG.md"
    assert "Last result" not in text


# a lab notebook's marks: "measured 824 s", "227 -> 355 MB/s", "0.28 -> 0.06 s", a date
NOTEBOOK = re.compile(r"\bmeasured\b[^.\n]*\d|\d ?(s|ms|MB|GB|MB/s)? ?-> ?\d"
                      r"|\b\d+(\.\d+)? ?(s|ms) (vs|against) \d|\b20\d\d-\d\d-\d\d\b")


def comments_and_docstrings(path):
    """(line, text) of every comment and docstring line of a module."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                for offset, line in enumerate(doc.splitlines()):
                    yield node.body[0].lineno + offset, line


def test_comments_and_docstrings_keep_no_figures_or_history():
    """Figures belong in docs/benchmarks and commit messages, not in the code."""
    found = [f"{path.relative_to(REPO)}:{line}: {text.strip()}"
             for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             for line, text in comments_and_docstrings(path) if NOTEBOOK.search(text)]
    assert found == []


def test_every_benchmark_record_gives_a_short_row():
    """docs/benchmarks.md: one short row per figure (what, result, peer, command); the
    numbers, method, machine and date stay in the figure's JSON record."""
    limits = {"what": 80, "headline": 60, "peer": 60}
    records = sorted((REPO / "docs" / "benchmarks").glob("*.json"))
    assert records
    for path in records:
        entry = json.loads(path.read_text())
        for field in ("command", "result", "machine", "date"):
            assert entry.get(field), f"{path.name}: no {field}"
        for field, limit in limits.items():
            assert 0 < len(entry[field]) <= limit, f"{path.name}: {field} {entry[field]!r}"
