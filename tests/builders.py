"""Shared test builders: DomainBed-format records and results.jsonl lines, run folders
(results.jsonl, done, predictions), sweeps of runs, reading a run's records back, the text
tables of collect_results, classes registered for one test."""
import contextlib


@contextlib.contextmanager
def registered(registry, name, cls, override=False):
    """`cls` registered as `name` in `registry` (a domainbed Registry) for the block, the
    name's previous class (if any) put back after it: other tests list every name."""
    previous = registry.get(name) if name in registry else None
    registry.register(name, override=override)(cls)
    try:
        yield cls
    finally:
        registry.unregister(name)
        if previous is not None:
            registry.register(name)(previous)
