"""Shared test set-up: a CLI called in-process with -q / -v sets the project's log levels
for the whole process (as it should for a command); put them back after every test so the
next one sees the defaults."""
import contextlib
import os

import pytest

from oodutils import log
from tests.builders import registered

# DomainBed's reference outputs (tests/data/domainbed_golden) were recorded with oneDNN's
# AVX2 convolution kernels; its AVX-512 kernels sum in another order (ARM's predictions move
# by 1.6e-4 after three steps). Every test process uses the AVX2 kernels, so the comparisons
# mean the same on every x86 machine; set before torch creates its first primitive.
os.environ.setdefault("DNNL_MAX_CPU_ISA", "AVX2")


@pytest.fixture(autouse=True)
def _default_log_levels():
    yield
    log.configure(0, warning_lines=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: an end-to-end test that takes over ~20 s "
                                       "(deselect with -m 'not slow')")


@pytest.fixture(autouse=True, scope="session")
def _threads_shared_by_workers():
    """Under pytest-xdist, each worker's torch uses its share of the cores: two workers of
    two threads each on two cores spin against each other (a toy training 1.5 s alone
    took 12 s in the quick loop)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored after: reference outputs (DomainBed's golden
    values) were recorded on one thread, and more threads sum reductions in another order."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def weights_dir(monkeypatch):
    """`weights_dir(path)`: where backbones look for weight files first for this test (the
    --weights_dir of a run; "" for nowhere), the default put back after it."""
    from domainbed.networks import backbones
    default = os.environ.get("DOMAINBED_WEIGHTS_DIR", "")

    def use(path):
        monkeypatch.delenv("DOMAINBED_WEIGHTS_DIR", raising=False)
        backbones.set_weights_dir(str(path))
    yield use
    backbones.set_weights_dir(default if os.path.isdir(default) else "")


@pytest.fixture
def register():
    """`register(registry, name, cls)`: `cls` registered as `name` for this test only."""
    with contextlib.ExitStack() as stack:
        yield lambda registry, name, cls, override=False: stack.enter_context(
            registered(registry, name, cls, override))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the quick loop's exclusions (tests/quick_loop.py) slow, before `-m` selects."""
    from tests.quick_loop import TESTS, WHOLE_FILES
    for item in items:
        path = item.nodeid.split("::")[0]
        if path in WHOLE_FILES or item.nodeid in TESTS or \
                item.nodeid.split("[")[0] in TESTS:
            item.add_marker(pytest.mark.slow)
