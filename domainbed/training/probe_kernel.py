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
import os

import torch

from oodutils import c_kernel

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_kernel.c")
BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
_INT, _PTR = ctypes.c_int64, ctypes.c_void_p
_private = c_kernel.private


def _compile(compiler, flags):
    """The kernel's shared library, compiled into the cache unless it is there already."""
    return c_kernel.compile_source(compiler, SOURCE, flags)


@functools.lru_cache(maxsize=None)
def load():
    """The compiled kernel (ctypes library), or None where it cannot be built or
    DOMAINBED_PROBE_KERNEL=torch asks for torch's operations."""
    if os.environ.get("DOMAINBED_PROBE_KERNEL", "c") == "torch":
        return None
    lib = c_kernel.build(SOURCE, BASE_FLAGS + c_kernel.cpu_flags(), "probe kernel",
                         "linear probes train with torch's operations")
    if lib is None:
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
