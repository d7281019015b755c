"""Pausing Python's cyclic garbage collector around one burst of allocation."""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator

# A block's reference cycles are frozen with the rest of what it leaves, and the collector never
# looks at frozen objects: every this many blocks (an hour of one-minute cycles) the block starts
# with a full collection, so cyclic garbage lives an hour at most instead of forever.
FULL_COLLECTION_EVERY = 60
_blocks = itertools.count(1)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off, then restore it as it was.

    A cycle over 50,000 jobs allocates about a million short-lived objects and no reference
    cycles: reference counting frees them all, while the collector's generation-2 passes over
    the ever-growing heap cost about 40% of the cycle (bench/run_all.py).
    """
    enabled = gc.isenabled()
    gc.disable()
    gc.unfreeze()  # what the previous block froze goes back to the collector (its cycles, if any)
    if next(_blocks) % FULL_COLLECTION_EVERY == 0:
        gc.collect()
    try:
        yield
    finally:
        # What the block made and still holds (the plan: a million objects) would make the first
        # collection afterwards walk all of it (10% of the cycle): freeze it out of the way.
        # Reference counting still frees it; the next block hands it back to the collector.
        gc.freeze()
        if enabled:
            gc.enable()
