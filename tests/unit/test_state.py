"""The SQLite state store: survives reopening, keeps first originals, transactions, locking."""

from __future__ import annotations

import sqlite3

import pytest

from dike_slurm.backends.base import JobField, SwitchRequest
from dike_slurm.state import (
    AuditEntry,
    CycleSummary,
    JobMemory,
    StateError,
    StateStore,
    decode_value,
    encode_value,
    exclusive_lock,
)
from dike_slurm.usage import Run


def test_everything_survives_a_restart(tmp_path):
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    with store.transaction():
        store.add_runs([Run(5, "alice", "research", 8, 100.0, 700.0, False), Run(6, "bob", "x", 1, 0.0, None, False)])
        store.set_last_sync(1234.5)
        remembered = JobMemory(5, 800.0, level=1, written_level=1, attained_gpu_s=4800.0,
                               attained_at_promotion_gpu_s=100.0, promotions=1, requeues=2,
                               hands_off=(JobField.FEATURES, JobField.SWITCHES), hands_off_reason="user",
                               reason="level 1: attained 1.3 GPU-h")
        store.remember([remembered])
        store.record_write(5, JobField.SITE_FACTOR, 0, 500, 800.0)
        store.audit(AuditEntry(800.0, 1, 5, "update", "SiteFactor 0 -> 500", "scontrol update JobId=5 SiteFactor=500",
                               "scontrol update JobId=5 SiteFactor=0", True))
        store.record_cycle(CycleSummary(800.0, 0.3, "dike", True, 1, 1, 1, 0, 7))
    store.close()
    again = StateStore(path)
    assert again.runs() == [Run(5, "alice", "research", 8, 100.0, 700.0, False)]  # running runs are not stored
    assert again.last_sync() == 1234.5
    assert again.job(5) == remembered and again.jobs() == {5: remembered}  # every field, in its place
    assert again.owned()[5][JobField.SITE_FACTOR].written == 500
    assert again.audit_log(5)[0].undo == "scontrol update JobId=5 SiteFactor=0"
    assert again.cycles()[0].slurm_calls == 7 and again.next_cycle() == 2


def test_the_original_is_the_value_before_the_first_write(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    store.record_write(5, JobField.FEATURES, "", "leaf_s1", 1.0)
    store.record_write(5, JobField.FEATURES, "leaf_s1", "leaf_s2", 2.0)
    owned = store.owned()[5][JobField.FEATURES]
    assert (owned.original, owned.written, owned.written_at) == ("", "leaf_s2", 2.0)
    store.release(5, [JobField.FEATURES])
    assert store.owned() == {}


def test_a_failed_transaction_leaves_nothing(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.record_write(5, JobField.NICE, 0, 10, 1.0)
            raise RuntimeError("crash between the write and its audit")
    assert store.owned() == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [(JobField.SITE_FACTOR, 5), (JobField.PRIORITY, None), (JobField.ADMIN_COMMENT, "dike:level=1 x"),
     (JobField.SWITCHES, SwitchRequest(1, 300)), (JobField.SWITCHES, SwitchRequest(0)),
     (JobField.EXCLUDED_NODES, ("n1", "n2")), (JobField.FEATURES, "")],
)
def test_values_round_trip(field, value):
    assert decode_value(field, encode_value(value)) == value


def test_pruning_keeps_active_jobs_and_the_window(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    store.add_runs([Run(1, "a", "x", 1, 0.0, 10.0, True), Run(2, "a", "x", 1, 0.0, 10.0, False),
                    Run(3, "a", "x", 1, 0.0, 500.0, True)])
    assert store.prune_runs(100.0, keep_jobs=[2]) == 1
    assert [r.job_id for r in store.runs()] == [2, 3]


def test_forgetting_old_jobs_drops_their_owned_fields_not_the_audit(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    store.remember([JobMemory(1, 10.0), JobMemory(2, 1000.0)])
    store.record_write(1, JobField.SITE_FACTOR, 0, 5, 10.0)
    store.audit(AuditEntry(10.0, 1, 1, "update", "c", "cmd", "undo", True))
    assert store.forget_jobs(500.0) == 1
    assert set(store.jobs()) == {2} and store.owned() == {} and len(store.audit_log(1)) == 1


def test_read_only_on_a_missing_file_is_empty_and_creates_nothing(tmp_path):
    path = tmp_path / "none.sqlite"
    store = StateStore(path, read_only=True)
    assert store.jobs() == {} and store.last_sync() is None
    assert not path.exists()


def test_read_only_cannot_write(tmp_path):
    path = tmp_path / "s.sqlite"
    StateStore(path).close()
    store = StateStore(path, read_only=True)
    with pytest.raises(sqlite3.OperationalError):
        store.set_last_sync(1.0)


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    store = StateStore(path)
    store._db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    store._db.commit()
    with pytest.raises(StateError, match="schema 99"):
        StateStore(path)


def test_a_file_that_is_not_sqlite_is_a_clear_error(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_text("not a database at all" * 100)
    with pytest.raises(StateError, match="not a database"):
        StateStore(path)


def test_the_lock_refuses_a_second_engine(tmp_path):
    lock = tmp_path / "state.lock"
    with exclusive_lock(lock):
        with pytest.raises(StateError, match="another dike-slurm engine"):
            with exclusive_lock(lock):
                pass
    with exclusive_lock(lock):
        pass
