"""analysis/ is one subpackage per analysis (issue 41, item 2): each names its Python API in
`__all__` and loads it on first use, so that importing the package (as its command does
before parsing) costs no heavy library; each has its command in `cli.py` and answers
`python -m analysis.<name>`; imports inside functions stay few (item 5)."""
import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aotl", "oodselect", "validity", "labelfree", "card")
HEAVY = ("torch", "pandas", "scipy", "matplotlib", "polars")


def _submodules(package):
    return {m.name for m in pkgutil.iter_modules([str(ROOT / "analysis" / package)])}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves_and_no_name_hides_a_module(package):
    module = importlib.import_module(f"analysis.{package}")
    assert module.__all__, package
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    # an exported name equal to a submodule's would shadow it in `from package import x`
    assert not set(module.__all__) & _submodules(package)
    assert {"cli", "__main__"} <= _submodules(package)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_the_api_keeps_its_names():
    from analysis import aotl, card, labelfree, oodselect, validity
    from analysis.aotl import tables
    from analysis.card import build
    from analysis.labelfree import estimators
    from analysis.oodselect import selector
    from analysis.validity import stats
    assert aotl.per_ood_table is tables.per_ood_table
    assert aotl.effective_robustness_table is tables.effective_robustness_table
    assert oodselect.OODSelect is selector.OODSelect
    assert validity.bayes_factor_k is stats.bayes_factor_k
    assert labelfree.estimate is estimators.estimate
    assert card.build_card is build.build_card


PROBE = """
import json, sys
import analysis.{package}, analysis.{package}.cli
print(json.dumps([m for m in {heavy!r} if m in sys.modules]))
"""


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_and_its_command_loads_nothing_heavy(package):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(package=package, heavy=HEAVY)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_python_m_runs_the_command(package):
    proc = subprocess.run([sys.executable, "-m", f"analysis.{package}", "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), proc.stderr


def function_level_imports(root):
    """(path, line) of every import statement inside a function body under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        inside = {node for function in ast.walk(tree)
                  if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(function)
                  if isinstance(node, (ast.Import, ast.ImportFrom))}
        found += sorted((path.relative_to(root).as_posix(), node.lineno) for node in inside)
    return found


def test_the_counter_counts_nested_imports(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    import json\n\n"
                                   "    def g():\n        from sys import argv\n")
    assert [line for _, line in function_level_imports(tmp_path)] == [4, 7]


def test_analysis_keeps_its_function_level_import_budget():
    """At most 12: the packages' lazy exports and the card command's page writers."""
    found = function_level_imports(ROOT / "analysis")
    assert len(found) <= 12, found
