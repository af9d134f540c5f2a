"""Every public function and method of the library is annotated: each parameter (but a
method's `self`/`cls`) and the return (`__init__` counts as public; its return may stay
implicit, as mypy allows). mypy (pyproject's [tool.mypy]: the five packages, with
`disallow_untyped_defs`, run by scripts/test.sh) checks the bodies against them; this test
reads the source with `ast` and names the unannotated ones by file and line."""
import ast
from pathlib import Path

import pytest

from tests.toml_files import pyproject

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")


def _is_public_module(path, package_root):
    """A module is private when a folder or file name on its path starts with "_"
    (`__init__.py` is its package, which is public)."""
    parts = path.relative_to(package_root).with_suffix("").parts
    return not any(p.startswith("_") and p != "__init__" for p in parts)


def _is_staticmethod(node):
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)


def missing_annotations(node, in_class):
    """The names of `node`'s unannotated parameters (and "return")."""
    args = node.args
    positional = args.posonlyargs + args.args
    if in_class and positional and not _is_staticmethod(node) and \
            positional[0].arg in ("self", "cls", "mcs"):
        positional = positional[1:]
    params = positional + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    missing = [a.arg for a in params if a.annotation is None]
    if node.returns is None and node.name != "__init__":
        missing.append("return")
    return missing


def public_functions(tree):
    """(node, in_class) for each public module-level function and each public method of a
    public class (nested public classes included); functions inside functions are not."""
    def walk(body, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_") or (in_class and node.name == "__init__"):
                    yield node, in_class
            elif isinstance(node, ast.ClassDef):
                if not node.name.startswith("_"):
                    yield from walk(node.body, True)
            elif isinstance(node, ast.If):
                yield from walk(node.body, in_class)
                yield from walk(node.orelse, in_class)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody):
                    yield from walk(block, in_class)
    return list(walk(tree.body, False))


def unannotated(package):
    root = ROOT / package
    found = []
    for path in sorted(root.rglob("*.py")):
        if not _is_public_module(path, root):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, in_class in public_functions(tree):
            missing = missing_annotations(node, in_class)
            if missing:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                             f" ({', '.join(missing)})")
    return found


def test_the_checker_finds_unannotated_functions():
    tree = ast.parse(
        "def ok(a: int, *args: int, b: str = '', **kw: float) -> None: ...\n"
        "def no_return(a: int): ...\n"
        "def no_param(a, b: int) -> int: ...\n"
        "def _private(a): ...\n"
        "class C:\n"
        "    def method(self, x: int) -> int: ...\n"
        "    @classmethod\n"
        "    def build(cls) -> 'C': ...\n"
        "    @staticmethod\n"
        "    def helper(self) -> None: ...\n"
        "    def star(self, *args) -> None: ...\n"
        "    def _hidden(self, x): ...\n"
        "    def __init__(self, x): ...\n"
        "class _Private:\n"
        "    def method(self, x): ...\n"
        "def outer() -> None:\n"
        "    def inner(x): ...\n")
    found = {node.name: missing_annotations(node, in_class)
             for node, in_class in public_functions(tree)}
    assert found == {"ok": [], "no_return": ["return"], "no_param": ["a"], "method": [],
                     "build": [], "helper": ["self"], "star": ["args"], "outer": [],
                     "__init__": ["x"]}


@pytest.mark.parametrize("package", PACKAGES)
def test_public_functions_are_annotated(package):
    found = unannotated(package)
    assert found == [], f"{len(found)} public functions without full annotations:\n" + \
        "\n".join(found)


def test_mypy_checks_every_package_strictly():
    """`python -m mypy` (no arguments, as scripts/test.sh runs it) covers the five packages,
    with untyped definitions an error everywhere."""
    config = pyproject()["tool"]["mypy"]
    assert sorted(config["files"]) == sorted(PACKAGES)
    assert config.get("disallow_untyped_defs") is True
    assert not [o for o in config.get("overrides", []) if "disallow_untyped_defs" in o or
                "ignore_errors" in o]
