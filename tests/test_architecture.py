"""The architecture holds (docs/ARCHITECTURE.md): no import cycles in the project's static
import graph (module- and function-level imports, outside TYPE_CHECKING), no library
module imports a command-line module, analysis reads records and never training
internals."""
import ast
from pathlib import Path

import pytest

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

    import sys
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


def test_no_library_module_imports_a_command_line_module():
    offenders = [(name, target) for name, targets in import_graph().items()
                 if not name.startswith("domainbed.scripts") for target in targets
                 if target.startswith("domainbed.scripts")]
    assert offenders == []


@pytest.mark.parametrize("internal", ["domainbed.training", "domainbed.launch",
                                      "domainbed.algorithms", "domainbed.networks"])
def test_analysis_never_imports_training_internals(internal):
    offenders = [(name, target) for name, targets in import_graph().items()
                 if name.startswith("analysis") for target in targets
                 if target == internal or target.startswith(internal + ".")]
    assert offenders == []


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
