"""The service loop with a fake clock and stand-in engines: backoff, signals, reload, error counts."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine_fixtures import NOW, TOPOLOGY, nodes, pending
from engine_fixtures import config as fixture_config

from dike_slurm.cycle.apply import FIRST_BATCH, CycleReport
from fakes import FakeBackend
from dike_slurm.config import Config
from dike_slurm.domain.fields import JobField
from dike_slurm.errors import ConfigError, SlurmError
from dike_slurm.cycle.plan import CyclePlan
from dike_slurm.ops.service import RETRY_BASE_S, Service, Signals, retry_wait_s, run_cycle
from dike_slurm.cycle.engine import Engine
from dike_slurm.store.state import AuditEntry, CycleSummary, StateError, StateStore

STORE = StateStore(None)  # handed from engine to engine; retention runs on it (in memory)


class Clock:
    """Monotonic time that moves only when the service sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


class Backend:
    def __init__(self, realtime: bool = True) -> None:
        self.realtime = realtime
        self.ended = False

    def finished(self) -> bool:
        return self.ended


class FakeEngine:
    """Runs one scripted step per cycle: a step that raises is a failed cycle."""

    def __init__(self, config: Config, store: object, steps: list[Callable[[], None]], clock: Clock) -> None:
        self.config, self.store, self.steps, self.clock = config, store, steps, clock
        self.backend = Backend()
        self.policy = SimpleNamespace(name=config.engine.policy)
        self.starts: list[float] = []

    def cycle(self, *, apply: bool) -> CycleReport:
        self.starts.append(self.clock.now)
        self.steps.pop(0)()
        plan = CyclePlan(self.clock.now, self.config.engine.policy, "site_factor", (), (), (), (), (), 0)
        return CycleReport(plan=plan, applied=apply, outcomes=(), requeued=(), errors=0, seconds=0.1, slurm_calls=6,
                           write_calls=0)


def config(**engine: object) -> Config:
    return Config.model_validate({"engine": {"interval_s": 60, **engine}})


def ok() -> None:
    pass


def slurm_down() -> None:
    raise SlurmError("squeue: timed out after 30 s")


def service(steps: list[Callable[[], None]], **engine: object) -> tuple[Service, Clock, list[FakeEngine]]:
    clock = Clock()
    made: list[FakeEngine] = []

    def make_engine(cfg: Config, store: object) -> FakeEngine:
        made.append(FakeEngine(cfg, store, steps, clock))
        return made[-1]

    svc = Service(config(**engine), STORE, lambda: config(interval_s=11), apply=True,  # type: ignore[arg-type]
                  make_engine=make_engine, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    return svc, clock, made


def gaps(starts: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in zip(starts, starts[1:])]


def test_the_retry_wait_doubles_from_5_s_up_to_the_interval():
    assert [retry_wait_s(n, 60) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert retry_wait_s(1, 3) == 3 and RETRY_BASE_S == 5


def test_failed_cycles_back_off_and_a_success_resets_the_wait(caplog):
    steps: list[Callable[[], None]] = [slurm_down] * 5 + [ok, slurm_down]
    svc, clock, made = service(steps)
    steps.append(lambda: setattr(svc.signals, "stop", signal.SIGTERM))
    with caplog.at_level(logging.INFO, logger="dike_slurm.run"):
        assert svc.run() is False
    assert gaps(made[0].starts) == pytest.approx([5, 10, 20, 40, 60, 60, 5])
    assert "retrying in 40 s (failure 4 in a row)" in caplog.text
    assert caplog.text.count("cycle failed: squeue: timed out after 30 s") == 6
    assert "SIGTERM: stopping after the cycle" in caplog.text


def test_cycles_start_every_interval_however_long_a_cycle_takes():
    """A cycle of 0.46 s (the lab's mean) does not push the next one later: they start 60 s apart."""
    steps: list[Callable[[], None]] = []
    svc, clock, made = service(steps)

    def slow() -> None:
        clock.now += 0.46

    steps += [slow, slow, slow, lambda: setattr(svc.signals, "stop", signal.SIGTERM)]
    svc.run()
    assert gaps(made[0].starts) == [60, 60, 60]


def test_errors_are_counted_in_a_row_and_reset_by_a_good_cycle():
    counts: list[int] = []
    steps: list[Callable[[], None]] = [slurm_down, slurm_down]
    svc, _, _ = service(steps)
    steps += [lambda: counts.append(svc.failures), ok, lambda: counts.append(svc.failures), slurm_down,
              lambda: counts.append(svc.failures)]
    steps.append(lambda: setattr(svc.signals, "stop", signal.SIGINT))
    svc.run()
    # each seen during a cycle: after two failed ones, after a good one, after one failed one
    assert counts == [2, 0, 1]
    assert svc.failures == 0


def test_a_state_store_failure_is_a_failed_cycle_not_a_crash():
    def disk_full() -> None:
        raise sqlite3.OperationalError("database or disk is full")

    steps: list[Callable[[], None]] = [disk_full]
    svc, _, _ = service(steps)
    steps.append(lambda: setattr(svc.signals, "stop", signal.SIGTERM))
    assert svc.run() is False
    assert svc.failures == 0  # the second cycle succeeded


def test_other_exceptions_are_not_swallowed():
    def bug() -> None:
        raise KeyError("a bug")

    svc, _, _ = service([bug])
    with pytest.raises(KeyError):
        svc.run()


def test_a_stop_signal_ends_the_loop_after_the_cycle_without_waiting():
    steps: list[Callable[[], None]] = [ok]
    svc, clock, made = service(steps)
    steps.append(lambda: setattr(svc.signals, "stop", signal.SIGTERM))
    assert svc.run() is False
    assert made[0].starts == pytest.approx([0, 60], abs=0.21) and not steps


def test_a_stop_during_the_wait_ends_it_early():
    steps: list[Callable[[], None]] = [ok]
    svc, clock, _ = service(steps)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1:
            svc.signals.stop = signal.SIGTERM

    svc.sleep = sleep
    assert svc.run() is False
    assert clock.now == pytest.approx(1.0, abs=0.21)


def test_the_reload_flag_builds_a_new_engine_on_the_same_store_before_the_next_cycle(caplog):
    steps: list[Callable[[], None]] = []
    svc, clock, made = service(steps)
    steps += [lambda: setattr(svc.signals, "reload", True), ok, ok]
    steps.append(lambda: setattr(svc.signals, "stop", signal.SIGTERM))
    with caplog.at_level(logging.INFO, logger="dike_slurm.run"):
        svc.run()
    assert len(made) == 2 and made[1].store is STORE and svc.engine is made[1]
    assert svc.config.engine.interval_s == 11 and not svc.signals.reload
    assert made[0].starts == [0] and gaps(made[1].starts) == pytest.approx([11, 11], abs=0.21)
    assert made[1].starts[0] == 0  # the flag ends the wait: the reloaded engine cycles at once
    assert "SIGHUP: configuration reloaded (policy dike, interval 11 s)" in caplog.text


def test_an_invalid_configuration_on_reload_keeps_the_running_one(caplog):
    steps: list[Callable[[], None]] = []
    svc, _, made = service(steps)

    def broken() -> Config:
        raise ConfigError("engine.bogus: extra inputs are not permitted")

    svc.load_config = broken
    steps += [lambda: setattr(svc.signals, "reload", True), lambda: setattr(svc.signals, "stop", signal.SIGTERM)]
    svc.run()
    assert len(made) == 1 and svc.engine is made[0] and svc.config.engine.interval_s == 60
    assert "SIGHUP: configuration not reloaded, keeping the running one" in caplog.text


def test_a_finished_cluster_ends_the_loop_and_a_simulated_one_never_sleeps():
    steps: list[Callable[[], None]] = [ok, ok]
    svc, clock, made = service(steps)
    made[0].backend.realtime = False
    steps.append(lambda: setattr(made[0].backend, "ended", True))
    assert svc.run() is True
    assert clock.slept == 0 and len(made[0].starts) == 3


def test_the_installed_handlers_set_the_flags():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signals = Signals()
    try:
        signals.install(service=True)
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.reload and signals.stop == signal.SIGINT  # the first stop signal is the one named
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_an_applied_cycle_rewrites_the_metrics_file(tmp_path: Path):
    path = tmp_path / "metrics" / "dike.prom"
    engine = FakeEngine(config(metrics_file=str(path)), STORE, [ok], Clock())
    report = run_cycle(engine, apply=True)  # type: ignore[arg-type]
    assert report.slurm_calls == 6
    assert "dike_slurm_slurm_calls 6.0" in path.read_text()


def test_a_dry_cycle_leaves_the_metrics_file_alone(tmp_path: Path):
    path = tmp_path / "metrics" / "dike.prom"
    engine = FakeEngine(config(metrics_file=str(path)), STORE, [ok], Clock())
    run_cycle(engine, apply=False)  # type: ignore[arg-type]
    assert not path.parent.exists()


# ---------------------------------------------------------------- retention in the cycle

DAY = 86400.0


def store_with_history(path: Path | None, days_ago: list[float], now: float) -> StateStore:
    store = StateStore(path)
    with store.transaction():
        for age in days_ago:
            store.audit(AuditEntry(now - age * DAY, 1, 5, "update", "c", "cmd", "undo", True))
            store.record_cycle(CycleSummary(now - age * DAY, 0.1, "dike", True, 1, 1, 1, 0, 3))
    return store


def test_an_applied_cycle_deletes_history_past_retention_a_bounded_number_at_a_time(caplog):
    clock = Clock()
    clock.now = 400 * DAY
    store = store_with_history(None, [200, 150, 100, 10, 1], clock.now)
    engine = FakeEngine(Config.model_validate({"retention": {"audit_days": 90, "cycles_days": 30,
                                                             "max_deletes_per_cycle": 2}}), store, [ok] * 3, clock)
    run_cycle(engine, apply=False)  # type: ignore[arg-type]
    assert store.table_rows()["audit"] == 5  # a dry run deletes nothing
    with caplog.at_level(logging.INFO, logger="dike_slurm.run"):
        run_cycle(engine, apply=True)  # type: ignore[arg-type]
    assert ("retention: 2 audit row(s) deleted, older ones left for the next cycles; 2 cycles row(s) deleted, "
            "older ones left for the next cycles; optimize") in caplog.text
    run_cycle(engine, apply=True)  # type: ignore[arg-type]
    assert sorted(round((clock.now - e.at) / DAY) for e in store.audit_log()) == [1, 10]
    assert sorted(round((clock.now - c.started) / DAY) for c in store.cycles()) == [1, 10]


def test_an_export_that_fails_keeps_the_rows_and_is_a_note_not_a_failed_cycle():
    clock = Clock()
    clock.now = 400 * DAY
    store = store_with_history(None, [200, 100], clock.now)
    cfg = Config.model_validate({"retention": {"audit_days": 90, "audit_export": "/dev/full"}})
    report = run_cycle(FakeEngine(cfg, store, [ok], clock), apply=True)  # type: ignore[arg-type]
    assert report.notes == ("retention: audit rows not deleted: cannot write audit export /dev/full: No space "
                            "left on device; 2 cycles row(s) deleted; optimize",)
    assert store.table_rows()["audit"] == 2


# ---------------------------------------------------------------- the state file's file system failing mid-cycle


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB ext4 file system of its own (a loop-mounted image file): it can be filled, or fail
    as ext4 does after an I/O error (`mount -o remount,abort`: read-only from then on)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 to mount a file system of its own")
    image, mount = tmp_path / "fs.img", tmp_path / "fs"
    mount.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(16 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if made.returncode or mounted.returncode:
        pytest.skip(f"cannot mount a loop file system here: {(made.stderr + mounted.stderr).strip()}")
    try:
        yield mount
    finally:  # lazily: a failed test may still hold the state file open
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def remount_repaired(mount: Path) -> None:
    """What an admin does after ext4 went read-only: unmount, fsck, mount again."""
    image = mount.with_name("fs.img")
    subprocess.run(["umount", str(mount)], check=True)
    subprocess.run(["e2fsck", "-f", "-y", str(image)], capture_output=True)  # exit 1: errors corrected
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)


def fill(folder: Path) -> Path:
    """Write zeros into folder/filler until the file system has no block left."""
    filler = folder / "filler"
    chunk = bytes(65536)
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        try:
            while True:
                handle.write(b"\0")
        except OSError:
            pass
    return filler


class FaultMidCycle(FakeBackend):
    """The in-memory cluster, whose sixth update (in the cycle's second batch of writes, apply.py's
    FIRST_BATCH being 4) first breaks the state file's file system and then goes through, as do the
    batch's other updates (Slurm applied them; the engine cannot record that it did)."""

    def __init__(self, *args: Any, fault: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault = fault
        self.updates = 0

    def apply(self, update):  # type: ignore[no-untyped-def]
        self.updates += 1
        if self.updates == 6:
            self.fault()
        return super().apply(update)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_the_state_file_system_failing_mid_cycle_loses_nothing_and_the_next_cycle_recovers(small_filesystem, fault):
    mount = small_filesystem
    cfg = fixture_config(mount, engine={"breaker_min_jobs": 1000})
    jobs = [pending(i, ("alice", "bob")[i % 2]) for i in range(1, 9)]
    fillers: list[Path] = []

    def break_it() -> None:
        if fault == "full":
            fillers.append(fill(mount))
        else:
            subprocess.run(["mount", "-o", "remount,abort", str(mount)], check=True)

    backend = FaultMidCycle(jobs, nodes(), TOPOLOGY, time=NOW, fault=break_it)
    engine = Engine(cfg, backend, StateStore(cfg.engine.state_db))
    with pytest.raises(StateError) as failed:
        run_cycle(engine, apply=True)
    message = str(failed.value)
    expected = ("database or disk is full (its file system is full" if fault == "full"
                else "disk I/O error (its file system is read-only)")
    assert message.startswith(f"state store {cfg.engine.state_db}: {expected}") and "\n" not in message, message
    assert FIRST_BATCH == 4
    assert backend.updates == 8  # the cycle stopped at the batch it could not record
    engine.store.close()
    if fault == "full":
        fillers[0].unlink()  # space returns
    else:
        remount_repaired(mount)
    store = StateStore(cfg.engine.state_db)
    assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = store.audit_log()
    assert [r.ok for r in rows] == [True] * 4 + [False] * 4, rows
    assert all(r.message.startswith("unconfirmed") for r in rows[4:]), rows
    assert set(store.owned()) == {r.job_id for r in rows[:4]}  # exactly what was recorded as done
    assert store.cycles() == []  # the cycle did not finish
    report = run_cycle(Engine(cfg, backend, store), apply=True)  # the next cycle, space or file system back
    assert report.errors == 0
    assert all(backend.admin_comments.get(j.job_id, "").startswith("dike:level=") for j in jobs)
    # the unconfirmed writes reached Slurm: the next cycle finds their SiteFactors there, the values of
    # the jobs' newest (unconfirmed) updates, and owns them (with the original from before); their
    # AdminComments, also there, have nothing to write and stay not owned (docs/reliability.md, "Not done")
    owned = store.owned()
    assert set(owned) == {j.job_id for j in jobs} and len(store.cycles()) == 1
    assert {r.job_id: set(owned[r.job_id]) for r in rows[4:]} == {r.job_id: {JobField.SITE_FACTOR} for r in rows[4:]}
    assert all(owned[r.job_id][JobField.SITE_FACTOR].original == 0 for r in rows[4:])
    assert report.plan.adopted and not any(p.hands_off for p in report.plan.jobs)
    store.close()
