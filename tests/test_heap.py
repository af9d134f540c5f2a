"""oodutils.heap: a process that asked glibc to keep its freed memory keeps a freed
block resident for its next allocation; one that did not hands it back. One that asked
numpy for small pages has numpy's huge-page advice off."""
import os
import platform
import subprocess
import sys

import pytest

from oodutils.heap import keep_freed_memory, tune_for_tables

_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

_FREE_A_BLOCK = """
import sys
from oodutils.heap import keep_freed_memory
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resident()
block = bytearray(16 << 20)     # (zeroed: every page touched)
del block
print(resident() - before)
"""


def _resident_after_free(mode):
    done = subprocess.run([sys.executable, "-c", _FREE_A_BLOCK, mode], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt (Linux)")
def test_a_freed_block_stays_resident_only_where_asked():
    assert _resident_after_free("keep") >= 15 << 20
    assert _resident_after_free("give back") < 1 << 20


def test_asking_is_harmless_anywhere():
    assert keep_freed_memory() in (True, False)


_ADVICE = """
import sys
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    from numpy.core.multiarray import _set_madvise_hugepage
from oodutils.heap import tune_for_tables
if sys.argv[1] == "tune":
    tune_for_tables()
print(_set_madvise_hugepage(False))   # (the setting it had)
"""


def test_tuned_processes_have_numpys_huge_page_advice_off():
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    def advice(mode):
        return subprocess.run([sys.executable, "-c", _ADVICE, mode], capture_output=True,
                              text=True, check=True, env=env).stdout.strip()
    assert advice("tune") == "False"
    assert advice("as is") in ("True", "False")    # (True on Linux 4.6 and later)
    tune_for_tables()    # harmless here too
