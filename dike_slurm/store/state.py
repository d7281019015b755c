"""What the engine must remember and Slurm forgets, in one SQLite file (stdlib sqlite3).

Earlier runs of requeued jobs, each job's level and promotions, every field the engine wrote
with the value it replaced, and an audit log with the exact undo command. Each engine write
and its audit row are committed in one transaction, so a crash never leaves a change without
its record; the file survives restarts.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from dike_slurm.domain.fields import FieldValue, JobField, SwitchRequest
from dike_slurm.store.audit_export import append_audit_lines
from dike_slurm.errors import StateError
from dike_slurm.domain.freed_rooms import GONE, LANDED, WASTED, FreedRoom
from dike_slurm.domain.model import JobState
from dike_slurm.frozen import frozen_record
from dike_slurm.store.records import AuditEntry, CycleSummary, JobMemory, OwnedField, Pruned, SiteSpan
from dike_slurm.slurm.usage import Run

# 2: runs.name (the service prior's groups); 3: audit.user; 4: runs.weight (TRESBillingWeights);
# 5: runs.state (how a run ended: the prior skips jobs that never really ran)
SCHEMA_VERSION = 5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    job_id INTEGER NOT NULL, start REAL NOT NULL, end REAL NOT NULL, gpus INTEGER NOT NULL,
    user TEXT NOT NULL, account TEXT NOT NULL, final INTEGER NOT NULL, name TEXT NOT NULL DEFAULT '',
    weight REAL NOT NULL DEFAULT 1.0, state TEXT NOT NULL DEFAULT 'COMPLETED', PRIMARY KEY (job_id, start));
CREATE TABLE IF NOT EXISTS jobs (
    job_id INTEGER PRIMARY KEY, level INTEGER, written_level INTEGER,
    attained_gpu_s REAL NOT NULL DEFAULT 0, attained_at_promotion_gpu_s REAL NOT NULL DEFAULT 0,
    promotions INTEGER NOT NULL DEFAULT 0, requeues INTEGER NOT NULL DEFAULT 0,
    hands_off TEXT NOT NULL DEFAULT '', hands_off_reason TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '', last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owned (
    job_id INTEGER NOT NULL, field TEXT NOT NULL, original TEXT NOT NULL, written TEXT NOT NULL,
    written_at REAL NOT NULL, PRIMARY KEY (job_id, field));
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, cycle INTEGER NOT NULL,
    job_id INTEGER NOT NULL, action TEXT NOT NULL, change TEXT NOT NULL, command TEXT NOT NULL,
    undo TEXT NOT NULL, ok INTEGER NOT NULL, message TEXT NOT NULL, reason TEXT NOT NULL,
    user TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS audit_job ON audit (job_id);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at);
CREATE TABLE IF NOT EXISTS cycles (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started REAL NOT NULL, seconds REAL NOT NULL,
    policy TEXT NOT NULL, applied INTEGER NOT NULL, jobs INTEGER NOT NULL, managed INTEGER NOT NULL,
    writes INTEGER NOT NULL, errors INTEGER NOT NULL, slurm_calls INTEGER NOT NULL, note TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS cycles_started ON cycles (started);
CREATE TABLE IF NOT EXISTS freed_rooms (
    job_id INTEGER PRIMARY KEY, nodes TEXT NOT NULL, victims TEXT NOT NULL, requeued_at REAL NOT NULL,
    cycles_since_end INTEGER NOT NULL);
"""


def encode_value(value: FieldValue) -> str:
    """A field value as JSON text (SwitchRequest as {"count", "wait_s"})."""
    if isinstance(value, SwitchRequest):
        return json.dumps({"count": value.count, "wait_s": value.wait_s})
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return json.dumps(value)


def decode_value(field: JobField, text: str) -> FieldValue:
    """The inverse of encode_value for this field's type."""
    if field in _INTEGER_FIELDS and text != "null":
        return int(text)  # what json.dumps wrote for an int; read for every owned field every cycle
    if field in _REPEATING_FIELDS:
        return _decode_repeating(field, text)
    return _decode_json(field, text)


def _decode_json(field: JobField, text: str) -> FieldValue:
    data = json.loads(text)
    if field is JobField.SWITCHES:
        return SwitchRequest(int(data["count"]), data["wait_s"])
    if field in (JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES):
        return tuple(str(n) for n in data)
    if field in (JobField.ADMIN_COMMENT, JobField.FEATURES):
        return str(data)
    return None if data is None else int(data)


# A few distinct Switches and constraint texts repeat across thousands of jobs; an admin comment
# (its attained GPU-hours) and a node list are one job's own, so a cache of them would only fill
# up over months of service (bench/soak.py).
_decode_repeating = functools.lru_cache(maxsize=1024)(_decode_json)
_REPEATING_FIELDS = frozenset({JobField.SWITCHES, JobField.FEATURES})
_INTEGER_FIELDS = frozenset({JobField.SITE_FACTOR, JobField.PRIORITY, JobField.NICE})
_FIELD_BY_NAME = {f.value: f for f in JobField}


def _create_private(path: Path, group: str | None) -> None:
    """Create an empty state file readable by its owner only, or also by `group`: it holds every
    user's levels and reasons, which Slurm's PrivateData may hide from other users. SQLite gives
    its -wal and -shm files the database file's mode. An existing file is left as it is."""
    import grp

    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise StateError(f"engine.state_group {group!r} is not a group on this host") from None
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        if gid != -1:
            os.fchown(descriptor, -1, gid)
            os.fchmod(descriptor, 0o640)
        else:
            os.fchmod(descriptor, 0o600)  # whatever the umask
    finally:
        os.close(descriptor)


class StateStore:
    """The engine's SQLite file; `None` path or a missing file opened read-only: empty, in memory."""

    def __init__(self, path: Path | None, *, read_only: bool = False, group: str | None = None) -> None:
        """`group`: the group that may read a file this store creates (0640); None: only its owner (0600)."""
        self.path = path
        self.read_only = read_only
        try:
            if path is None or (read_only and not path.exists()):
                self._db = sqlite3.connect(":memory:")
            elif read_only:
                self._db = sqlite3.connect(_read_only_uri(path), uri=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                _create_private(path, group)
                self._db = sqlite3.connect(path, timeout=30)
                self._db.execute("PRAGMA journal_mode=WAL")
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open state file {path}: {exc}") from None
        self._db.row_factory = sqlite3.Row
        self._owned_changes = 0  # changes this store made to the owned table (see owned())
        self._jobs_changes = 0  # changes this store made to the jobs table (see jobs())
        self._kept: dict[str, tuple[tuple[int, int], Any]] = {}  # table -> (version, map): see _kept_read
        self._prepare()

    def _prepare(self) -> None:
        try:
            version = self._meta("schema")
            if version is not None and int(version) > SCHEMA_VERSION:
                raise StateError(
                    f"state file {self.path} has schema {version}; this dike-slurm knows {SCHEMA_VERSION}"
                )
            if self.read_only and self.path is not None and self.path.exists():
                return
            with self._db:
                self._db.executescript(_SCHEMA)
                columns = {row["name"] for row in self._db.execute("PRAGMA table_info(runs)")}
                if "name" not in columns:  # a schema-1 file
                    self._db.execute("ALTER TABLE runs ADD COLUMN name TEXT NOT NULL DEFAULT ''")
                if "weight" not in columns:  # schema 1-3: every run weighed 1
                    self._db.execute("ALTER TABLE runs ADD COLUMN weight REAL NOT NULL DEFAULT 1.0")
                if "state" not in columns:  # schema 1-4: how a run ended was not kept; taken as completed
                    self._db.execute("ALTER TABLE runs ADD COLUMN state TEXT NOT NULL DEFAULT 'COMPLETED'")
                if "user" not in {row["name"] for row in self._db.execute("PRAGMA table_info(audit)")}:
                    self._db.execute("ALTER TABLE audit ADD COLUMN user TEXT NOT NULL DEFAULT ''")  # schema 1-2
                self._db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
                # an UPDATE, not a REPLACE: a file already at this schema is left byte for byte as it was
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema' AND value != ?",
                                 (str(SCHEMA_VERSION), str(SCHEMA_VERSION)))
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state file {self.path} is not usable: {exc}") from None

    def _meta(self, key: str) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:  # no meta table yet
            return None
        return None if row is None else row["value"]

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _clear_meta(self, key: str) -> None:
        self._db.execute("DELETE FROM meta WHERE key = ?", (key,))

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside commits together or not at all."""
        with self._db:
            yield

    # ---------------------------------------------------------------- circuit breaker

    def breaker(self) -> str | None:
        """Why the circuit breaker tripped, or None; it stays tripped until an operator resets it."""
        return self._meta("breaker")

    def trip_breaker(self, reason: str) -> None:
        self._set_meta("breaker", reason)

    def reset_breaker(self) -> None:
        self._clear_meta("breaker")

    # ---------------------------------------------------------------- pause

    def paused(self) -> str | None:
        """Why an operator paused the writes (`dike-slurm pause`), or None; kept until `resume`."""
        return self._meta("paused")

    def pause(self, reason: str) -> None:
        self._set_meta("paused", reason)

    def resume(self) -> None:
        self._clear_meta("paused")

    # ---------------------------------------------------------------- accounting sync

    def last_sync(self) -> float | None:
        value = self._meta("last_sync")
        return None if value is None else float(value)

    def set_last_sync(self, when: float) -> None:
        self._set_meta("last_sync", repr(when))

    # ---------------------------------------------------------------- preemptions being followed

    def freed_rooms(self) -> list[FreedRoom]:
        """The preemptions whose job has not started yet (dike_slurm.domain.freed_rooms)."""
        try:
            rows = self._db.execute("SELECT * FROM freed_rooms ORDER BY job_id").fetchall()
        except sqlite3.OperationalError:  # a file of an earlier version opened read-only: none yet
            return []
        return [FreedRoom(r["job_id"], tuple(json.loads(r["nodes"])), tuple(json.loads(r["victims"])),
                          r["requeued_at"], r["cycles_since_end"]) for r in rows]

    def set_freed_rooms(self, rooms: Iterable[FreedRoom]) -> None:
        """Replace the open preemptions (inside the cycle's transaction)."""
        self._db.execute("DELETE FROM freed_rooms")
        self._db.executemany(
            "INSERT OR REPLACE INTO freed_rooms (job_id, nodes, victims, requeued_at, cycles_since_end) "
            "VALUES (?, ?, ?, ?, ?)",
            [(r.job_id, json.dumps(list(r.nodes)), json.dumps(list(r.victims)), r.requeued_at, r.cycles_since_end)
             for r in rooms],
        )

    def preemption_totals(self) -> dict[str, int]:
        """Requeues whose preemption landed, was wasted or went unjudged (gone) since the state file was made."""
        return {outcome: int(self._meta(f"preemptions_{outcome}") or 0) for outcome in (LANDED, WASTED, GONE)}

    def add_preemption_outcomes(self, counts: Mapping[str, int]) -> None:
        totals = self.preemption_totals()
        for outcome, count in counts.items():
            self._set_meta(f"preemptions_{outcome}", str(totals.get(outcome, 0) + count))

    # ---------------------------------------------------------------- the site's priority span

    def site_span(self) -> SiteSpan | None:
        value = self._meta("site_span")
        return None if value is None else SiteSpan(**json.loads(value))

    def set_site_span(self, span: SiteSpan) -> None:
        self._set_meta("site_span", json.dumps(asdict(span)))

    def add_runs(self, runs: Iterable[Run]) -> None:
        """Store finished runs (a run seen again replaces the stored one)."""
        self._db.executemany(
            "INSERT OR REPLACE INTO runs (job_id, start, end, gpus, user, account, final, name, weight, state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r.job_id, r.start, r.end, r.gpus, r.user, r.account, int(r.final), r.name, r.weight, r.state.value)
             for r in runs if r.end is not None],
        )

    def runs(self) -> list[Run]:
        rows = self._db.execute("SELECT * FROM runs ORDER BY job_id, start").fetchall()
        keys = rows[0].keys() if rows else ()
        has_name = "name" in keys  # a schema-1 file opened read-only has none
        has_weight = "weight" in keys  # nor a file before schema 4
        has_state = "state" in keys  # nor a file before schema 5
        return [
            Run(row["job_id"], row["user"], row["account"], row["gpus"], row["start"], row["end"], bool(row["final"]),
                row["name"] if has_name else "", row["weight"] if has_weight else 1.0,
                JobState.parse(row["state"]) if has_state else JobState.COMPLETED)
            for row in rows
        ]

    def prune_runs(self, ended_before: float, keep_jobs: Iterable[int]) -> int:
        """Forget runs that ended before the look-back window, except those of active jobs."""
        keep = sorted(set(keep_jobs))
        self._db.execute("CREATE TEMP TABLE IF NOT EXISTS keep_jobs (job_id INTEGER PRIMARY KEY)")
        self._db.execute("DELETE FROM keep_jobs")
        self._db.executemany("INSERT INTO keep_jobs (job_id) VALUES (?)", [(j,) for j in keep])
        cursor = self._db.execute(
            "DELETE FROM runs WHERE end < ? AND job_id NOT IN (SELECT job_id FROM keep_jobs)", (ended_before,)
        )
        return cursor.rowcount

    # ---------------------------------------------------------------- jobs

    def jobs(self) -> Mapping[int, JobMemory]:
        """Every remembered job; shared between calls, never to be changed.

        Kept as owned() keeps its map: outside a transaction, the map read last is handed out
        again while neither this store nor another connection changed the file (a quiet cycle
        rewrites no job: `Applier._memories`).
        """
        return self._kept_read("jobs", self._jobs_changes, self._read_jobs)

    def _read_jobs(self) -> dict[int, JobMemory]:
        cursor = self._db.cursor()
        cursor.row_factory = None  # plain tuples, in _JOB_COLUMNS order: read every cycle
        cursor.execute(f"SELECT {_JOB_COLUMNS} FROM jobs")
        return {row[0]: _job_memory(row) for row in cursor}

    def job(self, job_id: int) -> JobMemory | None:
        cursor = self._db.cursor()
        cursor.row_factory = None
        row = cursor.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else _job_memory(row)

    def remember(self, memories: Iterable[JobMemory]) -> None:
        rows = [
            (m.job_id, m.level, m.written_level, m.attained_gpu_s, m.attained_at_promotion_gpu_s, m.promotions,
             m.requeues, ",".join(f.value for f in m.hands_off), m.hands_off_reason, m.reason, m.last_seen)
            for m in memories
        ]
        if not rows:
            return
        self._jobs_changes += 1
        self._db.executemany(
            "INSERT OR REPLACE INTO jobs (job_id, level, written_level, attained_gpu_s, attained_at_promotion_gpu_s,"
            " promotions, requeues, hands_off, hands_off_reason, reason, last_seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def forget_jobs(self, last_seen_before: float) -> int:
        """Drop jobs (and their owned fields) not seen active since then; the audit stays."""
        self._owned_changes += self._db.execute(
            "DELETE FROM owned WHERE job_id IN (SELECT job_id FROM jobs WHERE last_seen < ?)", (last_seen_before,)
        ).rowcount
        forgotten = self._db.execute("DELETE FROM jobs WHERE last_seen < ?", (last_seen_before,)).rowcount
        self._jobs_changes += forgotten
        return forgotten

    # ---------------------------------------------------------------- owned fields

    def owned(self) -> Mapping[int, Mapping[JobField, OwnedField]]:
        """Every field the engine owns, by job; shared between calls, never to be changed.

        Outside a transaction, the map read last is handed out again as long as neither this
        store nor any other connection (`dike-slurm revert` in another process) changed the file
        since: the service's quiet cycles read the ~110,000 owned fields of 55,000 jobs once.
        """
        return self._kept_read("owned", self._owned_changes, self._read_owned)

    def _kept_read(self, table: str, changes: int, read: Callable[[], Any]) -> Any:
        """`read()` of `table`, or the map it returned last while neither this store (`changes`:
        its own writes to the table) nor another connection (`PRAGMA data_version`) changed the file."""
        if self._db.in_transaction:  # it may yet be rolled back: read what it holds now, keep nothing
            return read()
        version = (self._db.execute("PRAGMA data_version").fetchone()[0], changes)
        kept = self._kept.get(table)
        if kept is None or kept[0] != version:
            kept = self._kept[table] = (version, read())
        return kept[1]

    def _read_owned(self) -> dict[int, dict[JobField, OwnedField]]:
        result: dict[int, dict[JobField, OwnedField]] = {}
        cursor = self._db.cursor()
        cursor.row_factory = None  # plain tuples: this reads every owned field of every job, every cycle
        cursor.execute("SELECT job_id, field, original, written, written_at FROM owned ORDER BY job_id")
        for job_id, name, original, written, written_at in cursor:
            field = _FIELD_BY_NAME[name]
            # 110,000 of them a cycle at 55,000 jobs; tests/unit/test_state_fast_read.py holds them equal
            owned = frozen_record(OwnedField, {
                "job_id": job_id, "field": field, "original": decode_value(field, original),
                "written": decode_value(field, written), "written_at": written_at})
            fields_of = result.get(job_id)
            if fields_of is None:
                fields_of = result[job_id] = {}
            fields_of[field] = owned
        return result

    def record_write(self, job_id: int, field: JobField, original: FieldValue, written: FieldValue, at: float) -> None:
        """Remember a value the engine wrote; the original is kept from the first write on."""
        self._owned_changes += 1
        self._db.execute(
            "INSERT INTO owned (job_id, field, original, written, written_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (job_id, field) DO UPDATE SET written = excluded.written, written_at = excluded.written_at",
            (job_id, field.value, encode_value(original), encode_value(written), at),
        )

    def release(self, job_id: int, fields: Iterable[JobField]) -> None:
        """The engine no longer owns these fields (restored, or left to the user)."""
        self._owned_changes += self._db.executemany(
            "DELETE FROM owned WHERE job_id = ? AND field = ?", [(job_id, f.value) for f in fields]
        ).rowcount

    # ---------------------------------------------------------------- audit and cycles

    def audit(self, entry: AuditEntry) -> int:
        """Add an entry; its id (for finish_audit)."""
        cursor = self._db.execute(
            "INSERT INTO audit (at, cycle, job_id, action, change, command, undo, ok, message, reason, user)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.at, entry.cycle, entry.job_id, entry.action, entry.change, entry.command, entry.undo,
             int(entry.ok), entry.message, entry.reason, entry.user),
        )
        return int(cursor.lastrowid or 0)

    def finish_audit(self, entry_id: int, ok: bool, message: str, command: str) -> None:
        """Record the outcome of a write-ahead entry."""
        self._db.execute(
            "UPDATE audit SET ok = ?, message = ?, command = ? WHERE id = ?", (int(ok), message, command, entry_id)
        )

    def last_done(self, job_id: int, action: str, since: float) -> float | None:
        """When `action` last succeeded for the job at or after `since` (None: not since)."""
        row = self._db.execute(
            "SELECT MAX(at) FROM audit WHERE job_id = ? AND action = ? AND ok = 1 AND at >= ?",
            (job_id, action, since),
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def audit_log(self, job_id: int | None = None, limit: int = 1000, since: float | None = None,
                  user: str | None = None) -> list[AuditEntry]:
        """The newest `limit` entries (of one job, at or after `since`, of one user's jobs), newest last."""
        clause, args = _audit_filter(job_id, since, user)
        rows = self._db.execute(f"SELECT * FROM audit{clause} ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_audit_entry(row) for row in reversed(rows)]

    def last_update(self, job_id: int) -> AuditEntry | None:
        """The newest `update` row of one job (its write, or its write-ahead row never completed)."""
        row = self._db.execute("SELECT * FROM audit WHERE job_id = ? AND action = 'update' ORDER BY id DESC LIMIT 1",
                               (job_id,)).fetchone()
        return None if row is None else _audit_entry(row)

    def record_cycle(self, summary: CycleSummary) -> int:
        cursor = self._db.execute(
            "INSERT INTO cycles (started, seconds, policy, applied, jobs, managed, writes, errors, slurm_calls, note)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (summary.started, summary.seconds, summary.policy, int(summary.applied), summary.jobs, summary.managed,
             summary.writes, summary.errors, summary.slurm_calls, summary.note),
        )
        return int(cursor.lastrowid or 0)

    def next_cycle(self) -> int:
        """The next cycle number; never one used before, even once retention deleted old cycle rows."""
        row = self._db.execute(
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM cycles), 0),"
            " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'cycles'), 0)) + 1 AS n"
        ).fetchone()
        return int(row["n"])

    def cycles(self, limit: int = 10) -> list[CycleSummary]:
        rows = self._db.execute("SELECT * FROM cycles ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [
            CycleSummary(row["started"], row["seconds"], row["policy"], bool(row["applied"]), row["jobs"],
                         row["managed"], row["writes"], row["errors"], row["slurm_calls"], row["note"])
            for row in reversed(rows)
        ]

    # ---------------------------------------------------------------- retention

    def iter_audit(self, job_id: int | None = None, since: float | None = None,
                   user: str | None = None) -> Iterator[AuditEntry]:
        """Every entry (of one job, at or after `since`, of one user's jobs), oldest first, read as it goes."""
        clause, args = _audit_filter(job_id, since, user)
        for row in self._db.execute(f"SELECT * FROM audit{clause} ORDER BY id", args):
            yield _audit_entry(row)

    def prune_audit(self, before: float, limit: int, export: Path | None = None) -> Pruned:
        """Delete at most `limit` audit rows older than `before`, oldest first. With `export`, they
        are appended to that JSON lines file and flushed to disk first; the delete commits with the
        file's new length, so an export a crash left uncommitted is cut off and written again, never
        duplicated, and a failed export deletes nothing."""
        rows = self._db.execute(
            "SELECT * FROM audit WHERE at < ? ORDER BY at, id LIMIT ?", (before, limit + 1)
        ).fetchall()
        more = len(rows) > limit
        entries = [_audit_entry(row) for row in rows[:limit]]
        if not entries:
            return Pruned("audit", 0, False)
        exported_length = append_audit_lines(export, entries, self._export_length(export)) if export is not None else None
        with self._db:
            self._db.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (id INTEGER PRIMARY KEY)")
            self._db.execute("DELETE FROM prune_ids")
            self._db.executemany("INSERT INTO prune_ids (id) VALUES (?)", [(e.id,) for e in entries])
            deleted = self._db.execute("DELETE FROM audit WHERE id IN (SELECT id FROM prune_ids)").rowcount
            if exported_length is not None:
                self._set_meta("audit_export", json.dumps({"path": str(export), "length": exported_length}))
        return Pruned("audit", deleted, more, len(entries) if export is not None else 0)

    def _export_length(self, export: Path) -> int | None:
        """How long the export file was when its last export committed (None: never exported there)."""
        text = self._meta("audit_export")
        if text is None:
            return None
        recorded = json.loads(text)
        return int(recorded["length"]) if recorded.get("path") == str(export) else None

    def prune_cycles(self, before: float, limit: int) -> Pruned:
        """Delete at most `limit` cycle summaries older than `before`, oldest first."""
        with self._db:
            deleted = self._db.execute(
                "DELETE FROM cycles WHERE id IN (SELECT id FROM cycles WHERE started < ? ORDER BY started, id LIMIT ?)",
                (before, limit),
            ).rowcount
        more = deleted == limit and self._db.execute(
            "SELECT 1 FROM cycles WHERE started < ? LIMIT 1", (before,)
        ).fetchone() is not None
        return Pruned("cycles", deleted, more)

    def optimize(self, now: float, every_s: float) -> str:
        """`PRAGMA optimize` at most once per `every_s` (of the cluster's clock), and VACUUM when over
        half the file is free pages (after a large backlog was deleted; otherwise SQLite reuses them).
        What was done ('' when not due)."""
        last = self._meta("optimized_at")
        if last is not None and now - float(last) < every_s:
            return ""
        with self._db:  # first: a VACUUM that cannot run (no room for its copy) is tried once per period
            self._set_meta("optimized_at", repr(now))
        self._db.execute("PRAGMA optimize")
        done = "optimize"
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        if free * 2 > pages:
            try:
                self._db.execute("VACUUM")
                done += f", vacuum ({free} of {pages} pages were free)"
            except sqlite3.OperationalError as exc:
                done += f", vacuum not done ({exc}; {free} of {pages} pages free)"
        if self.path is not None:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL grown by a large cycle or VACUUM
        return done

    def table_rows(self) -> dict[str, int]:
        """How many rows each table holds."""
        return {name: self._db.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0]
                for name in ("audit", "cycles", "jobs", "owned", "runs", "meta")}


def _audit_entry(row: sqlite3.Row) -> AuditEntry:
    return AuditEntry(row["at"], row["cycle"], row["job_id"], row["action"], row["change"], row["command"],
                      row["undo"], bool(row["ok"]), row["message"], row["reason"], row["id"],
                      row["user"] if "user" in row.keys() else "")  # a file before schema 3, opened read-only


_JOB_COLUMNS = ("job_id, last_seen, level, written_level, attained_gpu_s, attained_at_promotion_gpu_s, promotions,"
                " requeues, hands_off, hands_off_reason, reason")  # JobMemory's field order


_MEMORY_FIELDS = tuple(f.name for f in fields(JobMemory))  # = _JOB_COLUMNS


def _audit_filter(job_id: int | None, since: float | None, user: str | None = None) -> tuple[str, tuple]:
    """The WHERE clause (" WHERE ...", or "") and its arguments for the audit of one job, from
    `since` on, and of one user's jobs (the engine's own rows, job 0, have no user)."""
    where, args = [], []
    if user is not None:
        where.append("user = ? AND job_id != 0")
        args.append(user)
    if job_id is not None:
        where.append("job_id = ?")
        args.append(job_id)
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    return (f" WHERE {' AND '.join(where)}" if where else ""), tuple(args)


def _job_memory(row: tuple) -> JobMemory:
    """JobMemory(*row), 55,000 jobs a cycle; tests/unit/test_state_fast_read.py holds it equal to
    the constructor."""
    values = dict(zip(_MEMORY_FIELDS, row))
    hands_off = row[8]
    values["hands_off"] = tuple(_FIELD_BY_NAME[f] for f in hands_off.split(",") if f) if hands_off else ()
    return frozen_record(JobMemory, values)


def _read_only_uri(path: Path) -> str:
    """A reader that creates nothing: `mode=ro` while a writer's WAL files exist (it reads them,
    and a reader needs them), else `immutable=1`, which needs neither the -shm file nor a
    writable folder (with no writer attached the main file is complete)."""
    wal = Path(f"{path}-wal")
    mode = "mode=ro" if wal.exists() and Path(f"{path}-shm").exists() else "immutable=1"
    return f"file:{path}?{mode}"
