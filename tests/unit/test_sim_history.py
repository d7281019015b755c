"""The simulator's sorted history of finished jobs' service behaves as a plain sorted list."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.sim.kernel import history
from dike_slurm.sim.kernel.history import SortedBlocks

_values = st.floats(0, 1e6, allow_nan=False) | st.sampled_from([0.0, 1.0, 3600.0])  # with many duplicates


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _values), max_size=400), st.sampled_from([2, 8, 16, 512]),
       st.lists(_values, max_size=5))
def test_sorted_blocks_match_a_sorted_list_and_views_never_change(operations, block, probes):
    saved = history.BLOCK
    history.BLOCK = block  # small blocks: splits and merges on every few operations
    try:
        blocks, plain, views = SortedBlocks(), [], []
        for add, value in operations:
            if add or not plain:
                blocks.add(value)
                bisect.insort(plain, value)
            else:
                victim = plain[int(value) % len(plain)]
                blocks.remove(victim)
                plain.remove(victim)
            view = blocks.view()
            assert list(view) == plain and len(view) == len(plain) and view == tuple(plain)
            assert [view[i] for i in range(len(plain))] == plain
            if plain:
                assert view[-1] == plain[-1] and view[1:3] == tuple(plain[1:3])
            # the count a policy asks for, against bisect on the plain list: at every value held,
            # just beside it, and elsewhere
            for probe in (*plain, *(v + 0.5 for v in plain[:3]), *(v - 0.5 for v in plain[-3:]), *probes, -1.0, 2e6):
                assert view.count_at_most(probe) == bisect.bisect_right(plain, probe)
            views.append((view, tuple(plain)))
        assert all(view == frozen for view, frozen in views)  # later changes never show in a view
    finally:
        history.BLOCK = saved


def test_removing_a_value_that_is_not_there_is_an_error_and_changes_nothing():
    blocks = SortedBlocks()
    for value in (5.0, 1.0, 3.0):
        blocks.add(value)
    with pytest.raises(ValueError, match="2.0 is not in the history"):
        blocks.remove(2.0)
    with pytest.raises(ValueError, match="9.0 is not in the history"):
        blocks.remove(9.0)
    assert blocks.view() == (1.0, 3.0, 5.0)
    with pytest.raises(IndexError):
        blocks.view()[3]


def test_a_snapshot_holds_any_sequence_of_finished_service_sorted_and_counts_it_like_bisect():
    from dike_slurm.domain.model import AscendingTuple, Snapshot

    snapshot = Snapshot(time=0.0, jobs=(), nodes=(), completed_service_gpu_s=[5.0, 1.0, 3.0, 3.0])
    held = snapshot.completed_service_gpu_s
    assert isinstance(held, AscendingTuple) and held == (1.0, 3.0, 3.0, 5.0)
    assert [held.count_at_most(v) for v in (0.0, 1.0, 2.0, 3.0, 5.0, 6.0)] == [0, 1, 1, 3, 4, 4]
    view = SortedBlocks().view()
    assert Snapshot(time=0.0, jobs=(), nodes=(), completed_service_gpu_s=view).completed_service_gpu_s is view
