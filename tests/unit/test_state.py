"""The SQLite state store: survives reopening, keeps first originals, transactions, locking."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import in_process

from dike_slurm.store.audit_export import audit_json_line
from dike_slurm.domain.fields import JobField, SwitchRequest
from dike_slurm.store.lock import exclusive_lock
from dike_slurm.store.state import (
    AuditEntry,
    CycleSummary,
    JobMemory,
    Pruned,
    StateError,
    StateStore,
    decode_value,
    encode_value,
)
from dike_slurm.slurm.usage import Run
from dike_slurm.domain.model import JobState


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


# ---------------------------------------------------------------- retention


def audited(store: StateStore, times: list[float]) -> list[int]:
    with store.transaction():
        return [store.audit(AuditEntry(at, 1, 7, "update", f"change at {at:g}", "cmd", "undo", True)) for at in times]


def exported_ids(path) -> list[int]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_old_audit_rows_go_oldest_first_a_bounded_number_at_a_time(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    ids = audited(store, [float(t) for t in range(1, 11)])
    first = store.prune_audit(before=8.0, limit=3)
    assert (first.deleted, first.more, first.exported) == (3, True, 0)
    assert [e.at for e in store.audit_log()] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert store.prune_audit(8.0, 3).more is True
    last = store.prune_audit(8.0, 3)
    assert (last.deleted, last.more) == (1, False)
    assert [e.id for e in store.audit_log()] == ids[7:]
    assert store.prune_audit(8.0, 3).deleted == 0


def test_exported_rows_are_in_the_file_before_they_leave_the_store(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    ids = audited(store, [1.0, 2.0, 3.0, 50.0])
    export = tmp_path / "export" / "audit.jsonl"
    pruned = store.prune_audit(10.0, 2, export)
    assert (pruned.deleted, pruned.exported, pruned.more) == (2, 2, True)
    assert store.prune_audit(10.0, 2, export).exported == 1
    assert exported_ids(export) == ids[:3]
    line = json.loads(export.read_text().splitlines()[0])
    assert line == {"id": ids[0], "at": 1.0, "time": "1970-01-01T00:00:01Z", "cycle": 1, "job_id": 7, "user": "",
                    "action": "update", "change": "change at 1", "command": "cmd", "undo": "undo", "ok": True,
                    "message": "", "reason": ""}
    assert [e.id for e in store.audit_log()] == ids[3:]


def test_an_export_whose_delete_did_not_commit_is_written_once_not_twice(tmp_path):
    """A crash (here: the delete fails) after the rows reached the file and before the delete
    committed: the next pass cuts the uncommitted lines off and exports them again, once."""
    store = StateStore(tmp_path / "s.sqlite")
    ids = audited(store, [1.0, 2.0, 3.0, 4.0])
    export = tmp_path / "audit.jsonl"
    store.prune_audit(10.0, 1, export)
    store._db.execute("CREATE TEMP TRIGGER crash BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'crash'); END")
    with pytest.raises(sqlite3.Error, match="crash"):
        store.prune_audit(10.0, 2, export)
    assert exported_ids(export) == ids[:3] and len(store.audit_log()) == 3  # in the file, still in the store
    store._db.execute("DROP TRIGGER crash")
    assert store.prune_audit(10.0, 5, export).deleted == 3
    assert exported_ids(export) == ids and store.audit_log() == []


def test_an_export_that_cannot_be_written_deletes_nothing(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    audited(store, [1.0, 2.0])
    with pytest.raises(OSError, match=r"cannot write audit export /dev/full: No space left on device"):
        store.prune_audit(10.0, 5, Path("/dev/full"))
    with pytest.raises(OSError, match="cannot open audit export"):
        store.prune_audit(10.0, 5, tmp_path)  # a folder
    assert len(store.audit_log()) == 2


def test_a_moved_away_export_file_is_started_again(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    ids = audited(store, [1.0, 2.0, 3.0])
    export = tmp_path / "audit.jsonl"
    store.prune_audit(10.0, 2, export)
    export.rename(tmp_path / "audit.jsonl.1")  # rotated by the site
    store.prune_audit(10.0, 2, export)
    assert exported_ids(tmp_path / "audit.jsonl.1") == ids[:2] and exported_ids(export) == ids[2:]


def test_old_cycle_rows_go_and_cycle_numbers_are_never_reused(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    with store.transaction():
        for started in (1.0, 2.0, 3.0):
            store.record_cycle(CycleSummary(started, 0.1, "dike", True, 1, 1, 0, 0, 3))
    assert store.prune_cycles(before=10.0, limit=2) == Pruned("cycles", 2, True)
    assert store.prune_cycles(before=10.0, limit=2) == Pruned("cycles", 1, False)
    assert store.cycles() == [] and store.next_cycle() == 4


def test_optimize_runs_once_per_period_and_vacuums_a_mostly_free_file(tmp_path):
    path = tmp_path / "s.sqlite"
    store = StateStore(path)
    audited(store, [1.0] * 3000)
    assert store.optimize(now=100.0, every_s=50.0) == "optimize"
    assert store.optimize(now=120.0, every_s=50.0) == ""  # not due yet
    store.prune_audit(10.0, 3000)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    done = store.optimize(now=150.0, every_s=50.0)
    assert done.startswith("optimize, vacuum (")
    assert store._db.execute("PRAGMA page_count").fetchone()[0] < pages / 2
    assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert Path(f"{path}-wal").stat().st_size == 0  # checkpointed and truncated


def test_the_audit_export_command_writes_the_whole_audit_as_json_lines(tmp_path):
    state = tmp_path / "s.sqlite"
    store = StateStore(state)
    ids = audited(store, [float(t) for t in range(1, 301)])
    store.close()
    config = tmp_path / "dike.toml"
    config.write_text(f'[engine]\nstate_db = "{state}"\n')
    out = tmp_path / "all.jsonl"
    result = in_process.dike_slurm("audit", "--config", str(config), "--export", str(out))
    assert result.returncode == 0, result.stderr
    assert exported_ids(out) == ids  # all 300, past the listing's default limit of 200
    assert f"300 audit row(s) written to {out}" in result.stdout
    since = in_process.dike_slurm("audit", "--config", str(config), "--export", str(out), "--since",
                                  "1970-01-01T00:04:00")
    assert since.returncode == 0 and exported_ids(out) == ids[239:]
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_exported_line_is_one_ascii_line_whatever_the_text(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    hostile = "a\nb\r\x1b[31m\x00 é \u2028 $(rm -rf /)"
    with store.transaction():
        store.audit(AuditEntry(1.0, 1, 7, "update", hostile, "cmd", "undo", False, hostile, hostile))
    export = tmp_path / "audit.jsonl"
    store.prune_audit(10.0, 5, export)
    data = export.read_bytes()
    assert data.isascii() and data.count(b"\n") == 1 and data.endswith(b"\n")
    assert json.loads(data)["reason"] == hostile
    surrogate = audit_json_line(AuditEntry(1.0, 1, 7, "update", "\ud800", "cmd", "undo", True))
    assert surrogate.isascii() and json.loads(surrogate)["change"] == "\ud800"


def test_a_schema_1_state_file_gains_the_runs_job_name_weight_and_state_and_the_audits_user(tmp_path):
    """A state file from before the service prior (schema 1: runs without the job's name, an audit
    without its user) is read as it is, read-only, and migrated in place by a writer; nothing it
    held is lost."""
    path = tmp_path / "state.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema', '1');"
        "CREATE TABLE runs (job_id INTEGER NOT NULL, start REAL NOT NULL, end REAL NOT NULL, gpus INTEGER NOT NULL,"
        " user TEXT NOT NULL, account TEXT NOT NULL, final INTEGER NOT NULL, PRIMARY KEY (job_id, start));"
        "INSERT INTO runs VALUES (5, 100.0, 700.0, 8, 'alice', 'research', 1);"
        "CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, cycle INTEGER NOT NULL,"
        " job_id INTEGER NOT NULL, action TEXT NOT NULL, change TEXT NOT NULL, command TEXT NOT NULL,"
        " undo TEXT NOT NULL, ok INTEGER NOT NULL, message TEXT NOT NULL, reason TEXT NOT NULL);"
        "INSERT INTO audit VALUES (1, 50.0, 1, 5, 'update', 'SiteFactor 0 -> 9', 'cmd', 'undo', 1, '', 'why');"
    )
    db.commit()
    db.close()
    assert StateStore(path, read_only=True).runs() == [Run(5, "alice", "research", 8, 100.0, 700.0, True)]
    old_row = AuditEntry(50.0, 1, 5, "update", "SiteFactor 0 -> 9", "cmd", "undo", True, "", "why", 1)
    assert StateStore(path, read_only=True).audit_log() == [old_row]  # user "": unknown
    store = StateStore(path)
    store.add_runs([Run(6, "bob", "x", 1, 0.0, 10.0, True, "train.sh", 2.0, JobState.CANCELLED)])
    # the old run weighs 1 (schema 4's runs.weight, its TRESBillingWeights, added in place) and is
    # taken as completed (schema 5's runs.state); the new one keeps how it ended
    assert store.runs() == [Run(5, "alice", "research", 8, 100.0, 700.0, True, "", 1.0, JobState.COMPLETED),
                            Run(6, "bob", "x", 1, 0.0, 10.0, True, "train.sh", 2.0, JobState.CANCELLED)]
    schema = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    assert schema == "5"
    store.audit(AuditEntry(60.0, 2, 6, "update", "SiteFactor 0 -> 8", "cmd", "undo", True, user="bob"))
    store._db.commit()
    assert [(e.job_id, e.user) for e in StateStore(path, read_only=True).audit_log()] == [(5, ""), (6, "bob")]


def test_a_new_state_file_is_private_to_its_user_or_readable_by_the_group_named(tmp_path):
    """Issue 30: the store holds every user's levels and reasons; whatever the umask, a new file is
    0600, or 0640 owned by engine.state_group; SQLite's -wal and -shm follow the file's mode."""
    import grp
    import stat

    old = os.umask(0o022)
    try:
        store = StateStore(tmp_path / "private.sqlite")
        store.audit(AuditEntry(1.0, 1, 7, "update", "x", "cmd", "undo", True))
        store._db.commit()
        for name in ("private.sqlite", "private.sqlite-wal", "private.sqlite-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        group = grp.getgrgid(os.getgid()).gr_name
        StateStore(tmp_path / "shared.sqlite", group=group)
        shared = (tmp_path / "shared.sqlite").stat()
        assert stat.S_IMODE(shared.st_mode) == 0o640 and shared.st_gid == os.getgid()
        (tmp_path / "kept.sqlite").write_bytes(b"")
        (tmp_path / "kept.sqlite").chmod(0o644)
        StateStore(tmp_path / "kept.sqlite")  # an existing file is the admin's: left as it is
        assert stat.S_IMODE((tmp_path / "kept.sqlite").stat().st_mode) == 0o644
    finally:
        os.umask(old)
    with pytest.raises(StateError, match="engine.state_group 'no-such-group-xyz' is not a group"):
        StateStore(tmp_path / "other.sqlite", group="no-such-group-xyz")
