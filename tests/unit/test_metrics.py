"""The Prometheus textfile: what an applied cycle exports, a paused and a failed one, held-back
writes and their age, the service prior's error, and labels that never name a job or a user."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_fixtures import NOW, TOPOLOGY, config, engine, finished_run, nodes, pending, running

from fakes import FakeBackend
from dike_slurm.cycle.engine import SACCT_OVERLAP_S
from dike_slurm.errors import SlurmError
from dike_slurm.ops.metrics import MetricsWatch, exported_names, quantile
from dike_slurm.domain.model import JobState
from dike_slurm.ops.service import Service, Signals, run_cycle

BOUNDED_LABELS = {"level", "partition", "quantile", "phase", "outcome", "reason", "policy", "strategy"}


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(name, sorted labels): value} of a textfile."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def value(got: dict, name: str, **labels: str) -> float:
    return got[name, tuple(sorted(labels.items()))]


# The prior in force whatever its power: the invented histories below have no spread (every job ran
# an hour), so their power is 0 and at the default (prior_min_power 0) the prior would step aside.
PRIOR_WHATEVER_ITS_POWER = {"policies": {"dike": {"thresholds_gpuh": [1.0, 8.0], "steer_light_jobs": False,
                                                  "prior_min_power": -1.0}}}


def setup(tmp_path: Path, jobs, sections: dict | None = None, **engine_settings):
    cfg = config(tmp_path, engine={"metrics_file": str(tmp_path / "m" / "dike.prom"), **engine_settings},
                 **(sections or {}))
    backend = FakeBackend(jobs, nodes({"n1": 8, "n2": 8, "n3": 8, "n4": 8}), TOPOLOGY)
    return cfg, backend, engine(cfg, backend)


def test_an_applied_cycle_exports_levels_waits_writes_and_phases(tmp_path):
    jobs = [pending(i, waited=w, partition="gpu,debug" if i == 3 else "gpu") for i, w in
            [(1, 60.0), (2, 600.0), (3, 6000.0)]]
    cfg, _backend, eng = setup(tmp_path, jobs)
    report = run_cycle(eng, apply=True)
    got = samples(cfg.engine.metrics_file)

    assert {name for name, _ in got} <= exported_names()
    assert value(got, "dike_slurm_applied") == 1 and value(got, "dike_slurm_paused") == 0
    assert value(got, "dike_slurm_breaker_latched") == 0
    assert value(got, "dike_slurm_cycle_timestamp_seconds") == NOW
    planned = len(report.plan.writes) + len(report.plan.held_back)
    assert planned > 0 and value(got, "dike_slurm_writes_planned") == planned
    assert value(got, "dike_slurm_changes_written") == planned and value(got, "dike_slurm_writes_skipped") == 0
    assert value(got, "dike_slurm_pending_jobs", level="0", partition="gpu") == 3
    assert value(got, "dike_slurm_pending_jobs", level="0", partition="debug") == 1
    assert value(got, "dike_slurm_pending_wait_seconds", level="0", quantile="0.5") == 600.0
    assert value(got, "dike_slurm_pending_wait_seconds", level="0", quantile="0.95") == 6000.0
    assert {dict(labels)["phase"] for name, labels in got if name == "dike_slurm_cycle_phase_seconds"} == {
        "read", "decide", "diff", "write"}
    assert value(got, "dike_slurm_cycles_total") == 1 and value(got, "dike_slurm_cycle_failures_total") == 0
    assert value(got, "dike_slurm_policy_info", policy="dike", strategy="site_factor") == 1
    for _name, labels in got:
        assert {key for key, _ in labels} <= BOUNDED_LABELS


def test_a_paused_engine_reads_unlike_a_quiet_one(tmp_path):
    cfg, _backend, eng = setup(tmp_path, [pending(1), pending(2)])
    with eng.store.transaction():
        eng.store.pause("maintenance")
    run_cycle(eng, apply=True)
    paused = samples(cfg.engine.metrics_file)
    assert value(paused, "dike_slurm_paused") == 1 and value(paused, "dike_slurm_changes_written") == 0
    assert value(paused, "dike_slurm_writes_skipped") == value(paused, "dike_slurm_writes_planned") == 2

    with eng.store.transaction():
        eng.store.resume()
    run_cycle(eng, apply=True)  # writes both jobs
    run_cycle(eng, apply=True)  # nothing left to write: quiet
    quiet = samples(cfg.engine.metrics_file)
    assert value(quiet, "dike_slurm_paused") == 0 and value(quiet, "dike_slurm_changes_written") == 0
    assert value(quiet, "dike_slurm_writes_planned") == 0


def test_a_failed_cycle_counts_and_keeps_the_last_cycle_that_ran(tmp_path, monkeypatch):
    cfg, backend, eng = setup(tmp_path, [pending(1)])
    watch = MetricsWatch()
    run_cycle(eng, apply=True, watch=watch, wall_clock=lambda: NOW + 5)

    def down():
        raise SlurmError("squeue: timed out after 30 s")

    monkeypatch.setattr(backend, "read_cluster", down)
    for _ in range(2):
        with pytest.raises(SlurmError):
            run_cycle(eng, apply=True, watch=watch, wall_clock=lambda: NOW + 65)
    got = samples(cfg.engine.metrics_file)
    assert value(got, "dike_slurm_cycle_failures_total") == 2
    assert value(got, "dike_slurm_cycle_failures_in_a_row") == 2
    assert value(got, "dike_slurm_last_failure_timestamp_seconds") == NOW + 65
    assert value(got, "dike_slurm_cycle_timestamp_seconds") == NOW  # the last cycle that ran


def test_a_dry_run_writes_no_textfile(tmp_path):
    cfg, _backend, eng = setup(tmp_path, [pending(1)])
    run_cycle(eng, apply=False)
    assert not cfg.engine.metrics_file.exists()


def test_held_back_writes_are_counted_and_aged_over_cycles(tmp_path):
    cfg, backend, eng = setup(tmp_path, [pending(i) for i in range(1, 5)], max_changes_per_cycle=1)
    watch = MetricsWatch()
    run_cycle(eng, apply=True, watch=watch)
    first = samples(cfg.engine.metrics_file)
    assert value(first, "dike_slurm_writes_held_back", reason="max_changes") == 3
    assert value(first, "dike_slurm_oldest_held_write_age_seconds") == 0
    backend.time += 60
    run_cycle(eng, apply=True, watch=watch)
    second = samples(cfg.engine.metrics_file)
    assert value(second, "dike_slurm_writes_held_back", reason="max_changes") == 2
    assert value(second, "dike_slurm_oldest_held_write_age_seconds") == 60
    assert value(second, "dike_slurm_writes_held_back", reason="write_budget") == 0


def test_requeues_signals_and_the_gpu_hours_they_cost(tmp_path):
    jobs = [running(10, user="bob", gpus=8, ran=7200.0, node=f"n{i}", requeueable=True, comment="dike:preemptible")
            for i in (1,)] + [running(11 + i, gpus=8, node=f"n{i}") for i in (2, 3, 4)] + [pending(20, gpus=8)]
    cfg, backend, eng = setup(tmp_path, jobs, preempt_signal="USR1", preempt_grace_s=30)
    # bob's job has run 16 GPU-h: above the second threshold (8), so it is a victim for job 20 at level 0
    watch = MetricsWatch()
    report = run_cycle(eng, apply=True, watch=watch)
    got = samples(cfg.engine.metrics_file)
    assert report.signals == len(backend.signalled) == 1
    assert value(got, "dike_slurm_grace_signals_last_cycle") == 1 and value(got, "dike_slurm_requeues_last_cycle") == 0
    backend.time += 31
    run_cycle(eng, apply=True, watch=watch)
    got = samples(cfg.engine.metrics_file)
    assert backend.requeued == [10]
    assert value(got, "dike_slurm_requeues_last_cycle") == 1 and value(got, "dike_slurm_requeues_total") == 1
    assert value(got, "dike_slurm_grace_signals_total") == 1
    assert value(got, "dike_slurm_requeue_gpu_hours_lost_last_cycle") == pytest.approx(8 * (7200 + 31) / 3600)


def test_the_prior_is_judged_on_jobs_that_finished_since_the_last_cycle(tmp_path):
    history = [finished_run(100 + i, "alice", 1, NOW - 80_000 + i * 1000, NOW - 80_000 + i * 1000 + 3600)
               for i in range(50)]  # alice's 1-GPU jobs ran an hour each: the prior's minimum history
    cfg, backend, eng = setup(tmp_path, [pending(1, name="")], PRIOR_WHATEVER_ITS_POWER)
    backend.records = history
    report = run_cycle(eng, apply=True)
    assert report.plan.expected[1].gpu_s == pytest.approx(3600)
    backend.jobs[1] = backend.jobs[1].with_changes(state=JobState.COMPLETED)
    backend.records = history + [finished_run(1, "alice", 1, NOW + 10, NOW + 10 + 7200)]
    backend.time += 7300
    watch = MetricsWatch()
    report = run_cycle(eng, apply=True, watch=watch)
    assert report.plan.prior_judged == ((pytest.approx(3600), 7200.0),)
    got = samples(cfg.engine.metrics_file)
    assert value(got, "dike_slurm_prior_jobs_judged") == 1
    assert value(got, "dike_slurm_prior_ratio", quantile="0.5") == pytest.approx(2.0)
    assert value(got, "dike_slurm_prior_error_factor", quantile="0.9") == pytest.approx(2.0)


def test_quantiles_are_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert quantile(values, 0.5) == 10 and quantile(values, 0.95) == 19 and quantile([7.0], 0.95) == 7


def test_the_service_keeps_its_counters_across_cycles_and_a_failure(tmp_path, monkeypatch):
    cfg, backend, eng = setup(tmp_path, [pending(1)])
    failing = [False, True, False]  # the second of three cycles fails
    read = backend.read_cluster
    reads = []

    def read_or_fail():
        reads.append(1)
        if failing[len(reads) - 1]:
            raise SlurmError("squeue: timed out after 30 s")
        return read()

    monkeypatch.setattr(backend, "read_cluster", read_or_fail)
    clock = [0.0]
    signals = Signals()

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if len(reads) == len(failing):
            signals.stop = signal.SIGTERM

    service = Service(cfg, eng.store, lambda: cfg, apply=True, signals=signals, make_engine=lambda c, s: eng,
                      clock=lambda: clock[0], sleep=sleep)
    assert service.run() is False
    got = samples(cfg.engine.metrics_file)
    assert value(got, "dike_slurm_cycles_total") == 2 and value(got, "dike_slurm_cycle_failures_total") == 1
    assert value(got, "dike_slurm_cycle_failures_in_a_row") == 0
    assert value(got, "dike_slurm_last_failure_timestamp_seconds") > 0


def test_pending_jobs_beyond_the_head_window_are_counted(tmp_path):
    cfg, _backend, eng = setup(tmp_path, [pending(i, waited=60.0 * i) for i in range(1, 4)], head_window=1)
    run_cycle(eng, apply=True)
    got = samples(cfg.engine.metrics_file)
    assert value(got, "dike_slurm_head_window_jobs") == 1
    assert value(got, "dike_slurm_pending_jobs_beyond_head_window") == 2
    assert value(got, "dike_slurm_pending_jobs", level="0", partition="gpu") == 3


def test_exempt_jobs_are_counted_by_why(tmp_path):
    cfg = config(tmp_path, engine={"metrics_file": str(tmp_path / "m" / "dike.prom")},
                 scope={"exempt_qos": ["urgent"], "exempt_accounts": ["ops"]})
    jobs = [pending(1, qos="urgent"), pending(2, qos="urgent"), pending(3, account="ops"),
            pending(4, comment="dike:exempt"), pending(5)]
    run_cycle(engine(cfg, FakeBackend(jobs, nodes(), TOPOLOGY)), apply=True)
    got = samples(cfg.engine.metrics_file)
    assert {why: value(got, "dike_slurm_jobs_exempt", reason=why) for why in
            ("qos", "partition", "account", "admin_comment", "comment")} == {
        "qos": 2, "partition": 0, "account": 1, "admin_comment": 0, "comment": 1}
    assert value(got, "dike_slurm_jobs", level="0") == 1


def test_a_job_that_left_without_a_final_run_in_accounting_is_dropped_unjudged(tmp_path):
    history = [finished_run(100 + i, "alice", 1, NOW - 80_000 + i * 1000, NOW - 80_000 + i * 1000 + 3600)
               for i in range(50)]  # the prior's minimum history (min_history_jobs)
    cfg, backend, eng = setup(tmp_path, [pending(1)], PRIOR_WHATEVER_ITS_POWER)
    backend.records = history
    assert 1 in run_cycle(eng, apply=True).plan.expected
    backend.jobs[1] = backend.jobs[1].with_changes(state=JobState.CANCELLED)  # cancelled while pending
    backend.time += 60
    assert run_cycle(eng, apply=True).plan.prior_judged == ()
    backend.time += SACCT_OVERLAP_S + 1
    assert run_cycle(eng, apply=True).plan.prior_judged == ()  # still no run: dropped
    backend.records = history + [finished_run(1, "alice", 1, NOW, NOW + 100)]  # a record that comes too late
    backend.time += 60
    assert run_cycle(eng, apply=True).plan.prior_judged == ()
