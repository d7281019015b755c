"""The state store's every-cycle reads build their objects in one step (dike_slurm/store/state.py:
`_job_memory`, `owned`): what they read back equals what the dataclass constructors build, for
any remembered job and any owned field (hypothesis); and the owned fields and remembered jobs
kept between reads equal what the file holds (hypothesis)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.domain.fields import JobField, SwitchRequest
from dike_slurm.store.state import JobMemory, OwnedField, StateStore

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


OPERATIONS = st.lists(st.tuples(
    st.sampled_from(["write", "release", "forget", "rolled back", "other process writes", "other process releases"]),
    st.integers(1, 3), st.sampled_from([JobField.SITE_FACTOR, JobField.SWITCHES]), st.integers(0, 3),
), max_size=12)


@settings(max_examples=60, deadline=None)
@given(OPERATIONS)
def test_owned_and_jobs_kept_between_reads_equal_a_fresh_read(operations):
    """owned() and jobs() hand out the map they read last until this store or another connection
    changes the file: after any mix of writes, releases, forgotten jobs, rolled-back transactions
    and another process's writes they equal what the file holds; with nothing changed they are
    not read again."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.sqlite"
        store, other = StateStore(path), StateStore(path)
        store.owned()
        store.jobs()
        for action, job_id, field, value in operations:
            writer = other if action.startswith("other") else store
            try:
                with writer.transaction():
                    if action in ("write", "other process writes", "rolled back"):
                        writer.remember([JobMemory(job_id, float(value))])
                        writer.record_write(job_id, field, value_of(field, value), value_of(field, value + 1), 0.0)
                    elif action in ("release", "other process releases"):
                        writer.release(job_id, [field])
                    else:
                        writer.forget_jobs(float(value))
                    if action == "rolled back":
                        writer.owned()  # read inside the transaction that is then undone
                        writer.jobs()
                        raise RuntimeError
            except RuntimeError:
                pass
            fresh = StateStore(path, read_only=True)
            assert store.owned() == fresh.owned() and store.jobs() == fresh.jobs()
        assert store.owned() is store.owned() and store.jobs() is store.jobs()
        store.close()
        other.close()


def value_of(field: JobField, n: int):
    """A value of the field's type."""
    if field is JobField.SWITCHES:
        return SwitchRequest(n, 60)
    if field in (JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES):
        return tuple(f"n{i}" for i in range(n))
    if field in (JobField.ADMIN_COMMENT, JobField.FEATURES):
        return f"text{n}"
    return n
