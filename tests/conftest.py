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
