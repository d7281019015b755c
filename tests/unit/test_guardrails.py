"""Guardrails: the circuit breaker latches until an operator resets it, and the engine's own
checks of every requeue a policy asks for (opt-in, min_runtime, max_preemptions, rate limit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import in_process
from engine_fixtures import NOW, config, engine, nodes, pending, running

from dike_slurm.cycle.apply import Stop
from fakes import FakeBackend
from dike_slurm.domain.fields import JobField
from dike_slurm.cycle.plan import Guard
from dike_slurm.domain.decisions import Requeue, SetPlacement
from dike_slurm.domain.model import Placement
from dike_slurm.cycle.engine import Engine
from dike_slurm.registry import default_registry
from dike_slurm.store.state import JobMemory, StateStore


def cluster(*jobs, alloc=None):
    return FakeBackend(jobs, nodes(alloc), time=NOW)


def test_error_breaker_latches_until_an_operator_resets_it(tmp_path):
    backend = cluster(*[pending(i, f"u{i}") for i in range(1, 11)])
    backend.failing_jobs = set(range(1, 11))
    cfg = config(tmp_path, engine={"breaker_max_errors": 2})
    first = engine(cfg, backend).cycle(apply=True)
    assert first.errors == 2 and first.stopped is Stop.FAILED_WRITES
    store = StateStore(cfg.engine.state_db)
    assert "2 failed writes" in (store.breaker() or "")
    skipped = [e for e in store.audit_log() if e.action == "skipped"]
    assert len(skipped) == len(first.plan.writes) - 2  # every write not attempted is in the audit
    backend.failing_jobs = set()  # Slurm is fine again: the engine still writes nothing
    second = engine(cfg, backend).cycle(apply=True)
    assert second.outcomes == () and backend.applied == [] and second.stopped is Stop.BREAKER
    assert any("breaker reset" in n for n in second.notes)
    store.reset_breaker()
    store._db.commit()
    third = engine(cfg, backend).cycle(apply=True)
    assert third.errors == 0 and len(backend.applied) == len(third.plan.writes) > 0 and third.stopped is None


def test_mass_rewrite_breaker_latches(tmp_path):
    jobs = [pending(i, "alice") for i in range(1, 31)]
    backend = cluster(*jobs)
    engine(config(tmp_path, engine={"breaker_min_jobs": 20}), backend).cycle(apply=True)
    # a wrong configuration would move every value at once (a value someone else set is left alone:
    # test_site_values.py)
    cfg = config(tmp_path, engine={"breaker_min_jobs": 20, "priority_span": 500_000})
    stopped = engine(cfg, backend).cycle(apply=True)
    assert stopped.plan.writes == () and any("circuit breaker" in n for n in stopped.plan.notes)
    # the breaker is a typed guard outcome carried with its text, not found by the text's prefix
    (guard,) = stopped.plan.guards
    assert guard.guard is Guard.BREAKER and guard.text in stopped.plan.notes and stopped.plan.breaker == guard.text
    assert stopped.stopped is Stop.BREAKER
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
        return in_process.dike_slurm(*args, "-c", str(toml), env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})

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
    """The dike policy, asking for the given requeues (and pins) whatever the jobs are (to test the guard)."""

    def __init__(self, requeues, pins=()):
        self.inner = default_registry().create("dike")
        self.requeues = tuple(requeues)
        self.pins = tuple(pins)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decide(self, snapshot, params, rng):
        decisions = self.inner.decide(snapshot, params, rng)
        return replace(decisions, requeues=self.requeues, placements=decisions.placements + self.pins)


def test_requeues_only_opted_in_old_enough_whole_groups_and_rate_limited(tmp_path):
    cfg = config(tmp_path, engine={"max_requeues_per_cycle": 2},
                 policies={"dike": {"min_runtime_s": 600, "min_runtime_share": 0, "thresholds_gpuh": [1.0, 8.0]}})
    opted = {"requeueable": True, "comment": "dike:preemptible"}
    jobs = [
        running(1, "a", ran=3600, node="n1", **opted),                                  # kept
        running(2, "b", ran=3600, node="n1", requeueable=False, comment="dike:preemptible"),  # Slurm: not requeueable
        running(8, "b", ran=3600, node="n1", requeueable=True),                         # site rule: not opted in
        running(3, "c", ran=60, node="n2", **opted),                                    # too young
        running(5, "e", ran=3600, node="n3", **opted),                                  # a group of two that
        running(6, "f", ran=3600, node="n3", **opted),                                  # would pass the rate limit
        running(9, "f", ran=3600, node="n4", **opted),                                  # kept
        pending(7, "g"),                                                                # not running
    ]
    backend = cluster(*jobs, alloc={"n1": 3, "n2": 1, "n3": 2, "n4": 1})
    forced = [Requeue(1, "t"), Requeue(2, "t"), Requeue(8, "t"), Requeue(3, "t"),
              Requeue(5, "t", for_job=7), Requeue(6, "t", for_job=7), Requeue(9, "t"), Requeue(7, "t")]
    pin = SetPlacement(7, Placement(require_nodes=("n3",)), "pinned for the group")
    eng = Engine(cfg, backend, StateStore(cfg.engine.state_db), policy=ForcedRequeues(forced, [pin]))
    report = eng.cycle(apply=True)
    assert backend.requeued == [1, 9]
    notes = "\n".join(report.plan.notes)
    assert "job 2 refused: may not be preempted" in notes
    assert "job 8 refused: may not be preempted" in notes
    assert "job 3 refused: ran less than the policy's minimum run of 600s" in notes
    assert "job 5 refused: max_requeues_per_cycle=2 reached" in notes
    assert "job 6 refused: max_requeues_per_cycle=2 reached" in notes
    assert "job 7 refused: not a managed running job" in notes
    # the refused group's pin is dropped with it: job 7 gets no ReqNodeList
    assert not any(u.job_id == 7 and JobField.REQUIRED_NODES in u.fields for u in backend.applied)


def test_max_changes_per_cycle_is_a_hard_cap(tmp_path):
    backend = cluster(*[pending(i, f"u{i}") for i in range(1, 41)])
    cfg = config(tmp_path, engine={"max_changes_per_cycle": 5})
    report = engine(cfg, backend).cycle(apply=True)
    assert len(backend.applied) == 5 and len(report.plan.held_back) == 35
    assert [g.guard for g in report.plan.guards] == [Guard.MAX_CHANGES] and report.plan.breaker == ""


def test_why_a_cycle_stopped_writing_is_typed(tmp_path):
    """A pause, Slurm refusing for lack of rights, and a clean cycle: each report says which, typed."""
    backend = cluster(*[pending(i, f"u{i}") for i in range(1, 6)])
    cfg = config(tmp_path)
    paused = engine(cfg, backend)
    with paused.store.transaction():
        paused.store.pause("maintenance")
    report = paused.cycle(apply=True)
    assert report.stopped is Stop.PAUSED and report.paused and backend.applied == []
    with paused.store.transaction():
        paused.store.resume()

    class Refusing(FakeBackend):
        def apply(self, update):
            outcome = super().apply(update)
            return replace(outcome, ok=False, message="Access/permission denied")

    refusing = Refusing([pending(i, f"u{i}") for i in range(1, 6)], nodes(), time=NOW)
    refused = engine(config(tmp_path / "denied"), refusing).cycle(apply=True)
    assert refused.stopped is Stop.DENIED and refused.denied and len(refused.outcomes) < len(refused.plan.writes)
    clean = engine(cfg, backend).cycle(apply=True)
    assert clean.stopped is None and len(backend.applied) == len(clean.plan.writes) > 0
