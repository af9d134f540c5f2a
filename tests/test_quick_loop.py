"""The quick loop's exclusion list (tests/quick_loop.py) names only tests that exist, so a
renamed test cannot silently come back into (or leave) the quick loop unnoticed."""
import ast
from pathlib import Path

from tests.quick_loop import TESTS, WHOLE_FILES

REPO = Path(__file__).resolve().parents[1]


def _test_functions(path):
    tree = ast.parse((REPO / path).read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


def test_every_excluded_file_and_test_exists():
    missing = [f for f in WHOLE_FILES if not (REPO / f).is_file()]
    for entry in TESTS:
        path, name = entry.split("::")
        if not (REPO / path).is_file() or name.split("[")[0] not in _test_functions(path):
            missing.append(entry)
    assert missing == []


def test_the_exclusions_are_marked_slow(pytestconfig):
    """Collection marks them: `-m slow` collects an exclusion, so `-m "not slow"` leaves
    it out (one collection: a pytest start costs seconds)."""
    import subprocess
    import sys
    entry = sorted(TESTS)[0]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p",
                          "no:cacheprovider", "-m", "slow", entry],
                         capture_output=True, text=True, cwd=REPO).stdout
    assert entry.split("[")[0] in out and "1 test" in out
