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


def test_a_job_that_never_really_ran_is_learned_by_its_users_groups_only_and_is_no_ones_evidence():
    """The replay's finished jobs follow the engine's rule (usage.finished_jobs): a job cancelled
    after 78 s is learned by its user's groups and counts toward no one's evidence (min_history_jobs);
    its service is in the finished jobs' service, as every finished job's (usage.completed_service)."""
    from dike_slurm.domain.service_prior import PriorLearner
    from dike_slurm.sim.kernel.trace import TraceJob

    def trace(job_id: int, state: str) -> TraceJob:
        return TraceJob(job_id=job_id, display_id=str(job_id), user="alice", account="a", partition="gpu", qos="normal",
                        name="train.sh", comment="", submit=0.0, eligible_delay_s=0.0, duration_s=78.0,
                        time_limit_s=None, gpus=2, num_nodes=1, cpus=1, final_state=state)

    finished = history.FinishedService(86400.0, True, PriorLearner())
    finished.add(100.0, trace(1, "CANCELLED"), 156.0)
    finished.add(100.0, trace(2, "COMPLETED"), 156.0)
    assert list(finished.service.view()) == [156.0, 156.0] and (finished.prior.jobs, finished.prior.not_run) == (1, 1)
    assert finished.prior.view().predict("alice", "train.sh", 2, 10.0).count == 2  # its user's group learns both
    finished.forget(86400.0 + 101.0)
    assert list(finished.service.view()) == [] and (finished.prior.jobs, finished.prior.not_run) == (0, 0)
