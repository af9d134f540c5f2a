"""The typed public API (issue 23, item 5): every public function, method and class of the
user-facing modules is annotated, so mypy (pyproject's [tool.mypy], run by scripts/test.sh)
can check its callers. The list lives here too, so it cannot silently shrink."""
import importlib
import inspect
from pathlib import Path

import pytest

from tests.toml_files import pyproject

ROOT = Path(__file__).resolve().parents[1]
USER_FACING = (
    "domainbed", "domainbed.api", "domainbed.training.config", "domainbed.training.run",
    "domainbed.registry", "domainbed.hparams",
    "domainbed.run_hparams", "domainbed.results", "domainbed.results.records",
    "domainbed.results.model_selection", "domainbed.results.report", "analysis.selection_stats",
    "domainbed.results.tables", "domainbed.results.schema", "domainbed.results.export",
    "domainbed.predictions", "domainbed.results.reader", "domainbed.results.cache",
    "domainbed.leaderboard.site", "domainbed.leaderboard.published",
    "analysis.aotl.tables", "analysis.aotl.inputs", "analysis.aotl.stats", "analysis.aotl.study",
    "analysis.labelfree.estimators", "analysis.oodselect.selector", "analysis.oodselect.config",
    "analysis.theory", "analysis.validity.stats",
    "oodutils", "oodutils.accuracy", "oodutils.cli", "oodutils.errors", "oodutils.fileio",
    "oodutils.log", "oodutils.plotting", "oodutils.tables",
    "oodutils.templating", "oodutils.metrics", "oodutils.untrusted", "oodutils.pinned_dir",
)


def _callables_of_class(cls):
    """(qualified name, function) of the methods a user calls: public ones and __init__."""
    for name, attr in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(attr, (classmethod, staticmethod)):
            yield f"{cls.__qualname__}.{name}", attr.__func__, not isinstance(attr, staticmethod)
        elif isinstance(attr, property) and attr.fget is not None:
            yield f"{cls.__qualname__}.{name}", attr.fget, True
        elif inspect.isfunction(attr):
            yield f"{cls.__qualname__}.{name}", attr, True


def public_callables(module):
    """(name, function, bound) for every public function and class method `module` defines
    (re-exports are checked where they are defined)."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj, False
        elif inspect.isclass(obj):
            yield from _callables_of_class(obj)


def missing_annotations(function, bound):
    """Names of the parameters (and 'return') of `function` that carry no annotation."""
    signature = inspect.signature(function)
    params = list(signature.parameters.values())[1 if bound else 0:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_the_check_finds_what_is_missing():
    def untyped(a, *args, b: int = 0, **kwargs):
        return a

    def typed(a: int, *args: str, **kwargs: float) -> int:
        return a

    class Example:
        def method(self, x) -> None: ...

        @classmethod
        def build(cls, y: int): ...

    assert missing_annotations(untyped, False) == ["a", "args", "kwargs", "return"]
    assert missing_annotations(typed, False) == []
    found = {name: missing_annotations(f, bound) for name, f, bound in
             _callables_of_class(Example)}
    assert found == {"test_the_check_finds_what_is_missing.<locals>.Example.method": ["x"],
                     "test_the_check_finds_what_is_missing.<locals>.Example.build": ["return"]}


@pytest.mark.parametrize("module_name", USER_FACING)
def test_every_public_callable_is_annotated(module_name):
    module = importlib.import_module(module_name)
    unannotated = {f"{module_name}.{name}": missing
                   for name, function, bound in public_callables(module)
                   if (missing := missing_annotations(function, bound))}
    assert not unannotated, f"annotate these (parameters / return): {unannotated}"


def test_the_main_entry_points_are_checked():
    """The list covers what users call: the checks above must see these names
    (`domainbed.train` is `domainbed.api.train`, a lazy export)."""
    seen = {f"{m}.{name}" for m in USER_FACING
            for name, _, _ in public_callables(importlib.import_module(m))}
    for name in ("domainbed.api.train", "domainbed.training.run.run_config",
                 "domainbed.training.config.RunConfig.validate",
                 "domainbed.registry.get_algorithm_class", "domainbed.run_hparams.resolve",
                 "domainbed.results.records.load_records",
                 "domainbed.results.model_selection.select",
                 "domainbed.leaderboard.site.build_site", "analysis.aotl.tables.per_ood_table",
                 "analysis.aotl.stats.fit_line", "analysis.oodselect.selector.OODSelect.fit",
                 "analysis.validity.stats.bayes_factor_k",
                 "oodutils.fileio.atomic_write_text"):
        assert name in seen, name


def test_mypy_checks_the_same_modules():
    config = pyproject()["tool"]["mypy"]
    files = config["files"]

    def covered(module_name):
        path = module_name.replace(".", "/")
        return any(f in (path, path + ".py", path + "/__init__.py") or path.startswith(f + "/")
                   for f in files)

    assert [m for m in USER_FACING if not covered(m)] == []
    strict = {m for o in config.get("overrides", []) if o.get("disallow_untyped_defs")
              for m in o["module"]}
    for m in USER_FACING:
        # "a.b.*" matches a.b itself and every module under it
        parents = {m} | {".".join(m.split(".")[:i]) + ".*" for i in range(1, m.count(".") + 2)}
        assert parents & strict, f"{m}: not under disallow_untyped_defs"
