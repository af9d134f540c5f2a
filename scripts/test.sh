#!/usr/bin/env bash
# Install the project with its test extra, then run the whole test suite with coverage:
# first the quick loop (`-m "not slow"`, which must import every module of the packages:
# scripts/check_module_coverage.py), then the slow end-to-end tests; the coverage report
# covers both. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --upgrade pip
python3 -m pip install -q -e ".[test]"
# lint: the whole tree under pyproject's ruff config
python3 -m ruff check .
# layers: the import contracts of pyproject's [tool.importlinter] (docs/ARCHITECTURE.md)
lint-imports --no-cache
# types: every package of the library, fully annotated (pyproject's [tool.mypy])
python3 -m mypy
# the documentation site: reference pages regenerated from the code, every link checked
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet
packages=(domainbed analysis ood_bench spawrious oodutils)
cov=("${packages[@]/#/--cov=}")
rm -f .coverage .coverage.*
# -rs: every skip is listed with its reason (in CI, CI=true, a missing need fails instead)
# --timeout (pytest-timeout): a hung test fails with its stack instead of stalling the run;
# the longest tests raise their own limit (@pytest.mark.timeout)
python3 -m pytest -q -rs -n 2 --durations=15 --timeout 600 -m "not slow" "${cov[@]}" \
    --cov-report= tests "$@"
python3 scripts/check_module_coverage.py .coverage
python3 -m pytest -q -rs -n 2 --durations=15 --timeout 1800 -m slow "${cov[@]}" --cov-append \
    --cov-report=term:skip-covered tests "$@"
