"""The state store's every-cycle reads build their objects in one step (dike_slurm/state.py:
`_job_memory`, `owned`): what they read back equals what the dataclass constructors build, for
any remembered job and any owned field (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.backends.base import JobField, SwitchRequest
from dike_slurm.state import JobMemory, OwnedField, StateStore

TEXT = st.text(max_size=20)
MEMORIES = st.builds(
    JobMemory, job_id=st.integers(1, 10**9), last_seen=st.floats(0, 2e9), level=st.one_of(st.none(), st.integers(0, 9)),
    written_level=st.one_of(st.none(), st.integers(0, 9)), attained_gpu_s=st.floats(0, 1e9),
    attained_at_promotion_gpu_s=st.floats(0, 1e9), promotions=st.integers(0, 99), requeues=st.integers(0, 99),
    hands_off=st.lists(st.sampled_from(list(JobField)), unique=True).map(tuple), hands_off_reason=TEXT, reason=TEXT,
)
VALUES = {
    JobField.SITE_FACTOR: st.integers(-10**6, 10**6), JobField.PRIORITY: st.one_of(st.none(), st.integers(0, 2**32)),
    JobField.NICE: st.integers(-10000, 10000), JobField.ADMIN_COMMENT: TEXT, JobField.FEATURES: TEXT,
    JobField.SWITCHES: st.builds(SwitchRequest, st.integers(0, 9), st.one_of(st.none(), st.integers(0, 86400))),
    JobField.EXCLUDED_NODES: st.lists(st.sampled_from(["n1", "n2", "gpu007"]), max_size=3).map(tuple),
    JobField.REQUIRED_NODES: st.lists(st.sampled_from(["n1", "n2"]), max_size=2).map(tuple),
}


@st.composite
def owned_fields(draw) -> list[OwnedField]:
    result = []
    for job_id in draw(st.lists(st.integers(1, 10**6), unique=True, max_size=6)):
        for field in draw(st.lists(st.sampled_from(list(JobField)), unique=True, min_size=1, max_size=4)):
            result.append(OwnedField(job_id, field, draw(VALUES[field]), draw(VALUES[field]), draw(st.floats(0, 2e9))))
    return result


@settings(max_examples=100, deadline=None)
@given(st.lists(MEMORIES, max_size=6, unique_by=lambda m: m.job_id))
def test_remembered_jobs_read_back_equal_to_the_constructor(memories):
    store = StateStore(None)
    store.remember(memories)
    read = store.jobs()
    assert read == {m.job_id: m for m in memories}
    for memory in memories:
        assert type(read[memory.job_id]) is JobMemory and store.job(memory.job_id) == memory
        assert hash(read[memory.job_id]) == hash(memory)


@settings(max_examples=100, deadline=None)
@given(owned_fields())
def test_owned_fields_read_back_equal_to_the_constructor(written):
    store = StateStore(None)
    for owned in written:
        store.record_write(owned.job_id, owned.field, owned.original, owned.written, owned.written_at)
    expected: dict = {}
    for owned in written:
        expected.setdefault(owned.job_id, {})[owned.field] = owned
    read = store.owned()
    assert read == expected
    assert all(type(o) is OwnedField for fields_of in read.values() for o in fields_of.values())
