"""Name -> class registries. Names live only here; plug-ins arrive through entry points.

    @register_algorithm("ERM")
    class ERM(Algorithm): ...

Another installed package registers with an entry point in the group
``domainbed.algorithms`` (or ``domainbed.datasets``) pointing at its class (or at a
module whose import registers classes with the decorators).

A name family ``PREFIX:ARGUMENT`` (``folder:PATH``, ``csv:PATH``) resolves through a
factory registered with ``register_prefix(PREFIX)``: the factory builds the class for the
argument once per process, and the class is registered under the full name as given.
"""
from __future__ import annotations

import ast
import collections
import glob
import importlib
import os
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata, util
from typing import Any, TypeVar

from domainbed.hparams import range_problems
from oodutils.errors import UnknownNameError, UserError
from oodutils.log import ProjectWarning

T = TypeVar("T", bound=type)


class RegistryClash(UserError, ValueError):
    """Two different classes want the same registered name."""


class PluginWarning(ProjectWarning):
    """An installed plug-in (entry point) failed to load; the registry goes on without it."""


class HparamRangeWarning(ProjectWarning):
    """A registered class declares a hyperparameter without a valid range (or with a default
    outside it): a user's override of it cannot be checked before training starts."""


def warn_about_ranges(kind: str, name: str, cls: type) -> None:
    """One warning per problem of `cls`'s own hyperparameter declarations, naming the class
    and its module (a plug-in's package), at registration."""
    dataset_cls = cls if kind == "dataset" else None
    for problem in range_problems(cls, dataset_cls):
        warnings.warn(f"{kind} {name!r} ({_full_name(cls)}): {problem}; see "
                      f"docs/guide/plugins.md", HparamRangeWarning, stacklevel=3)


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _same_class(a: type, b: type) -> bool:
    """The same class, or the same definition imported twice (a module re-imported,
    or run as __main__)."""
    return a is b or (a.__qualname__ == b.__qualname__ and
                      (a.__module__ == b.__module__ or "__main__" in (a.__module__,
                                                                       b.__module__)))


class Registry:
    def __init__(self, kind: str, entry_point_group: str, builtin_module: str) -> None:
        self.kind = kind
        self.group = entry_point_group
        self.builtin_module = builtin_module
        self._classes: dict[str, type[Any]] = {}
        self._overridden: set[str] = set()
        self._factories: dict[str, Callable[[str], type[Any]]] = {}
        self._loaded = False
        self._loading = False

    def register(self, name: str | None = None, override: bool = False
                 ) -> Callable[[T], T]:
        """Register a class under `name`. A name taken by another class is an error
        naming both, unless the newcomer asks to replace it with ``override=True`` (a
        re-import of the same module is not a clash); a later plain registration never
        replaces an explicit override."""
        def decorator(cls: T) -> T:
            key = name or cls.__name__
            existing = self._classes.get(key)
            if existing is not None and not override and key in self._overridden:
                return cls
            if existing is not None and not override and not _same_class(existing, cls):
                raise RegistryClash(
                    f"{self.kind} {key!r} is already registered by "
                    f"{_full_name(existing)}; refusing {_full_name(cls)} under the same name "
                    f"(pick another name, or register it with override=True to replace it)")
            if override:
                self._overridden.add(key)
            if existing is not cls:
                warn_about_ranges(self.kind, key, cls)
            self._classes[key] = cls
            cls.registry_name = key  # type: ignore[attr-defined]
            return cls
        return decorator

    def register_prefix(self, prefix: str) -> Callable[[Callable[[str], type]],
                                                       Callable[[str], type]]:
        """Register `factory(argument) -> class` for the names ``prefix:argument``."""
        def decorator(factory: Callable[[str], type]) -> Callable[[str], type]:
            existing = self._factories.get(prefix)
            if existing is not None and existing.__qualname__ != factory.__qualname__:
                raise RegistryClash(f"{self.kind} name prefix {prefix + ':'!r} is already "
                                    f"registered by {existing.__module__}."
                                    f"{existing.__qualname__}")
            self._factories[prefix] = factory
            return factory
        return decorator

    def _from_factory(self, name: str) -> type[Any] | None:
        """The class a prefix factory builds for `name`, registered under `name`; None when
        no factory claims the prefix."""
        prefix, sep, argument = name.partition(":")
        factory = self._factories.get(prefix) if sep else None
        if factory is None:
            return None
        cls = factory(argument)
        cls.registry_name = name
        self._classes[name] = cls
        return cls

    def _load(self) -> None:
        if self._loaded or self._loading:
            return
        self._loading = True
        try:
            importlib.import_module(self.builtin_module)
            for ep in metadata.entry_points(group=self.group):
                try:
                    obj = ep.load()
                except RegistryClash:
                    raise
                except Exception as e:  # a broken plug-in must not break the registry
                    warnings.warn(f"could not load {self.kind} plug-in {ep.name!r} "
                                  f"({ep.value}): {e}", PluginWarning, stacklevel=2)
                    continue
                if isinstance(obj, type) and self._classes.get(ep.name) is not obj:
                    self.register(ep.name)(obj)
            self._loaded = True
        finally:
            self._loading = False

    def get(self, name: str) -> type[Any]:
        self._load()
        if name in self._classes:
            return self._classes[name]
        built = self._from_factory(name)
        if built is None:
            valid = [*self._classes, *(f"{p}:..." for p in self._factories)]
            raise UnknownNameError(self.kind, name, valid)
        return built

    def declared(self, name: str, attribute: str) -> Any:
        """The literal value of `attribute` in the body of the built-in class registered
        as `name`, read from the built-in modules' source without importing them (the
        dataset modules import torch: seconds, where a results table needs a list of
        names). Raises LookupError where the source does not say (no such class, an
        inherited or computed value) and once the registry is loaded (a class registered
        since may override a built-in: ask `get`)."""
        if self._loaded:
            raise LookupError(f"the {self.kind} registry is loaded: ask it")
        found = _declared_attributes(self.builtin_module, self.kind, attribute, name)
        if name not in found:
            raise LookupError(f"no literal {attribute} declared for {self.kind} {name!r}")
        return found[name]

    def names(self) -> list[str]:
        """The registered names (classes built by prefix factories are not listed)."""
        self._load()
        return sorted(n for n in self._classes if n.partition(":")[0] not in self._factories)

    def builtin_names(self) -> list[str]:
        """The names of the project's own classes (those of this package), without the
        installed plug-ins': what the project's tests and reference pages cover."""
        package = self.builtin_module.partition(".")[0] + "."
        return [n for n in self.names() if self._classes[n].__module__.startswith(package)]

    def plugin_names(self) -> list[str]:
        """The names of classes from outside the project (installed plug-ins)."""
        builtin = set(self.builtin_names())
        return [n for n in self.names() if n not in builtin]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._classes


_SOURCES: dict[tuple[str, str], list[tuple[str, str]]] = {}    # -> [(path, source)]
_FILE_DECLARED: dict[tuple[str, str, str], dict[str, Any]] = {}


def _declared_attributes(package: str, kind: str, attribute: str,
                         name: str | None = None) -> dict[str, Any]:
    """{registered name: literal value of `attribute`} over the classes of `package`'s
    modules decorated with ``register_<kind>("NAME")`` (each module parsed once per
    process). name: stop at the first module that declares it, the modules whose source
    mentions it tried first (most lookups parse one module, not all)."""
    decorator = f"register_{kind}"
    modules = _registering_modules(package, decorator)
    if name is not None:
        modules = sorted(modules, key=lambda module: name not in module[1])
    found: dict[str, Any] = {}
    for path, source in modules:
        key = (path, decorator, attribute)
        if key not in _FILE_DECLARED:
            _FILE_DECLARED[key] = {}
            for node in _class_defs(ast.parse(source)):
                _FILE_DECLARED[key].update(_literal_declarations(node, decorator, attribute))
        found.update(_FILE_DECLARED[key])
        if name is not None and name in found:
            break
    return found


def _registering_modules(package: str, decorator: str) -> list[tuple[str, str]]:
    """(path, source) of `package`'s modules that hold `decorator`, in path order."""

    key = (package, decorator)
    if key not in _SOURCES:
        spec = util.find_spec(package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        found = []
        for path in sorted(p for folder in folders
                           for p in glob.glob(os.path.join(folder, "*.py"))):
            with open(path, encoding="utf-8") as f:
                source = f.read()
            if decorator in source:
                found.append((path, source))
        _SOURCES[key] = found
    return _SOURCES[key]


_STATEMENT_LISTS = ("body", "handlers", "orelse", "finalbody", "cases")


def _class_defs(tree: Any) -> Iterator[Any]:
    """The class definitions of a module, in ast.walk's order, found by walking only the
    statement lists (a class is a statement; expressions, most of the tree, never hold
    one)."""

    todo = collections.deque([tree])
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.ClassDef):
            yield node
        for field in node._fields:
            if field in _STATEMENT_LISTS:
                value = getattr(node, field)
                if isinstance(value, list):
                    todo.extend(value)


def _literal_declarations(node: Any, decorator: str, attribute: str) -> dict[str, Any]:

    names = [d.args[0].value for d in node.decorator_list
             if isinstance(d, ast.Call) and getattr(d.func, "id", None) == decorator and
             d.args and isinstance(d.args[0], ast.Constant) and
             isinstance(d.args[0].value, str)]
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and \
                getattr(statement.targets[0], "id", None) == attribute:
            try:
                value = ast.literal_eval(statement.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return {}
            return {name: value for name in names}
    return {}


ALGORITHMS = Registry("algorithm", "domainbed.algorithms", "domainbed.algorithms")
DATASETS = Registry("dataset", "domainbed.datasets", "domainbed.datasets")
register_algorithm = ALGORITHMS.register
register_dataset = DATASETS.register
register_dataset_prefix = DATASETS.register_prefix


def get_algorithm_class(name: str) -> type[Any]:
    """The algorithm class registered as `name` (UnknownNameError lists the valid ones)."""
    return ALGORITHMS.get(name)


def get_dataset_class(name: str) -> type[Any]:
    """The dataset class registered as `name`, or built for ``folder:PATH`` / ``csv:PATH``
    (UnknownNameError lists the valid ones)."""
    return DATASETS.get(name)
