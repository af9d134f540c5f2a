"""Python's cyclic garbage collector held off while many container objects that live on
are built (lists of lists, dicts): each few hundred new containers otherwise start a
collection, and the full ones walk every object already alive, again and again (reading
the records index of a 100,000-run sweep spent more time there than in its own work)."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Within it, no automatic collection; the collector's state is restored after (an
    enclosing pause stays in force)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
