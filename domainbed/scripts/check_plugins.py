"""Check the installed plug-ins: `domainbed-check-plugins` loads every algorithm and dataset
that another package registers through an entry point and makes of each the checks the
project's own tests make of its built-in classes: it loads, each hyperparameter it declares
has a valid range (``low=``/``high=`` or ``choices=``) holding its default, and the random
search's draws repeat, are plain JSON values and stay in range. One line per plug-in; exit
status 1 when any fails (run it after ``pip install`` of a plug-in, or in its own CI)."""
import argparse
import sys
import warnings
from typing import Any

from domainbed import hparams, registry
from oodutils.cli import ArgumentParser, add_logging_flags, configure_logging
from oodutils.errors import epilog_example, run_cli

EPILOG = epilog_example("domainbed-check-plugins", "domainbed.scripts.check_plugins", "-v")


def build_parser() -> argparse.ArgumentParser:
    return add_logging_flags(ArgumentParser(
        prog="domainbed-check-plugins", description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter))


def plugin_problems() -> Any:
    """[(kind, name, module, problems)] for every installed plug-in class, plus one entry
    per plug-in that failed to load (its name, no class)."""
    found = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registries = [registry.ALGORITHMS, registry.DATASETS]
        plugins = [(reg, name) for reg in registries for name in reg.plugin_names()]
    for warning in caught:
        if issubclass(warning.category, registry.PluginWarning):
            found.append(("plug-in", "?", "", [str(warning.message)]))
    for reg, name in plugins:
        cls = reg.get(name)
        dataset_cls = cls if reg.kind == "dataset" else None
        problems = hparams.range_problems(cls, dataset_cls)
        if not problems:
            problems = hparams.draw_problems(cls, dataset_cls)
        found.append((reg.kind, name, f"{cls.__module__}.{cls.__qualname__}", problems))
    return found


def main(argv: list[str] | None = None) -> Any:
    configure_logging(build_parser().parse_args(argv))
    results = plugin_problems()
    if not results:
        print("no plug-ins installed (entry points domainbed.algorithms, domainbed.datasets)")
        return 0
    failed = 0
    for kind, name, where, problems in results:
        label = f"{kind} {name}" + (f" ({where})" if where else "")
        if problems:
            failed += 1
            print(f"FAIL {label}: {'; '.join(problems)}")
        else:
            print(f"ok   {label}")
    print(f"{len(results) - failed} of {len(results)} plug-in(s) pass")
    return 1 if failed else 0


def cli() -> None:
    """The `domainbed-check-plugins` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    sys.exit(run_cli(main))
