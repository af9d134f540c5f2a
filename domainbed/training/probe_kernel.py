"""The arithmetic of linear heads on cached features, one head at a time, in C.

A linear probe's step on cached features is two products with a couple of output
columns per row ((rows, features) by (features, classes) and back), shapes where BLAS
runs at a tenth of its speed, plus gathering the minibatch rows. `probe_kernel.c` does
the whole step of a head (gather, logits, mean cross-entropy, weight and bias gradients)
in one pass over each row, in a fixed order written down there: a head's numbers never
depend on the other heads of a call, on how many there are, or on the thread. Both a
single linear-probe run and a probe stack train through it (`ProbeStack`), so a stacked
head's record equals the run alone by construction.

The C source is compiled once per machine with the system's C compiler (`cc`, or $CC)
into `$XDG_CACHE_HOME/oodbed/kernels/`; without a compiler, or with
DOMAINBED_PROBE_KERNEL=torch, `load()` is None and both paths use torch's operations
instead (the same choice for a single run and a stack in one process).
"""
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile

import torch

from oodutils.log import get_logger

LOG = get_logger(__name__)
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_kernel.c")
BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
_INT, _PTR = ctypes.c_int64, ctypes.c_void_p


def _cpu_flags():
    """-mavx2 -mf16c where this x86 CPU has them (the numbers are the same without)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return []
    return [f"-m{name}" for name in ("avx2", "f16c") if name in flags]


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "oodbed", "kernels")


def _private(path):
    """Whether `path` is ours, no link, and writable by no one else: a library we load,
    and the folder it sits in, must be (another user could otherwise plant code)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _kernel_dir():
    """The cache folder when it is private, else a new private temporary folder."""
    directory = _cache_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        pass
    if _private(directory):
        return directory
    LOG.warning(f"warning: {directory} is not private to this user; the probe kernel is "
                f"built in a temporary folder instead")
    return tempfile.mkdtemp(prefix="oodbed-kernel-")


def _compile(compiler, flags):
    """The shared library's path, compiled into the cache unless it is there already
    (keyed by the source, the flags and the compiler's version; written whole or not)."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    version = subprocess.run([compiler, "--version"], capture_output=True, timeout=60).stdout
    key = hashlib.sha256(source + " ".join(flags).encode() + version).hexdigest()[:16]
    directory = _kernel_dir()
    target = os.path.join(directory, f"probe_kernel-{key}.so")
    if _private(target):
        return target
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        built = os.path.join(tmp, "probe_kernel.so")
        subprocess.run([compiler, *flags, "-o", built, SOURCE, "-lm"], check=True,
                       capture_output=True, timeout=300)
        os.chmod(built, 0o700)
        os.replace(built, target)
    return target


@functools.lru_cache(maxsize=None)
def load():
    """The compiled kernel (ctypes library), or None where it cannot be built or
    DOMAINBED_PROBE_KERNEL=torch asks for torch's operations."""
    if os.environ.get("DOMAINBED_PROBE_KERNEL", "c") == "torch":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    try:
        lib = ctypes.CDLL(_compile(compiler, BASE_FLAGS + _cpu_flags()))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or b""
        detail = detail.decode(errors="replace").strip().splitlines()[:1] or [str(e)]
        LOG.warning(f"warning: the probe kernel was not built ({detail[0]}); linear probes "
                    f"train with torch's operations")
        return None
    lib.probe_gradients.argtypes = [_INT] * 4 + [_PTR, ctypes.c_int] + [_PTR] * 7
    lib.probe_train.argtypes = [_INT] * 4 + [_PTR, ctypes.c_int] + [_PTR] * 12 + \
        [ctypes.c_float] * 3
    lib.probe_logits.argtypes = [_INT] * 4 + [_PTR, ctypes.c_int] + [_PTR] * 3
    return lib


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


def _rows(table, rows, labels):
    """The table (float16 or float32), rows and labels (int64) as the kernel reads them:
    contiguous, held by the caller for the call."""
    if table.dtype not in (torch.float16, torch.float32):
        table = table.float()
    return (table.contiguous(), rows.to(torch.int64).contiguous(),
            labels.to(torch.int64).contiguous())


def _check(status):
    if status == -1:
        raise ValueError("a label is out of the heads' class range")
    if status != 0:
        raise MemoryError("the probe kernel could not allocate its scratch row")


def gradients(lib, table, rows, labels, weight, bias):
    """Loss [K], weight gradient [K, C, F] and bias gradient [K, 1, C] of K heads (weight
    [K, C, F], bias [K, 1, C], float32) on their rows [K, R] of `table` [N, F] (float16
    or float32) with labels [K, R]: the mean cross-entropy's, as autograd defines it."""
    K, C, F = weight.shape
    loss = torch.empty(K)
    grad_weight, grad_bias = torch.empty(K, C, F), torch.empty(K, 1, C)
    # contiguous copies held here: the pointers must outlive the call
    table, rows, labels = _rows(table, rows, labels)
    weight, bias = weight.float().contiguous(), bias.float().contiguous()
    _check(lib.probe_gradients(K, rows.shape[1], F, C, _ptr(table),
                               table.dtype == torch.float16, _ptr(rows), _ptr(labels),
                               _ptr(weight), _ptr(bias), _ptr(loss), _ptr(grad_weight),
                               _ptr(grad_bias)))
    return loss, grad_weight, grad_bias


def train(lib, table, rows, labels, params, moments, factors, betas, eps):
    """One Adam step of K heads in place: `params` (weight [K, C, F], bias [K, 1, C]) and
    `moments` ({"weight": [exp_avg, exp_avg_sq], "bias": [...]}, the same shapes), all
    contiguous float32; `factors`: each head's weight decay, step size (-lr / (1 -
    beta1^t)) and sqrt(1 - beta2^t), float32 [K] each. Returns each head's loss [K]."""
    weight, bias = params
    for tensor in (weight, bias, *moments["weight"], *moments["bias"], *factors):
        if not tensor.is_contiguous() or tensor.dtype != torch.float32:
            raise ValueError("the probe kernel updates contiguous float32 tensors in place")
    K, C, F = weight.shape
    loss = torch.empty(K)
    table, rows, labels = _rows(table, rows, labels)
    _check(lib.probe_train(K, rows.shape[1], F, C, _ptr(table), table.dtype == torch.float16,
                           _ptr(rows), _ptr(labels), _ptr(weight), _ptr(bias), _ptr(loss),
                           *map(_ptr, moments["weight"] + moments["bias"]),
                           *map(_ptr, factors), *betas, eps))
    return loss


def logits(lib, x, weight, bias):
    """Logits [K, N, C] of K heads on rows x [N, F] (float16 or float32): each head's as
    the training step computes them."""
    K, C, F = weight.shape
    x = x.contiguous() if x.dtype in (torch.float16, torch.float32) else x.float().contiguous()
    weight, bias = weight.contiguous(), bias.contiguous()
    out = torch.empty(K, len(x), C)
    _check(lib.probe_logits(K, len(x), F, C, _ptr(x), x.dtype == torch.float16,
                            _ptr(weight), _ptr(bias), _ptr(out)))
    return out
