"""Shared test set-up: a CLI called in-process with -q / -v sets the project's log levels
for the whole process (as it should for a command); put them back after every test so the
next one sees the defaults."""
import pytest

from oodutils import log


@pytest.fixture(autouse=True)
def _default_log_levels():
    yield
    log.configure(0, warning_lines=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: an end-to-end test that takes over ~20 s "
                                       "(deselect with -m 'not slow')")


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored after: reference outputs (DomainBed's golden
    values) were recorded on one thread, and more threads sum reductions in another order."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the quick loop's exclusions (tests/quick_loop.py) slow, before `-m` selects."""
    from tests.quick_loop import TESTS, WHOLE_FILES
    for item in items:
        path = item.nodeid.split("::")[0]
        if path in WHOLE_FILES or item.nodeid in TESTS or \
                item.nodeid.split("[")[0] in TESTS:
            item.add_marker(pytest.mark.slow)
