#!/usr/bin/env bash
# The quick loop on the OLDEST releases pyproject.toml allows: a fresh virtual environment
# in a temporary folder, `uv pip install --resolution lowest-direct` (every direct
# dependency at its lower bound, the rest at the newest release that fits), then
# `pytest -m "not slow"`. A failure here means a lower bound in pyproject.toml is too low.
#
#   bash scripts/test_lowest.sh                 # python3, 2 test workers
#   PYTHON=python3.10 JOBS=4 bash scripts/test_lowest.sh -x   # extra args go to pytest
#   KEEP_VENV=1 bash scripts/test_lowest.sh     # keep the environment (its path is printed)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
workdir=$(mktemp -d "${TMPDIR:-/tmp}/oodbed-lowest.XXXXXX")
if [ -z "${KEEP_VENV:-}" ]; then
    trap 'rm -rf "$workdir"' EXIT
fi
venv=$workdir/venv
echo "lowest-direct environment: $venv ($("$python" --version))"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check uv
"$venv/bin/uv" pip install --python "$venv/bin/python" --resolution lowest-direct -e ".[test]"
echo "--- installed (direct dependencies at their lower bounds) ---"
"$venv/bin/uv" pip freeze --python "$venv/bin/python" --exclude-editable
echo "---"
export MPLBACKEND=Agg
start=$(date +%s)
status=0
# --timeout: a test that hangs fails with its stack (pytest-timeout) instead of stalling
"$venv/bin/python" -m pytest -q -m "not slow" -n "${JOBS:-2}" -rs --timeout 900 tests "$@" \
    || status=$?
echo "lowest-direct quick loop: exit $status in $(( $(date +%s) - start )) s"
exit "$status"
