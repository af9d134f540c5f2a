"""No compiled code at run time: the packages hold no C source or shared library, and no
module loads one (ctypes, cffi) or calls a compiler (issues 38 and 39)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
COMPILED = {".c", ".h", ".cc", ".cpp", ".so", ".dylib", ".dll", ".pyd"}
LOADS_OR_BUILDS = re.compile(r"^\s*(import|from)\s+(ctypes|cffi)\b|\bctypes\.|\bCDLL\b|"
                             r"[\"'](cc|gcc|clang)[\"']", re.MULTILINE)


def test_packages_hold_no_compiled_code_and_load_none():
    files = [p for package in PACKAGES for p in (REPO / package).rglob("*") if p.is_file()]
    assert files
    assert sorted(str(p.relative_to(REPO)) for p in files if p.suffix in COMPILED) == []
    loaders = [str(p.relative_to(REPO)) for p in files if p.suffix == ".py"
               and LOADS_OR_BUILDS.search(p.read_text(encoding="utf-8"))]
    assert loaders == []


def test_the_pattern_finds_what_it_looks_for():
    for text in ("import ctypes\n", "from cffi import FFI\n", "lib = ctypes.CDLL(path)\n",
                 'subprocess.run(["cc", "-O2"])\n'):
        assert LOADS_OR_BUILDS.search(text), text
    assert not LOADS_OR_BUILDS.search("# a C kernel once lived here\nx = 'access'\n")
