"""C sources of this project compiled once per machine with the system's C compiler (`cc`,
or $CC) into `$XDG_CACHE_HOME/oodbed/kernels/` and loaded through ctypes.

A library is keyed by its source, flags and the compiler's version, written whole or not
at all, and loaded only from a folder, and as a file, that no other user can write (else
another user could plant code). Without a compiler, or where the build fails, `build` is
None (with a warning for a failed build) and the caller takes its pure-Python path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile

from oodutils.log import get_logger

LOG = get_logger(__name__)


def cpu_flags() -> list[str]:
    """-mavx2 -mf16c where this x86 CPU has them."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return [f"-m{name}" for name in ("avx2", "f16c") if name in flags]


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "oodbed", "kernels")


def private(path: str) -> bool:
    """Whether `path` is ours, no link, and writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _kernel_dir() -> str:
    """The cache folder when it is private, else a new private temporary folder (with a
    warning where the folder exists but others could write it)."""
    directory = _cache_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:   # (a read-only home): nothing to warn about
        LOG.debug(f"{directory} could not be made ({e.strerror or e}); a compiled kernel "
                  f"is built in a temporary folder")
        return tempfile.mkdtemp(prefix="oodbed-kernel-")
    if private(directory):
        return directory
    LOG.warning(f"warning: {directory} is not private to this user; a compiled kernel is "
                f"built in a temporary folder instead")
    return tempfile.mkdtemp(prefix="oodbed-kernel-")


def compile_source(compiler: str, source: str, flags: list[str]) -> str:
    """The shared library of the C file `source`, compiled into the cache unless it is
    there already."""
    with open(source, "rb") as f:
        text = f.read()
    version = subprocess.run([compiler, "--version"], capture_output=True, timeout=60).stdout
    key = hashlib.sha256(text + " ".join(flags).encode() + version).hexdigest()[:16]
    name = os.path.splitext(os.path.basename(source))[0]
    directory = _kernel_dir()
    target = os.path.join(directory, f"{name}-{key}.so")
    if private(target):
        return target
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        built = os.path.join(tmp, f"{name}.so")
        subprocess.run([compiler, *flags, "-o", built, source, "-lm"], check=True,
                       capture_output=True, timeout=300)
        os.chmod(built, 0o700)
        os.replace(built, target)
    return target


def build(source: str, flags: list[str], what: str, otherwise: str) -> ctypes.CDLL | None:
    """The compiled `source` loaded, or None: no compiler, or a failed build (warned as
    "warning: the {what} was not built (...); {otherwise}")."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    try:
        path = compile_source(compiler, source, flags)
        library = ctypes.CDLL(path)
        if os.path.dirname(path) != _cache_dir():   # a temporary folder: not kept once
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)   # (loaded: mapped)
        return library
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or b""
        detail = detail.decode(errors="replace").strip().splitlines()[:1] or [str(e)]
        LOG.warning(f"warning: the {what} was not built ({detail[0]}); {otherwise}")
        return None
