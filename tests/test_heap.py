"""oodutils.heap: a process that asked glibc to keep its freed memory keeps a freed
block resident for its next allocation; one that did not hands it back."""
import platform
import subprocess
import sys

import pytest

from oodutils.heap import keep_freed_memory

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
