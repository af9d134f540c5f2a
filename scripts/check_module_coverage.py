"""Is every module of the packages imported by at least one test of the quick loop?

    python -m pytest -m "not slow" -n 2 --cov=domainbed ... tests   # writes .coverage
    python scripts/check_module_coverage.py [.coverage]

Reads coverage data (subprocesses included: pyproject's `[tool.coverage.run] patch`) and
names every module of the packages none of whose statements ran, i.e. no test imported
it, in-process or through a command line. Exits 1 if there is one, so that marking a
test slow cannot quietly leave a module untested in the quick loop.
"""
import argparse
import os
import sys

import coverage

PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules(root=ROOT, packages=PACKAGES):
    """Every .py file under the packages, as paths relative to root."""
    modules = []
    for package in packages:
        for folder, subfolders, files in os.walk(os.path.join(root, package)):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            modules += [os.path.relpath(os.path.join(folder, f), root)
                        for f in sorted(files) if f.endswith(".py")]
    return modules


def never_imported(data_file, root=ROOT, packages=PACKAGES):
    """The modules with statements of which none ran."""
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    missed = []
    for module in package_modules(root, packages):
        _, statements, _, missing, _ = cov.analysis2(os.path.join(root, module))
        if statements and len(missing) == len(statements):
            missed.append(module)
    return missed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_file", nargs="?", default=os.path.join(ROOT, ".coverage"))
    args = parser.parse_args(argv)
    if not os.path.isfile(args.data_file):
        print(f"error: no coverage data at {args.data_file}; run pytest with --cov first",
              file=sys.stderr)
        return 2
    missed = never_imported(args.data_file)
    if missed:
        print(f"error: {len(missed)} modules no test imports: " + ", ".join(missed),
              file=sys.stderr)
        return 1
    print(f"every module of {', '.join(PACKAGES)} ran in these tests "
          f"({len(package_modules())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
