"""Guardrails: the circuit breaker latches until an operator resets it, and the engine's own
checks of every requeue a policy asks for (opt-in, min_runtime, max_preemptions, rate limit)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from engine_fixtures import NOW, config, engine, nodes, pending, running

from dike_slurm.backends.base import FakeBackend
from dike_slurm.decisions import Requeue
from dike_slurm.engine import Engine
from dike_slurm.registry import default_registry
from dike_slurm.state import JobMemory, StateStore


def cluster(*jobs, alloc=None):
    return FakeBackend(jobs, nodes(alloc), time=NOW)


def test_error_breaker_latches_until_an_operator_resets_it(tmp_path):
    backend = cluster(*[pending(i, f"u{i}") for i in range(1, 11)])
    backend.failing_jobs = set(range(1, 11))
    cfg = config(tmp_path, engine={"breaker_max_errors": 2})
    first = engine(cfg, backend).cycle(apply=True)
    assert first.errors == 2
    store = StateStore(cfg.engine.state_db)
    assert "2 failed writes" in (store.breaker() or "")
    skipped = [e for e in store.audit_log() if e.action == "skipped"]
    assert len(skipped) == len(first.plan.writes) - 2  # every write not attempted is in the audit
    backend.failing_jobs = set()  # Slurm is fine again: the engine still writes nothing
    second = engine(cfg, backend).cycle(apply=True)
    assert second.outcomes == () and backend.applied == []
    assert any("breaker reset" in n for n in second.notes)
    store.reset_breaker()
    store._db.commit()
    third = engine(cfg, backend).cycle(apply=True)
    assert third.errors == 0 and len(backend.applied) == len(third.plan.writes) > 0


def test_mass_rewrite_breaker_latches(tmp_path):
    jobs = [pending(i, "alice") for i in range(1, 31)]
    backend = cluster(*jobs)
    cfg = config(tmp_path, engine={"breaker_min_jobs": 20})
    engine(cfg, backend).cycle(apply=True)
    backend.site_factors = {i: 1 for i in backend.site_factors}  # someone reset every value
    stopped = engine(cfg, backend).cycle(apply=True)
    assert stopped.plan.writes == () and any("circuit breaker" in n for n in stopped.plan.notes)
    assert "would change" in (StateStore(cfg.engine.state_db).breaker() or "")
    backend.applied.clear()
    report = engine(cfg, backend).cycle(apply=True)
    assert backend.applied == [] and any("tripped" in n for n in report.notes)


def test_breaker_cli_status_and_reset(tmp_path):
    store = StateStore(tmp_path / "state.sqlite")
    with store.transaction():
        store.trip_breaker("5 failed writes in cycle 3")
    store.close()
    toml = tmp_path / "dike.toml"
    toml.write_text(f'[engine]\nstate_db = "{tmp_path / "state.sqlite"}"\n')

    def dike(*args):
        return subprocess.run([sys.executable, "-m", "dike_slurm", *args, "-c", str(toml)], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})

    status = dike("breaker", "status")
    assert status.returncode == 1 and "TRIPPED: 5 failed writes in cycle 3" in status.stdout
    reset = dike("breaker", "reset")
    assert reset.returncode == 0 and "reset" in reset.stdout, reset.stderr
    assert dike("breaker", "status").returncode == 0
    entry = StateStore(tmp_path / "state.sqlite").audit_log()[-1]
    assert entry.action == "breaker-reset" and "5 failed writes" in entry.change
    bad = dike("breaker", "explode")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


class ForcedRequeues:
    """The dike policy, asking to requeue the given jobs whatever they are (to test the engine's guard)."""

    def __init__(self, ids):
        self.inner = default_registry().create("dike")
        self.ids = ids

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, snapshot, params, rng):
        decisions = self.inner.decide(snapshot, params, rng)
        return replace(decisions, requeues=tuple(Requeue(i, "forced by the test") for i in self.ids))


def test_requeues_only_opted_in_old_enough_not_too_often_and_rate_limited(tmp_path):
    cfg = config(tmp_path, engine={"max_requeues_per_cycle": 2},
                 policies={"dike": {"min_runtime_s": 600, "max_preemptions": 2}})
    jobs = [
        running(1, "a", ran=3600, node="n1", requeueable=True),   # kept
        running(2, "b", ran=3600, node="n1", requeueable=False),  # did not opt in
        running(3, "c", ran=60, node="n2", requeueable=True),     # too young
        running(4, "d", ran=3600, node="n2", requeueable=True),   # preempted twice already
        running(5, "e", ran=3600, node="n3", requeueable=True),   # kept
        running(6, "f", ran=3600, node="n3", requeueable=True),   # over the rate limit
        pending(7, "g"),                                          # not running
    ]
    backend = cluster(*jobs, alloc={"n1": 2, "n2": 2, "n3": 2})
    store = StateStore(cfg.engine.state_db)
    with store.transaction():
        store.remember([JobMemory(4, NOW, requeues=2)])
    eng = Engine(cfg, backend, store, policy=ForcedRequeues([1, 2, 3, 4, 5, 6, 7]))
    report = eng.cycle(apply=True)
    assert backend.requeued == [1, 5]
    notes = "\n".join(report.plan.notes)
    assert "job 2 refused: did not opt in" in notes
    assert "job 3 refused: ran less than min_runtime_s=600" in notes
    assert "job 4 refused: already preempted 2 time(s)" in notes
    assert "job 6 refused: max_requeues_per_cycle=2 reached" in notes
    assert "job 7 refused: not a managed running job" in notes


def test_max_changes_per_cycle_is_a_hard_cap(tmp_path):
    backend = cluster(*[pending(i, f"u{i}") for i in range(1, 41)])
    cfg = config(tmp_path, engine={"max_changes_per_cycle": 5})
    report = engine(cfg, backend).cycle(apply=True)
    assert len(backend.applied) == 5 and len(report.plan.held_back) == 35
