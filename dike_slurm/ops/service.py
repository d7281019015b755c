"""The engine as a service: a cycle every engine.interval_s, until a signal stops it.

A failed cycle (Slurm down, a command timed out) is one log line and is retried with backoff:
5 s doubling up to interval_s. SIGTERM/SIGINT: the current cycle finishes (each write is atomic
with its audit row) and the loop stops. SIGHUP: the configuration is read again before the next
cycle (an invalid one is logged and the running one kept). The clock, the sleep and the engine
factory are parameters, so the loop runs in tests without waiting or a cluster.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dike_slurm.config import Config, RetentionSettings
from dike_slurm.cycle.apply import CycleReport
from dike_slurm.cycle.engine import Engine
from dike_slurm.domain.freed_rooms import requeues_by_outcome
from dike_slurm.errors import DikeError
from dike_slurm.ops.metrics import MetricsWatch, write_metrics
from dike_slurm.slurm.backends import open_backend
from dike_slurm.store.state import Pruned, StateError, StateStore

log = logging.getLogger("dike_slurm.run")

RETRY_BASE_S = 5.0
POLL_S = 0.2  # how often a wait between cycles looks for a signal


def open_engine(config: Config, store: StateStore) -> Engine:
    """An engine on the backend the configuration names."""
    return Engine(config, open_backend(config), store)


def retry_wait_s(failures: int, interval_s: float) -> float:
    """The wait after `failures` failed cycles in a row: 5 s doubling, at most interval_s."""
    return min(interval_s, RETRY_BASE_S * 2 ** (failures - 1))


def summary_line(report: CycleReport) -> str:
    """One cycle in one line: jobs, changes, errors, Slurm calls, time."""
    plan = report.plan
    managed = sum(1 for p in plan.jobs if p.managed)
    written = sum(1 for _, o in report.outcomes if o.ok)
    verb = "written" if report.applied else "planned"
    settled = requeues_by_outcome(plan.room_outcomes)
    preemptions = (f", preemptions {settled['landed']} landed {settled['wasted']} wasted" if settled else "")
    return (f"cycle: {len(plan.jobs)} jobs in scope ({managed} managed, {plan.out_of_scope} out of scope), "
            f"{written if report.applied else len(plan.writes)} change(s) {verb}, {report.errors} error(s), "
            f"{report.slurm_calls} Slurm call(s) ({report.write_calls} write){preemptions}, {report.seconds:.2f} s")


@dataclass(frozen=True)
class Retention:
    """What one cycle's retention pass did: rows deleted per table, maintenance, a failure."""

    pruned: tuple[Pruned, ...] = ()
    maintenance: str = ""  # "optimize", "optimize, vacuum (...)" or ""
    error: str = ""  # why the pass stopped (nothing of that table was deleted)

    def line(self) -> str:
        """One log line ('' when nothing was done)."""
        parts = [self.error] if self.error else []
        parts += [f"{p.deleted} {p.table} row(s) deleted" + (f" ({p.exported} exported first)" if p.exported else "")
                 + (", older ones left for the next cycles" if p.more else "") for p in self.pruned if p.deleted]
        if self.maintenance:
            parts.append(self.maintenance)
        return "retention: " + "; ".join(parts) if parts else ""


def keep_history(store: StateStore, settings: RetentionSettings, now: float) -> Retention:
    """Delete the audit and cycle rows older than their retention (at most max_deletes_per_cycle of
    each; the audit exported first when configured), and optimize the file when due. An export
    that fails (its disk full) deletes nothing and is reported, not raised: the cycle's writes are
    done, and the rows wait for the next cycle."""
    pruned: list[Pruned] = []
    limit = settings.max_deletes_per_cycle
    error = ""
    try:
        pruned.append(store.prune_audit(now - settings.audit_days * 86400.0, limit, settings.audit_export))
    except OSError as exc:
        error = f"audit rows not deleted: {exc.strerror or exc}"
    pruned.append(store.prune_cycles(now - settings.cycles_days * 86400.0, limit))
    return Retention(tuple(pruned), store.optimize(now, settings.optimize_every_h * 3600.0), error)


def storage_hint(path: Path) -> str:
    """Why the state file's file system refused a write, when it says: full, or read-only (also
    when it went read-only after an error, which statvfs does not show: a file is created to ask)."""
    folder = path.parent
    try:
        info = os.statvfs(folder)
    except OSError:
        return ""
    free = info.f_bavail * info.f_frsize
    if info.f_flag & os.ST_RDONLY:
        return " (its file system is read-only)"
    if free < 2**20:
        return f" (its file system is full: {free} bytes free)"
    probe = folder / f".{path.name}.{os.getpid()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        return " (its file system is read-only)" if exc.errno == errno.EROFS else f" ({folder}: {exc.strerror})"
    return ""


def run_cycle(engine: Engine, *, apply: bool, watch: MetricsWatch | None = None,
              wall_clock: Callable[[], float] = time.time) -> CycleReport:
    """One cycle, then (applied only: a dry run writes nothing anywhere) the retention pass and the
    metrics file; a state store failure (disk full, read-only, file removed) raises a StateError,
    one line rather than a traceback. A failed applied cycle still rewrites the metrics file, with
    the failure counted in `watch` (the running service's; a fresh one for a single cycle)."""
    watch = MetricsWatch() if watch is None else watch
    metrics_file = engine.config.engine.metrics_file if apply else None
    try:
        try:
            report = engine.cycle(apply=apply)
            retention = keep_history(engine.store, engine.config.retention, report.plan.time) if apply else Retention()
        except sqlite3.Error as exc:
            path = engine.config.engine.state_db
            raise StateError(f"state store {path}: {exc}{storage_hint(path)}") from None
    except DikeError:
        if metrics_file is not None:
            watch.failed(wall_clock())
            try:
                write_metrics(watch, metrics_file)
            except OSError as exc:  # the cycle's own error is the one to report
                log.error("cannot write engine.metrics_file %s: %s", metrics_file, exc.strerror or exc)
        raise
    if retention.error:
        report = replace(report, notes=(*report.notes, retention.line()))
    elif retention.line():
        log.info(retention.line())
    if metrics_file is not None:
        watch.cycled(report)
        try:
            write_metrics(watch, metrics_file)
        except OSError as exc:
            raise DikeError(f"cannot write engine.metrics_file {metrics_file}: {exc.strerror or exc}") from None
    return report


@dataclass
class Signals:
    """What the signal handlers asked for; the service looks between cycles and while it waits."""

    stop: int | None = None  # the signal that asked the service to stop
    reload: bool = False

    def install(self, *, service: bool) -> None:
        """SIGTERM lets the cycle finish; a service also stops on SIGINT and reloads on SIGHUP."""
        signal.signal(signal.SIGTERM, self._stop)
        if service:
            signal.signal(signal.SIGINT, self._stop)
            signal.signal(signal.SIGHUP, self._reload)

    def _stop(self, signum: int, _frame: object) -> None:
        if self.stop is None:
            self.stop = signum

    def _reload(self, _signum: int, _frame: object) -> None:
        self.reload = True


class Service:
    """The loop around one engine; `engine` and `config` are the running ones (SIGHUP replaces them)."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        load_config: Callable[[], Config],
        *,
        apply: bool,
        signals: Signals | None = None,
        make_engine: Callable[[Config, StateStore], Engine] = open_engine,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.load_config = load_config
        self.apply = apply
        self.signals = signals or Signals()
        self.make_engine = make_engine
        self.clock = clock
        self.sleep = sleep
        self.engine = make_engine(config, store)
        self.failures = 0  # failed cycles in a row
        self.metrics = MetricsWatch()  # kept across cycles and reloads: counters, failures, held writes

    def run(self) -> bool:
        """Cycle until a signal stops the loop (False) or the cluster finishes (True: a simulated
        cluster ran to the end of its trace)."""
        while True:
            started = self.clock()
            try:
                report = run_cycle(self.engine, apply=self.apply, watch=self.metrics)
            except DikeError as exc:
                self.failures += 1
                log.error("cycle failed: %s", exc)
            else:
                self.failures = 0
                log.info(summary_line(report))
                for note in report.plan.notes + report.notes:
                    log.warning(note)
            if self.engine.backend.finished():
                return True
            wait = self.config.engine.interval_s
            if self.failures:
                wait = retry_wait_s(self.failures, wait)
                log.warning("retrying in %g s (failure %d in a row)", wait, self.failures)
            while (self.engine.backend.realtime and self.signals.stop is None and not self.signals.reload
                   and self.clock() - started < wait):
                self.sleep(min(POLL_S, wait - (self.clock() - started)))  # the next cycle starts on time
            if self.signals.stop is not None:
                log.info("%s: stopping after the cycle", signal.Signals(self.signals.stop).name)
                return False
            if self.signals.reload:
                self.signals.reload = False
                self._reload()

    def _reload(self) -> None:
        """SIGHUP: the new configuration, or the old one when the new one is invalid."""
        try:
            config = self.load_config()
            engine = self.make_engine(config, self.engine.store)
        except DikeError as exc:
            log.error("SIGHUP: configuration not reloaded, keeping the running one: %s", exc)
            return
        if config.engine.state_db != self.config.engine.state_db:
            log.warning("SIGHUP: engine.state_db changed; it takes effect on restart only")
        log.warning("SIGHUP: configuration reloaded (policy %s, interval %g s)",
                    engine.policy.name, config.engine.interval_s)
        self.engine, self.config = engine, config
