"""The architecture holds (docs/ARCHITECTURE.md): the import contracts of pyproject's
[tool.importlinter] are kept (the layers, no library module importing a command-line
module, analysis reading records and never training internals, oodutils standing alone)
and the diagram draws the layers contract; no import cycles in the project's static
import graph (module- and function-level imports, outside TYPE_CHECKING); imports inside
functions only for heavy or optional packages, and few of them."""
import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.toml_files import pyproject

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oodutils", "domainbed", "analysis", "ood_bench", "spawrious")


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules():
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking_nodes(tree):
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def imported_modules(path, name, modules):
    """The project modules `path` imports (the longest known prefix of each name)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import module` imports the module; `from module import name`
            # the module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        for full in names:
            parts = full.split(".")
            for i in range(len(parts), 0, -1):
                candidate = ".".join(parts[:i])
                if candidate in modules:
                    if candidate != name:
                        found.add(candidate)
                    break
    return found


def import_graph():
    modules = project_modules()
    return {name: imported_modules(path, name, modules) for name, path in modules.items()}


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def contract(contract_id):
    found = [c for c in pyproject()["tool"]["importlinter"]["contracts"]
             if c["id"] == contract_id]
    assert len(found) == 1, f"pyproject has no import-linter contract {contract_id!r}"
    return found[0]


def test_the_import_contracts_are_kept():
    """lint-imports (as scripts/test.sh runs it) over every contract in pyproject."""
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache", "--no-logo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_contracts_hold_the_rules():
    """The rules docs/ARCHITECTURE.md states, each in a contract (not only in prose)."""
    commands = contract("commands")
    assert commands["type"] == "forbidden"
    assert "domainbed.scripts" in commands["forbidden_modules"]
    assert {f"{package}.**" for package in PACKAGES} <= set(commands["source_modules"])
    assert commands["as_packages"] is False   # every module on its own, commands included
    records_only = contract("analysis-reads-records")
    assert records_only["source_modules"] == ["analysis"]
    assert {"domainbed.training", "domainbed.launch"} <= set(records_only["forbidden_modules"])
    alone = contract("oodutils-alone")
    assert alone["source_modules"] == ["oodutils"]
    assert set(alone["forbidden_modules"]) == set(PACKAGES) - {"oodutils"}


def _layer(expression):
    """A layer as import-linter reads it: its modules and whether they are independent."""
    independent = ":" not in expression
    return (tuple(sorted(m.strip() for m in re.split(r"[|:]", expression))), independent)


def diagram_layers(markdown):
    """The layers drawn under '## Layers': one row per layer, a label in the first 14
    columns (empty where a layer continues its group), then the modules."""
    section = markdown.split("## Layers", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    return [line[14:].strip() for line in block.splitlines() if line[14:].strip()]


def test_the_diagram_is_the_layers_contract():
    drawn = diagram_layers((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    layers = contract("layers")
    assert layers["type"] == "layers"
    assert [_layer(x) for x in drawn] == [_layer(x) for x in layers["layers"]], (
        "docs/ARCHITECTURE.md's diagram and pyproject's layers contract disagree:\n"
        + "\n".join(drawn) + "\n---\n" + "\n".join(layers["layers"]))


def test_the_diagram_parser_sees_a_difference():
    markdown = ("## Layers\n```text\ntop           a.b | a.c\n              a.d\n"
                "bottom        e\n```\n")
    assert diagram_layers(markdown) == ["a.b | a.c", "a.d", "e"]
    assert _layer("a.c | a.b") == _layer("a.b | a.c") != _layer("a.b : a.c")


HEAVY_PACKAGES = {"torch", "torchvision", "pandas", "scipy", "matplotlib", "sklearn", "timm",
                  "open_clip", "transformers", "wilds", "ray", "submitit", "diffusers", "PIL",
                  "tqdm", "mlxtend", "numpy", "jinja2", "selenium", "optuna", "ruptures",
                  "gdown"}


def _targets(node, name, path, modules):
    """The project modules (or third-party names) one import statement imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = name.split(".")
        anchor = anchor[:len(anchor) - node.level + (1 if path.name == "__init__.py" else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _top_level_imports(tree):
    def walk(body):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                yield from walk(node.body)
    return list(walk(tree.body))


def _lazy_export_nodes(tree, path):
    """The imports inside a package's module-level `__getattr__` (PEP 562)."""
    if path.name != "__init__.py":
        return set()
    return {id(n) for node in tree.body if isinstance(node, ast.FunctionDef) and
            node.name == "__getattr__" for n in ast.walk(node)}


def test_imports_inside_functions_are_for_heavy_or_optional_modules():
    """A function imports a project module only when that module's own top-level imports
    pull in a heavy or optional package (commands answer --help before them), or where
    it is a package's `__getattr__` (PEP 562: its lazy exports, named in its `__all__`);
    every other project import is at the top of the module, where a reader sees the
    dependency."""
    modules = project_modules()
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    heavy_cache = {}

    def heavy(name):
        if name not in heavy_cache:
            heavy_cache[name] = False   # a module being checked counts as light
            heavy_cache[name] = any(
                full.split(".")[0] in HEAVY_PACKAGES or (full in modules and heavy(full))
                for node in _top_level_imports(trees[name])
                for full in _targets(node, name, modules[name], modules))
        return heavy_cache[name]

    light = []
    for name, tree in trees.items():
        skip = {id(n) for n in _top_level_imports(tree)} | _type_checking_nodes(tree) | \
            _lazy_export_nodes(tree, modules[name])
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                light += [(name, t) for t in _targets(node, name, modules[name], modules)
                          if t in modules and not heavy(t)]
    assert light == [], light


FUNCTION_LEVEL_IMPORT_BUDGET = 60


def function_level_imports(tree):
    """The import statements inside function bodies (nested functions included)."""
    found = []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    walk(tree, False)
    return found


def test_the_import_counter_counts_nested_function_imports_only():
    tree = ast.parse("import os\nif x:\n    import re\ndef f():\n    import json\n"
                     "    def g():\n        from a import b\nclass C:\n    import sys\n"
                     "    def m(self):\n        import io\n")
    assert [ast.unparse(n) for n in function_level_imports(tree)] == [
        "import json", "from a import b", "import io"]


def test_few_imports_inside_functions():
    """Optional or heavy packages only (oodutils.errors.require for an optional extra, a
    plain `import torch` line for a heavy one): at most 60 in the five packages."""
    counts = {package: sum(len(function_level_imports(ast.parse(p.read_text())))
                           for p in (ROOT / package).rglob("*.py"))
              for package in PACKAGES}
    assert sum(counts.values()) <= FUNCTION_LEVEL_IMPORT_BUDGET, counts
