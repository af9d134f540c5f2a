#!/usr/bin/env bash
# Install the project with its test extra, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --upgrade pip
python3 -m pip install -q -e ".[test]"
# lint: the whole tree under pyproject's ruff config
python3 -m ruff check .
# types: the user-facing modules, fully annotated (pyproject's [tool.mypy])
python3 -m mypy
# -rs: every skip is listed with its reason (in CI, CI=true, a missing need fails instead)
python3 -m pytest -q -rs -n 2 --durations=15 tests "$@"
