"""The tests use the packages' public names only: no test imports a private name of
domainbed, analysis, ood_bench, spawrious or oodutils, reads one as an attribute of their
modules or objects, or patches one (monkeypatch.setattr/delattr, a dotted target string).
A test pinned to an internal breaks when the internal is rewritten, though nothing a user
sees changed."""
import ast
from pathlib import Path

PACKAGES = {"domainbed", "analysis", "ood_bench", "spawrious", "oodutils"}
TESTS = Path(__file__).resolve().parent


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted_private(target):
    """A dotted path into one of the packages with a private part, e.g. "domainbed.x._y"."""
    parts = target.split(".")
    return parts[0] in PACKAGES and any(is_private(p) for p in parts[1:])


def package_names(tree):
    """Local names bound by imports from the packages (modules, classes, objects)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in PACKAGES:
            names.update(a.asname or a.name for a in node.names)
    return names


def private_uses(source, filename="<test>"):
    """(line, what) for each private name of the packages `source` reaches."""
    tree = ast.parse(source, filename)
    ours = package_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if dotted_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in PACKAGES:
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                      if is_private(a.name) or dotted_private(node.module)]
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ours:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            strings = [a.value for a in node.args[:2]
                       if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name in ("setattr", "delattr", "getattr", "hasattr", "setitem") and \
                    len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and \
                    node.args[0].id in ours and strings and is_private(strings[-1]):
                found.append((node.lineno, ast.unparse(node)))
            elif any(dotted_private(s) for s in strings):   # monkeypatch / mock by path
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_checker_finds_each_kind_of_private_use():
    source = """
from domainbed.x import _hidden, shown
from domainbed._internal import y
import analysis._private
from domainbed.launch import pooled
from domainbed.registry import ALGORITHMS
from tests.builders import _fine
import os

pooled._call_train
ALGORITHMS._classes.pop("x")
os._exit
pooled.__name__
monkeypatch.setattr(pooled, "_call_train", f)
monkeypatch.setattr("domainbed.launch.pooled._call_train", f)
monkeypatch.setattr(pooled, "run_config", f)
"""
    found = sorted(what for _, what in private_uses(source))
    assert found == sorted([
        "from domainbed.x import _hidden", "from domainbed._internal import y",
        "import analysis._private", "pooled._call_train", "ALGORITHMS._classes",
        "monkeypatch.setattr(pooled, '_call_train', f)",
        "monkeypatch.setattr('domainbed.launch.pooled._call_train', f)"]), found


def test_no_test_reaches_a_private_name_of_the_packages():
    found = [f"{path.name}:{line}: {what}" for path in sorted(TESTS.glob("*.py"))
             for line, what in private_uses(path.read_text(encoding="utf-8"), str(path))]
    assert not found, "private names of the packages used by tests (use the public API, " \
                      "or make the name public with a docstring):\n" + "\n".join(found)
