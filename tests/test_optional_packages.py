"""A missing optional package stops with one line naming the extra that installs it, and
every extra the code names exists in pyproject.toml."""
import re
from pathlib import Path

import pytest

from oodutils.errors import UserError, require
from tests.toml_files import pyproject

REPO = Path(__file__).resolve().parents[1]


def test_require_names_the_extra():
    assert require("json", extra="analysis").dumps([]) == "[]"
    with pytest.raises(UserError, match=r"pip install 'oodbed\[analysis\]'") as info:
        require("no_such_package_for_this_test", extra="analysis")
    assert "\n" not in str(info.value)


def test_every_named_extra_exists():
    extras = pyproject()["project"]["optional-dependencies"]
    named = set()
    for package in ("domainbed", "analysis", "ood_bench", "spawrious"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            named |= set(re.findall(r'extra="([\w-]+)"', text))
            named |= set(re.findall(r"oodbed\[([\w-]+)\]", text))
    assert named, "no module names an extra"
    assert named <= set(extras), named - set(extras)
