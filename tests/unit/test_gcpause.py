"""The paused collector: a block's cyclic garbage is collected within FULL_COLLECTION_EVERY blocks."""

from __future__ import annotations

import gc
import weakref

from dike_slurm.cycle.gcpause import FULL_COLLECTION_EVERY, paused_gc


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_cyclic_garbage_left_by_a_block_is_collected_by_a_later_block():
    with paused_gc():
        garbage = weakref.ref(Node())
    assert garbage() is not None  # frozen with what the block left
    gc.collect()
    assert garbage() is not None  # the collector skips frozen objects
    for _ in range(FULL_COLLECTION_EVERY):
        with paused_gc():
            pass
    assert garbage() is None
    gc.unfreeze()


def test_the_block_runs_with_the_collector_off_and_restores_it():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
