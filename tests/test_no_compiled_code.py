"""No compiled code at run time: the packages hold no C source or shared library, and no
module loads one (ctypes, cffi) or calls a compiler (issues 38 and 39); no module forks or
changes a process-wide setting (the garbage collector, the allocator, the switch interval)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("domainbed", "analysis", "ood_bench", "spawrious", "oodutils")
COMPILED = {".c", ".h", ".cc", ".cpp", ".so", ".dylib", ".dll", ".pyd"}
LOADS_OR_BUILDS = re.compile(r"^\s*(import|from)\s+(ctypes|cffi)\b|\bctypes\.|\bCDLL\b|"
                             r"[\"'](cc|gcc|clang)[\"']", re.MULTILINE)
FORKS_OR_SETS = re.compile(r"\bos\.fork|[\"']fork(server)?[\"']|set_start_method|"
                           r"\bgc\.(disable|freeze|set_threshold)|setswitchinterval|"
                           r"mallopt|MALLOC_CONF|\bmalloc_trim")


def _package_files():
    return [p for package in PACKAGES for p in (REPO / package).rglob("*") if p.is_file()]


def test_packages_hold_no_compiled_code_and_load_none():
    files = _package_files()
    assert files
    assert sorted(str(p.relative_to(REPO)) for p in files if p.suffix in COMPILED) == []
    loaders = [str(p.relative_to(REPO)) for p in files if p.suffix == ".py"
               and LOADS_OR_BUILDS.search(p.read_text(encoding="utf-8"))]
    assert loaders == []


def test_no_module_forks_or_changes_a_process_wide_setting():
    sources = [p for p in _package_files() if p.suffix == ".py"]
    assert sources
    assert [str(p.relative_to(REPO)) for p in sources
            if FORKS_OR_SETS.search(p.read_text(encoding="utf-8"))] == []


def test_the_patterns_find_what_they_look_for():
    for text in ("import ctypes\n", "from cffi import FFI\n", "lib = ctypes.CDLL(path)\n",
                 'subprocess.run(["cc", "-O2"])\n'):
        assert LOADS_OR_BUILDS.search(text), text
    assert not LOADS_OR_BUILDS.search("# a C kernel once lived here\nx = 'access'\n")
    for text in ("pid = os.fork()\n", 'multiprocessing.get_context("fork")\n',
                 "get_context('forkserver')\n", 'set_start_method("spawn")\n', "gc.freeze()\n",
                 "gc.disable()\n", "sys.setswitchinterval(1)\n",
                 'os.environ["_RJEM_MALLOC_CONF"] = "x"\n'):
        assert FORKS_OR_SETS.search(text), text
    assert not FORKS_OR_SETS.search('get_context("spawn")\nwith torch.random.fork_rng():\n')
