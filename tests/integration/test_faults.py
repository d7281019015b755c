"""Faults on the real lab: Slurm daemons stopped or killed, hanging commands, the engine killed,
two engines at once, signals on the service loop. Each test says what it checks.

Daemons are stopped through their pid files (the lab's own `slurm-lab` starts them the same
way: the bare daemon with the lab's SLURM_CONF) and always started again in a `finally`, so the
lab is left up whatever happens. Wrappers around Slurm commands live in a private bin_dir
(`slurm.bin_dir`), never in the lab.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from lab_engine import LabEngine


SlurmLab = Any
SLURM_COMMANDS = ("squeue", "sinfo", "sprio", "sacct", "sacctmgr", "scontrol")
# A write in a scontrol wrapper: one `scontrol update`, or a batch of lines fed to a bare `scontrol`
# (backends/scontrol_stdin.py; apply.py writes batches of FIRST_BATCH, then doubling).
WRITES = '[ "$1" = update ] || [ $# -eq 0 ]'


# ---------------------------------------------------------------- daemons


def _pid(lab: SlurmLab, name: str) -> int | None:
    try:
        pid = int((lab.lab_dir / "run" / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if comm == name else None


def ctld_up(lab: SlurmLab) -> bool:
    return lab.run("scontrol", "ping", check=False, timeout=30).stdout.count("is UP") > 0


def dbd_up(lab: SlurmLab) -> bool:
    return lab.run("sacctmgr", "-n", "list", "cluster", check=False, timeout=30).returncode == 0


def stop_daemon(lab: SlurmLab, name: str, sig: int = signal.SIGTERM) -> None:
    pid = _pid(lab, name)
    assert pid is not None, f"{name} is not running"
    os.kill(pid, sig)
    lab.wait_for(lambda: _pid(lab, name) is None, 30, f"{name} (pid {pid}) did not stop")


def start_daemon(lab: SlurmLab, name: str) -> float:
    """Start the daemon as the lab does (it daemonizes itself); seconds until it answers."""
    started = time.monotonic()
    if _pid(lab, name) is None:
        with open(lab.lab_dir / "log" / f"{name}.out", "ab") as out:
            subprocess.Popen([name], env=lab.env, cwd="/tmp", stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
    check = ctld_up if name == "slurmctld" else dbd_up
    lab.wait_for(lambda: check(lab), 60, f"{name} did not come back", interval=0.2)
    return time.monotonic() - started


@contextmanager
def daemon_down(lab: SlurmLab, name: str, sig: int = signal.SIGTERM) -> Iterator[dict[str, float]]:
    """The daemon stopped for the body; started again (and waited for) afterwards, always."""
    figures: dict[str, float] = {}
    stop_daemon(lab, name, sig)
    try:
        yield figures
    finally:
        figures["restart_s"] = start_daemon(lab, name)


@pytest.fixture(autouse=True)
def _lab_left_up(slurm_lab: SlurmLab) -> Iterator[None]:
    yield
    for name in ("slurmdbd", "slurmctld"):
        if _pid(slurm_lab, name) is None:
            start_daemon(slurm_lab, name)


# ---------------------------------------------------------------- the engine


def wrapper_bin(lab: SlurmLab, tmp: Path, **scripts: str) -> Path:
    """A bin_dir with the lab's real Slurm commands, except those given as sh scripts (which
    name the real command as `@BIN@/NAME`)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in SLURM_COMMANDS:
        target = bin_dir / name
        if target.exists() or target.is_symlink():
            target.unlink()
        if name in scripts:
            target.write_text("#!/bin/sh\n" + scripts[name].replace("@BIN@", str(lab.bin_dir)))
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        else:
            target.symlink_to(shutil.which(name, path=str(lab.bin_dir)) or name)
    return bin_dir


class Engine(LabEngine):
    """The engine on the command-line backend on every lab (the 25.11 lab's dike.toml says pyslurm):
    the faults are injected through Slurm's commands (wrappers in bin_dir) and counted in them."""

    def __init__(self, lab: SlurmLab, state_dir: Path) -> None:
        super().__init__(lab, state_dir, DIKE_SLURM__COMMAND_TIMEOUT_S="15", DIKE_SLURM__BACKEND="cli")

    def __call__(self, *args: str, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.run(*args, timeout=timeout, **extra)

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        log = open(self.dir / "service.log", "w")
        return subprocess.Popen([sys.executable, "-m", "dike_slurm", *args], env=self.environ(**extra),
                                stdout=log, stderr=subprocess.STDOUT, text=True, cwd="/tmp")

    def log(self) -> str:
        path = self.dir / "service.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.state_db)
        db.row_factory = sqlite3.Row
        return db

    def dump(self) -> list[str]:
        with self.db() as db:
            return list(db.iterdump())

    def audit(self) -> list[sqlite3.Row]:
        with self.db() as db:
            return db.execute("SELECT * FROM audit ORDER BY id").fetchall()

    def integrity(self) -> str:
        with self.db() as db:
            return db.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.fixture
def engine(slurm_lab: SlurmLab, tmp_path: Path) -> Engine:
    return Engine(slurm_lab, tmp_path)


def fill_queue(lab: SlurmLab, pending: int = 6) -> list[int]:
    """One job holding every GPU and `pending` one-GPU jobs behind it (the engine writes to each of
    these; the running blocker, which the engine may not requeue, gets nothing: `written`)."""
    jobs = [lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")]
    lab.wait_for(lambda: lab.job_state(jobs[0]) == "RUNNING", 30, "blocker did not start")
    users = ("dikeuser1", "dikeuser2")
    jobs += [lab.sbatch("--gres=gpu:1", "--wrap", "sleep 60", user=users[i % 2]) for i in range(pending)]
    return jobs


def wait_jobs_saved(lab: SlurmLab, after: float) -> None:
    """Wait until slurmctld has written its job state file (StateSaveLocation/job_state) after `after`."""
    conf = lab.slurm_conf.read_text()
    match = re.search(r"^StateSaveLocation=(\S+)", conf, re.MULTILINE)
    assert match, f"no StateSaveLocation in {lab.slurm_conf}"
    saved = Path(match[1]) / "job_state"
    lab.wait_for(lambda: saved.exists() and saved.stat().st_mtime > after, 30, f"slurmctld to save {saved}")


def written(lab: SlurmLab, jobs: list[int]) -> list[int]:
    """fill_queue's jobs the engine writes: the pending ones (after checking the blocker got nothing:
    it runs, and the engine may not requeue it)."""
    assert admin_comment(lab, jobs[0]) == "", jobs[0]
    return jobs[1:]


def admin_comment(lab: SlurmLab, job_id: int) -> str:
    line = lab.run("scontrol", "show", "job", "-o", str(job_id)).stdout
    match = re.search(r" AdminComment=(.*?) (?:\w+=)", line)
    return match.group(1) if match and match.group(1) != "(null)" else ""


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:"), proc.stderr
    return lines[0]


# ---------------------------------------------------------------- (a) slurmctld down at the start


@pytest.mark.scenario
def test_slurmctld_down_at_cycle_start_writes_nothing_and_resumes(slurm_lab: SlurmLab, engine: Engine) -> None:
    jobs = fill_queue(slurm_lab, 3)
    assert engine("run", "--once", "--apply").returncode == 0
    before = engine.dump()
    with daemon_down(slurm_lab, "slurmctld") as figures:
        t0 = time.monotonic()
        proc = engine("run", "--once", "--apply")
        failed_in = time.monotonic() - t0
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = one_line_error(proc)
        assert "squeue" in line and "failed" in line, line
        assert engine.dump() == before  # nothing written to the state store
    t0 = time.monotonic()
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recovered = time.monotonic() - t0
    assert set(jobs) <= set(slurm_lab.job_ids())  # no job lost across the controller restart
    for job in written(slurm_lab, jobs):
        assert admin_comment(slurm_lab, job).startswith("dike:level="), job
    print(f"FIGURES ctld-down: failed cycle {failed_in:.1f}s, ctld restart {figures['restart_s']:.1f}s, "
          f"first cycle after {recovered:.1f}s")


@pytest.mark.scenario
def test_service_loop_retries_with_backoff_while_slurmctld_is_down(slurm_lab: SlurmLab, engine: Engine) -> None:
    fill_queue(slurm_lab, 2)
    service = engine.start("run", "--apply", DIKE_ENGINE__INTERVAL_S="30")
    try:
        slurm_lab.wait_for(lambda: "cycle:" in engine.log(), 60, "no first cycle")
        with daemon_down(slurm_lab, "slurmctld"):
            slurm_lab.wait_for(lambda: "retrying in 5 s" in engine.log(), 60, "no retry logged")
            slurm_lab.wait_for(lambda: "retrying in 10 s" in engine.log(), 60, "no backoff logged")
        back = time.monotonic()
        cycles_before = engine.log().count("cycle:")
        slurm_lab.wait_for(lambda: engine.log().count("cycle:") > cycles_before, 60, "no cycle after restart")
        print(f"FIGURES loop recovery: {time.monotonic() - back:.1f}s after slurmctld answered")
        assert service.poll() is None  # the service survived the outage
        assert "Traceback" not in engine.log()
    finally:
        service.terminate()
        service.wait(30)
    assert service.returncode == 0, engine.log()


# ---------------------------------------------------------------- (b) slurmctld killed mid-batch


@pytest.mark.scenario
def test_slurmctld_killed_mid_batch_audit_is_exact_and_next_cycle_converges(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    jobs = fill_queue(slurm_lab, 8)
    wait_jobs_saved(slurm_lab, time.time())  # slurmctld has saved the new jobs: the SIGKILL loses none
    pidfile = slurm_lab.lab_dir / "run" / "slurmctld.pid"
    counter = tmp_path / "batches"
    # a breaker of 2: a first batch of 2 writes, a second of 4 (apply.py doubles after a clean
    # batch); slurmctld dies as the second batch's scontrol starts
    bin_dir = wrapper_bin(slurm_lab, tmp_path, scontrol=(
        f'if {WRITES}; then\n'
        f'  n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}\n'
        f'  if [ $n -eq 2 ]; then kill -KILL $(cat {pidfile}); sleep 0.5; fi\n'
        f'fi\n'
        f'exec @BIN@/scontrol "$@"\n'
    ))
    try:
        proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir),
                      DIKE_ENGINE__BREAKER_MAX_ERRORS="2", DIKE_SLURM__COMMAND_TIMEOUT_S="10",
                      DIKE_ENGINE__CYCLE_DEADLINE_S="120")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        rows = engine.audit()
    finally:
        restart = start_daemon(slurm_lab, "slurmctld")
    ok = [r for r in rows if r["action"] == "update" and r["ok"]]
    failed = [r for r in rows if r["action"] == "update" and not r["ok"]]
    skipped = [r for r in rows if r["action"] == "skipped"]
    assert len(ok) == 2 and len(failed) == 4, [dict(r) for r in rows]
    assert all(r["command"].startswith("echo 'update JobId=") for r in ok + failed), [dict(r) for r in rows]
    # each line of the batch got its own answer from scontrol (the controller did not answer)
    assert all(r["message"].endswith(f"for job {r['job_id']}") for r in failed), [dict(r) for r in failed]
    assert skipped and all("circuit breaker" in r["message"] for r in skipped)
    assert not any(r["message"].startswith("unconfirmed") for r in rows)
    # every job the engine had planned a write for is in the audit exactly once
    assert len({r["job_id"] for r in rows}) == len(rows)
    assert {r["job_id"] for r in rows} <= set(jobs)
    # The audit is the truth as Slurm answered: failed and skipped writes are not in Slurm. An
    # acknowledged write can still be lost by a SIGKILLed slurmctld (it had not saved its state
    # yet): the engine diffs against Slurm, so the next cycle writes it again.
    lost = [r["job_id"] for r in ok if not admin_comment(slurm_lab, r["job_id"]).startswith("dike:level=")]
    for row in failed + skipped:
        if "AdminComment" in row["change"] and row["job_id"] in slurm_lab.job_ids():
            assert admin_comment(slurm_lab, row["job_id"]) == "", dict(row)
    with engine.db() as db:
        cycle = db.execute("SELECT * FROM cycles ORDER BY id DESC LIMIT 1").fetchone()
        assert cycle["errors"] == 4 and cycle["writes"] == 2
    # the error breaker latched: nothing is written until an operator resets it
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 1 and "circuit breaker tripped" in proc.stderr, proc.stdout + proc.stderr
    assert engine("breaker", "status").returncode == 1
    assert engine("breaker", "reset").returncode == 0
    # the next cycle (real scontrol) converges: every surviving job gets its values
    t0 = time.monotonic()
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for job in set(written(slurm_lab, jobs)) & set(slurm_lab.job_ids()):
        assert admin_comment(slurm_lab, job).startswith("dike:level="), job
    assert engine.integrity() == "ok"
    print(f"FIGURES ctld killed mid-batch: restart {restart:.1f}s, converging cycle {time.monotonic() - t0:.1f}s, "
          f"jobs kept {len(set(jobs) & set(slurm_lab.job_ids()))}/{len(jobs)}, "
          f"acknowledged writes lost by slurmctld {len(lost)}/{len(ok)} (rewritten), "
          f"what a line said: {failed[0]['message']!r}")


# ---------------------------------------------------------------- (c) slurmdbd down


def job_with_a_level(lab: SlurmLab, engine: Engine) -> tuple[int, int, int, str]:
    """A job that ran long enough for level 1, was requeued, and was seen by one applied cycle:
    (job, its level, the runs and the sync point the state store then holds)."""
    job = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")
    lab.wait_for(lambda: lab.job_state(job) == "RUNNING", 30, "job did not start")
    lab.wait_run_time(job, 11)  # 8 GPUs x 11 s = 88 GPU-s: above the first threshold (72)
    lab.run("scontrol", "requeue", str(job))
    lab.wait_for(lambda: "REQUEUED" in lab.run("sacct", "-n", "-X", "-D", "-j", str(job), "-o", "State").stdout,
                 60, "sacct does not show the requeued run")
    assert engine("run", "--once", "--apply").returncode == 0
    with engine.db() as db:
        level = db.execute("SELECT level FROM jobs WHERE job_id = ?", (job,)).fetchone()["level"]
        runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        sync = db.execute("SELECT value FROM meta WHERE key = 'last_sync'").fetchone()[0]
    assert level >= 1 and runs >= 1
    return job, level, runs, sync


@pytest.mark.scenario
def test_slurmdbd_down_keeps_levels_from_the_state_store(slurm_lab: SlurmLab, engine: Engine) -> None:
    lab = slurm_lab
    job, level_before, runs_before, sync_before = job_with_a_level(lab, engine)
    with daemon_down(lab, "slurmdbd") as figures:
        proc = engine("run", "--once", "--apply")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "accounting unavailable" in proc.stderr and "state store" in proc.stderr, proc.stderr
        with engine.db() as db:
            level = db.execute("SELECT level FROM jobs WHERE job_id = ?", (job,)).fetchone()["level"]
            assert level == level_before  # not reset to 0
            assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == runs_before
            assert db.execute("SELECT value FROM meta WHERE key = 'last_sync'").fetchone()[0] == sync_before
        assert f"dike:level={level_before}" in admin_comment(lab, job)
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0 and "accounting unavailable" not in proc.stderr, proc.stderr
    print(f"FIGURES dbd down: level kept {level_before}, dbd restart {figures['restart_s']:.1f}s")


@pytest.mark.scenario
def test_doctor_says_slurmdbd_does_not_answer(slurm_lab: SlurmLab, engine: Engine) -> None:
    """Issue 32: doctor with the lab's slurmdbd stopped names the command and what it said."""
    with daemon_down(slurm_lab, "slurmdbd"):
        proc = engine("doctor", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    slurmdbd = checks["slurmdbd"]
    assert slurmdbd["verdict"] == "FAIL" and "sacctmgr -nP show account format=Account failed" in slurmdbd["found"]
    assert "Connection refused" in slurmdbd["found"] and "start slurmdbd" in slurmdbd["advice"]
    assert checks["scope.accounts"]["verdict"] == "ok"  # the lab's engine manages every account: nothing to check


# ---------------------------------------------------------------- (d) hanging commands


@pytest.mark.scenario
def test_hanging_squeue_is_bounded_by_command_timeout(slurm_lab: SlurmLab, engine: Engine, tmp_path: Path) -> None:
    # the fake squeue forks a child that keeps the pipes open: the whole process group is killed
    bin_dir = wrapper_bin(slurm_lab, tmp_path, squeue="sleep 300 &\nsleep 300\n")
    t0 = time.monotonic()
    proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir), DIKE_SLURM__COMMAND_TIMEOUT_S="2",
                  timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1
    assert "timed out after 2s" in one_line_error(proc)
    assert took < 15, took
    assert not engine.state_db.exists() or not engine.audit()
    print(f"FIGURES hanging squeue: cycle ended after {took:.1f}s (timeout 2 s)")


@pytest.mark.scenario
def test_slow_reads_share_the_cycle_deadline(slurm_lab: SlurmLab, engine: Engine, tmp_path: Path) -> None:
    # every squeue answers, but only after 3 s: each read is within its 20 s timeout, the reads
    # together are not within the 4 s cycle deadline
    bin_dir = wrapper_bin(slurm_lab, tmp_path, squeue='sleep 3\nexec @BIN@/squeue "$@"\n')
    t0 = time.monotonic()
    proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir), DIKE_SLURM__COMMAND_TIMEOUT_S="20",
                  DIKE_ENGINE__CYCLE_DEADLINE_S="4", timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 1
    error = one_line_error(proc)
    # the lean read's second squeue (ExcNodeList, which -O lacks) is the one the deadline cuts
    assert "squeue -a -o" in error and "what was left of the cycle deadline" in error, error
    assert took < 9, took  # 4 s of reads plus start-up, not 2 x 3 s of squeue and the rest
    assert not engine.state_db.exists() or not engine.audit()  # nothing written
    print(f"FIGURES slow reads: cycle ended after {took:.1f}s (deadline 4 s, each squeue 3 s, timeout 20 s): {error}")


@pytest.mark.scenario
def test_a_hung_writer_is_killed_at_the_cycle_deadline_and_its_lines_are_unconfirmed(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    fill_queue(slurm_lab, 6)
    bin_dir = wrapper_bin(slurm_lab, tmp_path, scontrol=f'if {WRITES}; then sleep 300; fi\nexec @BIN@/scontrol "$@"\n')
    t0 = time.monotonic()
    proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir), DIKE_SLURM__COMMAND_TIMEOUT_S="2",
                  DIKE_ENGINE__CYCLE_DEADLINE_S="3", DIKE_ENGINE__BREAKER_MAX_ERRORS="100", timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1
    rows = engine.audit()
    attempted = [r for r in rows if r["action"] == "update"]
    skipped = [r for r in rows if r["action"] == "skipped"]
    # the first batch (FIRST_BATCH = 4 lines) went to one scontrol, killed when its time was up:
    # Slurm may or may not have taken each line, and the audit says so
    assert len(attempted) == 4, [dict(r) for r in rows]
    assert all(not r["ok"] and r["message"].startswith("unconfirmed: scontrol was killed after") for r in attempted)
    assert skipped and all("cycle deadline" in r["message"] for r in skipped)
    assert took < 30, took
    assert "cycle deadline 3s passed" in proc.stderr
    print(f"FIGURES hung writer: {len(attempted)} unconfirmed, {len(skipped)} skipped, cycle {took:.1f}s")


# ---------------------------------------------------------------- (e) SIGKILL of the engine mid-cycle


@pytest.mark.scenario
def test_engine_sigkilled_mid_apply_leaves_a_consistent_truthful_store(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    jobs = fill_queue(slurm_lab, 6)
    counter = tmp_path / "updates"
    # the second batch reaches Slurm, then the engine (this script's parent) dies before recording it
    bin_dir = wrapper_bin(slurm_lab, tmp_path, scontrol=(
        f'if {WRITES}; then\n'
        f'  n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}\n'
        f'  if [ $n -eq 2 ]; then @BIN@/scontrol "$@"; kill -KILL $PPID; exit 0; fi\n'
        f'fi\n'
        f'exec @BIN@/scontrol "$@"\n'
    ))
    proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir))
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    assert engine.integrity() == "ok"
    rows = engine.audit()
    assert len(rows) > 4 and [bool(r["ok"]) for r in rows] == [True] * 4 + [False] * (len(rows) - 4), \
        [dict(r) for r in rows]
    assert all(r["message"].startswith("unconfirmed") for r in rows[4:]), [dict(r) for r in rows]
    with engine.db() as db:
        assert db.execute("SELECT COUNT(*) FROM cycles").fetchone()[0] == 0  # the cycle never finished
        owned = {r[0] for r in db.execute("SELECT DISTINCT job_id FROM owned")}
    assert owned == {r["job_id"] for r in rows[:4]}  # owned exactly what was confirmed
    for row in rows:  # confirmed or not, every line reached Slurm
        assert admin_comment(slurm_lab, row["job_id"]).startswith("dike:level="), dict(row)
    # restart: consistent, converges, and the unconfirmed write is seen as already in Slurm
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert engine.integrity() == "ok"
    for job in written(slurm_lab, jobs):
        assert admin_comment(slurm_lab, job).startswith("dike:level="), job
    # ...the engine's own: it owns them now, none is left alone as another's
    assert not [r for r in engine.audit() if r["action"] == "left-alone"], [dict(r) for r in engine.audit()]
    with engine.db() as db:
        owned = {r[0] for r in db.execute("SELECT job_id FROM owned WHERE field = 'SiteFactor'")}
    assert owned >= {r["job_id"] for r in rows}


# ---------------------------------------------------------------- (f) two engines


@pytest.mark.scenario
def test_second_engine_refuses_and_a_dead_engines_lock_is_taken_over(slurm_lab: SlurmLab, engine: Engine) -> None:
    fill_queue(slurm_lab, 2)
    service = engine.start("run", "--apply", DIKE_ENGINE__INTERVAL_S="30")
    lock = Path(f"{engine.state_db}.lock")
    try:
        slurm_lab.wait_for(lambda: "cycle:" in engine.log(), 60, "no first cycle")
        assert lock.read_text().strip() == str(service.pid)
        proc = engine("run", "--once", "--apply")
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert "another dike-slurm engine holds" in line and f"(pid {service.pid})" in line, line
        service.kill()  # SIGKILL: the lock file stays, naming a dead process
        service.wait(30)
        assert lock.exists()
        proc = engine("run", "--once", "--apply")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert engine.integrity() == "ok"
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(30)


# ---------------------------------------------------------------- (g) SIGTERM / SIGHUP


@pytest.mark.scenario
def test_sigterm_mid_apply_finishes_the_cycle_and_sighup_reloads(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    jobs = fill_queue(slurm_lab, 4)
    config = tmp_path / "dike.toml"
    config.write_text(Path(slurm_lab.env["DIKE_CONFIG"]).read_text())
    slow = wrapper_bin(slurm_lab, tmp_path, scontrol=f'if {WRITES}; then sleep 1; fi\nexec @BIN@/scontrol "$@"\n')
    service = engine.start("run", "--apply", "-c", str(config), DIKE_SLURM__BIN_DIR=str(slow))
    try:
        slurm_lab.wait_for(lambda: "cycle:" in engine.log(), 90, "no first cycle")
        config.write_text(config.read_text().replace("interval_s = 10", "interval_s = 11"))
        service.send_signal(signal.SIGHUP)
        slurm_lab.wait_for(lambda: "configuration reloaded" in engine.log(), 30, "no reload")
        assert "interval 11 s" in engine.log()
        # a broken file on SIGHUP: logged, the running configuration is kept
        good = config.read_text()
        config.write_text(good + "\n[engine]\nbogus = 1\n")
        service.send_signal(signal.SIGHUP)
        slurm_lab.wait_for(lambda: "not reloaded" in engine.log(), 30, "bad config not reported")
        config.write_text(good)
        # SIGTERM while a cycle is writing (each update takes 1 s): make the next cycle write
        for job in jobs[1:]:
            slurm_lab.run("scontrol", "update", f"JobId={job}", "AdminComment=")
        audit_before = len(engine.audit())

        def rewriting_comments() -> bool:
            # a write of one of those comments, not just any write: a cycle that read Slurm before
            # the reset may still be writing other values (fair-share drift moves SiteFactors)
            return any(r["job_id"] in jobs[1:] and "AdminComment" in r["change"] for r in engine.audit()[audit_before:])

        slurm_lab.wait_for(rewriting_comments, 60, "no AdminComment rewritten in the next cycle")
        service.send_signal(signal.SIGTERM)
        service.wait(60)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(30)
    assert service.returncode == 0, engine.log()
    assert "SIGTERM: stopping after the cycle" in engine.log()
    assert "Traceback" not in engine.log()
    rows = engine.audit()
    assert not any(r["message"].startswith("unconfirmed") for r in rows), engine.log()  # the cycle finished its writes
    with engine.db() as db:
        assert db.execute("SELECT COUNT(*) FROM cycles").fetchone()[0] == engine.log().count("cycle:"), engine.log()
    for job in jobs[1:]:
        assert admin_comment(slurm_lab, job).startswith("dike:level="), (job, engine.log())


# ---------------------------------------------------------------- (h) MariaDB down under a running slurmdbd

LAB_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-lab"


@contextmanager
def mariadb_down(lab: SlurmLab) -> Iterator[dict[str, float]]:
    """The lab's MariaDB stopped, slurmdbd left running; MariaDB started again by the lab's own
    script (`slurm-lab up` starts only what is not running), always."""
    figures: dict[str, float] = {}
    stop_daemon(lab, "mariadbd")
    try:
        yield figures
    finally:
        started = time.monotonic()
        up = subprocess.run([str(LAB_SCRIPT), "--slurm", lab.version, "up"], env=lab.env, capture_output=True,
                            text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        lab.wait_for(lambda: dbd_up(lab) and lab.run("sacct", "-n", "-X", "-S", "now-1hours", check=False,
                                                     timeout=30).returncode == 0, 120, "accounting did not come back")
        figures["restart_s"] = time.monotonic() - started


@pytest.mark.scenario
def test_mariadb_down_while_slurmdbd_runs_keeps_levels_from_the_state_store(slurm_lab: SlurmLab, engine: Engine) -> None:
    lab = slurm_lab
    job, level_before, runs_before, sync_before = job_with_a_level(lab, engine)
    with mariadb_down(lab) as figures:
        assert _pid(lab, "slurmdbd") is not None  # only its database is gone
        sacct = lab.run("sacct", "-n", "-X", "-S", "now-1hours", check=False, timeout=60)
        t0 = time.monotonic()
        proc = engine("run", "--once", "--apply")
        took = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "accounting unavailable" in proc.stderr and "state store" in proc.stderr, proc.stderr
        with engine.db() as db:
            assert db.execute("SELECT level FROM jobs WHERE job_id = ?", (job,)).fetchone()["level"] == level_before
            assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == runs_before
            assert db.execute("SELECT value FROM meta WHERE key = 'last_sync'").fetchone()[0] == sync_before
        assert f"dike:level={level_before}" in admin_comment(lab, job)
        assert _pid(lab, "slurmdbd") is not None
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0 and "accounting unavailable" not in proc.stderr, proc.stderr
    print(f"FIGURES mariadb down: sacct exit {sacct.returncode} ({(sacct.stderr.strip().splitlines() or [''])[-1]!r}), "
          f"cycle {took:.1f}s, level kept {level_before}, mariadb back {figures['restart_s']:.1f}s")


# ---------------------------------------------------------------- (i) the state file's file system full or read-only


@contextmanager
def loop_filesystem(folder: Path, megabytes: int = 16) -> Iterator[Path]:
    """An ext4 file system of its own (a loop-mounted image file) at `folder`."""
    image = folder.with_name(folder.name + ".img")
    folder.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(megabytes * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(folder)], capture_output=True, text=True)
    if made.returncode or mounted.returncode:  # e.g. a container without loop devices: said, as the unit twin says it
        pytest.skip(f"cannot mount a loop file system here: {(made.stderr + mounted.stderr).strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.scenario
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_state_file_system_full_or_read_only_mid_cycle_loses_nothing_and_recovers(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path, fault: str
) -> None:
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 for a file system of its own")
    jobs = fill_queue(slurm_lab, 6)
    with loop_filesystem(tmp_path / "fs") as mount:
        engine.state_db = mount / "state.sqlite"
        engine.env["DIKE_ENGINE__STATE_DB"] = str(engine.state_db)
        counter = tmp_path / "updates"
        # the second batch of writes: the file system fills up (or goes read-only, as ext4 does after
        # an I/O error), then the batch goes to Slurm, which applies it
        breaks = (f"dd if=/dev/zero of={mount}/filler bs=64k 2>/dev/null; dd if=/dev/zero of={mount}/filler2 "
                  f"bs=1 2>/dev/null" if fault == "full" else f"mount -o remount,abort {mount}")
        bin_dir = wrapper_bin(slurm_lab, tmp_path, scontrol=(
            f'if {WRITES}; then\n'
            f'  n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}\n'
            f'  if [ $n -eq 2 ]; then {breaks}; fi\n'
            f'fi\n'
            f'exec @BIN@/scontrol "$@"\n'
        ))
        t0 = time.monotonic()
        proc = engine("run", "--once", "--apply", DIKE_SLURM__BIN_DIR=str(bin_dir))
        took = time.monotonic() - t0
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = one_line_error(proc)
        said = ("database or disk is full (its file system is full" if fault == "full"
                else "(its file system is read-only)")
        assert f"state store {engine.state_db}: " in line and said in line, line
        if fault == "full":
            for name in ("filler", "filler2"):
                (mount / name).unlink()  # space returns
        else:  # what an admin does after ext4 went read-only: unmount, fsck, mount again
            image = mount.with_name(mount.name + ".img")
            subprocess.run(["umount", str(mount)], check=True)
            subprocess.run(["e2fsck", "-f", "-y", str(image)], capture_output=True)
            subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        assert engine.integrity() == "ok"
        rows = engine.audit()
        assert len(rows) > 4 and [bool(r["ok"]) for r in rows] == [True] * 4 + [False] * (len(rows) - 4), \
            [dict(r) for r in rows]
        # in Slurm, not known to be
        assert all(r["message"].startswith("unconfirmed") for r in rows[4:]), [dict(r) for r in rows]
        with engine.db() as db:
            assert db.execute("SELECT COUNT(*) FROM cycles").fetchone()[0] == 0
            owned = {r[0] for r in db.execute("SELECT DISTINCT job_id FROM owned")}
        assert owned == {r["job_id"] for r in rows[:4]}
        for row in rows[4:]:
            assert admin_comment(slurm_lab, row["job_id"]).startswith("dike:level="), dict(row)
        t0 = time.monotonic()
        proc = engine("run", "--once", "--apply")
        recovered = time.monotonic() - t0
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert engine.integrity() == "ok"
        for job in written(slurm_lab, jobs):
            assert admin_comment(slurm_lab, job).startswith("dike:level="), job
    print(f"FIGURES state fs {fault}: failing cycle {took:.1f}s ({line}), next cycle {recovered:.1f}s")


# ---------------------------------------------------------------- (j) slurmctld restarted between the read and the writes


@pytest.mark.adapter
def test_slurmctld_restarted_between_read_and_writes_jobs_that_finished_are_gone_not_errors(
    slurm_lab: SlurmLab, engine: Engine, tmp_path: Path
) -> None:
    jobs = fill_queue(slurm_lab, 6)
    finishing = jobs[2:4]  # pending when the engine reads, cancelled before it writes
    # indexed before the restart: a job still without its index after it answers "try again" for a while
    slurm_lab.wait_indexed(jobs)
    reached, go = tmp_path / "reached", tmp_path / "go"
    # the first batch of writes waits (at most 120 s) until the test has restarted slurmctld; two of
    # its lines are for jobs that are gone by then
    bin_dir = wrapper_bin(slurm_lab, tmp_path, scontrol=(
        f'if {{ {WRITES}; }} && [ ! -e {reached} ]; then\n'
        f'  touch {reached}; i=0\n'
        f'  while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done\n'
        f'fi\n'
        f'exec @BIN@/scontrol "$@"\n'
    ))
    run = subprocess.Popen([sys.executable, "-m", "dike_slurm", "run", "--once", "--apply"],
                           env=engine.environ(DIKE_SLURM__BIN_DIR=str(bin_dir), DIKE_SLURM__COMMAND_TIMEOUT_S="150",
                                              DIKE_ENGINE__CYCLE_DEADLINE_S="300"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    try:
        slurm_lab.wait_for(reached.exists, 120, "the engine did not reach its first write")
        slurm_lab.run("scancel", *map(str, finishing))
        slurm_lab.wait_for(lambda: not set(finishing) & set(slurm_lab.job_ids()), 60, "cancelled jobs still listed")
        stop_daemon(slurm_lab, "slurmctld")
        restart = start_daemon(slurm_lab, "slurmctld")
    finally:
        go.touch()
        stdout, stderr = run.communicate(timeout=300)
    assert "Traceback" not in stderr, stderr
    assert run.returncode == 0, stdout + stderr
    survivors = [j for j in jobs if j not in finishing]
    assert set(survivors) <= set(slurm_lab.job_ids())  # job ids unchanged across the restart
    rows = engine.audit()
    gone = [r for r in rows if r["job_id"] in finishing]
    answers = [(r["job_id"], r["ok"], r["message"]) for r in rows]
    assert gone and all(not r["ok"] and re.search("already finished|Invalid job id", r["message"])
                        for r in gone), answers
    assert all(r["ok"] for r in rows if r["job_id"] not in finishing), answers
    assert not any(r["message"].startswith("unconfirmed") for r in rows)
    with engine.db() as db:
        cycle = db.execute("SELECT * FROM cycles ORDER BY id DESC LIMIT 1").fetchone()
        owned = {r[0] for r in db.execute("SELECT DISTINCT job_id FROM owned")}
    assert cycle["errors"] == 0 and not owned & set(finishing)  # gone jobs are not errors, nor owned
    for job in survivors[1:]:  # the written values survived (written after the restart)
        assert admin_comment(slurm_lab, job).startswith("dike:level="), job
    proc = engine("run", "--once", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(r["job_id"] in finishing for r in engine.audit()[len(rows):])  # never written again
    print(f"FIGURES ctld restarted between read and writes: restart {restart:.1f}s, {len(gone)} write(s) to "
          f"finished jobs audited as gone ({gone[0]['message']!r}), 0 errors")
