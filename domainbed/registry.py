"""Name -> class registries. Names live only here; plug-ins arrive through entry points.

    @register_algorithm("ERM")
    class ERM(Algorithm): ...

Another installed package registers with an entry point in the group
``domainbed.algorithms`` (or ``domainbed.datasets``) pointing at its class (or at a
module whose import registers classes with the decorators).
"""
import importlib
import sys
from importlib import metadata

from domainbed.errors import UnknownNameError


class Registry:
    def __init__(self, kind, entry_point_group, builtin_module):
        self.kind = kind
        self.group = entry_point_group
        self.builtin_module = builtin_module
        self._classes = {}
        self._loaded = False
        self._loading = False

    def register(self, name=None):
        def decorator(cls):
            key = name or cls.__name__
            existing = self._classes.get(key)
            if existing is not None and existing is not cls and \
                    existing.__qualname__ != cls.__qualname__:
                raise ValueError(f"{self.kind} {key!r} is already registered by "
                                 f"{existing.__module__}.{existing.__qualname__}")
            self._classes[key] = cls
            cls.registry_name = key
            return cls
        return decorator

    def _load(self):
        if self._loaded or self._loading:
            return
        self._loading = True
        try:
            importlib.import_module(self.builtin_module)
            for ep in metadata.entry_points(group=self.group):
                try:
                    obj = ep.load()
                except Exception as e:  # a broken plug-in must not break the registry
                    print(f"warning: could not load {self.kind} plug-in {ep.name!r} "
                          f"({ep.value}): {e}", file=sys.stderr)
                    continue
                if isinstance(obj, type) and ep.name not in self._classes:
                    self.register(ep.name)(obj)
            self._loaded = True
        finally:
            self._loading = False

    def get(self, name):
        self._load()
        if name not in self._classes:
            raise UnknownNameError(self.kind, name, self._classes)
        return self._classes[name]

    def names(self):
        self._load()
        return sorted(self._classes)

    def __contains__(self, name):
        self._load()
        return name in self._classes


ALGORITHMS = Registry("algorithm", "domainbed.algorithms", "domainbed.algorithms")
DATASETS = Registry("dataset", "domainbed.datasets", "domainbed.datasets")
register_algorithm = ALGORITHMS.register
register_dataset = DATASETS.register


def get_algorithm_class(name):
    return ALGORITHMS.get(name)


def get_dataset_class(name):
    return DATASETS.get(name)
