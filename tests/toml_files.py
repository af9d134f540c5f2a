"""TOML on every Python the project supports: the standard library's tomllib from 3.11,
its backport tomli (in the test extra) on 3.10."""
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
loads = tomllib.loads


def pyproject():
    """This checkout's pyproject.toml, as a dict."""
    return loads((REPO / "pyproject.toml").read_text())
