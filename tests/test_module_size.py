"""No module of the library is over 600 lines (the guide's rule: a longer one holds more
than one responsibility and is split by moving whole functions to a module of their own)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
MAX_LINES = 600


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for package in PACKAGES
            for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules (lines): {long}"


def test_the_results_package_is_short_python():
    """domainbed/results/ holds at most 2,500 lines, all Python (issue 38: one short reader
    on polars, no compiled kernel, no other language)."""
    folder = ROOT / "domainbed" / "results"
    code = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    other = [p.name for p in code if p.suffix not in (".py", ".j2")]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in code
                if p.suffix == ".py")
    assert other == [] and lines <= 2500, (other, lines)
