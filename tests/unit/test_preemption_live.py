"""The live engine's preemption path: write-ahead audit of requeues, the grace signal, the argv."""

from __future__ import annotations

from dataclasses import replace

from engine_fixtures import NOW, TOPOLOGY, config, nodes, pending, running
from test_backend_contract import Recorder, backend

from fakes import FakeBackend
from dike_slurm.domain.fields import JobField
from dike_slurm.cycle.engine import Engine
from dike_slurm.domain.model import NO_PLACEMENT, Placement
from dike_slurm.store.state import StateStore

OPTED = {"requeueable": True, "comment": "dike:preemptible"}
PREEMPTING = {"thresholds_gpuh": [1.0, 8.0], "preemption": True, "min_runtime_s": 600, "steer_light_jobs": False}


def test_the_grace_signal_is_one_scancel_call():
    recorder = Recorder()
    assert backend(recorder).signal(53, "USR1").ok
    assert recorder.argvs == [["scancel", "--batch", "--signal=USR1", "53"]]


def cluster_with_a_victim(time: float, pinned: bool = False) -> FakeBackend:
    # started at NOW - 3600 whatever the cycle's time: 32 GPU-hours and more, level 2
    victim = running(1, "alice", gpus=32, ran=3600, node="n1", **OPTED)
    # after the first cycle Slurm holds the pin the engine wrote on the blocked job
    blocked = pending(2, "bob", gpus=8, waited=60, placement=Placement(require_nodes=("n1",)) if pinned else NO_PLACEMENT)
    return FakeBackend([victim, blocked], nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=time)


def test_with_a_grace_signal_the_victim_is_signalled_then_requeued_once_the_grace_has_passed(tmp_path):
    cfg = config(tmp_path, engine={"preempt_signal": "USR1", "preempt_grace_s": 90}, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    first = cluster_with_a_victim(NOW)
    report = Engine(cfg, first, store).cycle(apply=True)
    assert first.signalled == [(1, "USR1")] and first.requeued == []
    assert any("signalled USR1" in note for note in report.notes)
    pins = [dict(u.values)[JobField.REQUIRED_NODES] for u in first.applied if JobField.REQUIRED_NODES in u.fields]
    assert pins == [("n1",)]
    # 60 s later: still inside the grace period, nothing new is sent and the pin stays
    inside = cluster_with_a_victim(NOW + 60, pinned=True)
    Engine(cfg, inside, store).cycle(apply=True)
    assert inside.signalled == [] and inside.requeued == []
    assert not any(JobField.REQUIRED_NODES in u.fields for u in inside.applied)
    # 120 s later: the grace has passed, the job is requeued without a second signal
    after = cluster_with_a_victim(NOW + 120, pinned=True)
    Engine(cfg, after, store).cycle(apply=True)
    assert after.signalled == [] and after.requeued == [1]
    assert not any(JobField.REQUIRED_NODES in u.fields for u in after.applied)
    actions = [(e.action, e.ok) for e in store.audit_log(1) if e.action in ("signal", "requeue")]
    assert actions == [("signal", True), ("requeue", True)]


def test_a_requeue_is_audited_before_slurm_is_called(tmp_path):
    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    seen: list[list] = []

    class Watching(FakeBackend):
        def requeue(self, job_id):
            seen.append([(e.action, e.ok, e.message) for e in store.audit_log(job_id) if e.action == "requeue"])
            return super().requeue(job_id)

    fake = Watching(
        list(cluster_with_a_victim(NOW).jobs.values()), nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=NOW
    )
    Engine(cfg, fake, store).cycle(apply=True)
    assert fake.requeued == [1]
    assert seen == [[("requeue", False, "unconfirmed: the engine stopped before Slurm answered")]]
    assert [(e.action, e.ok) for e in store.audit_log(1)][-1] == ("requeue", True)


def test_no_preemption_without_the_pin_and_value_of_the_job_it_is_for(tmp_path):
    """Freed nodes without the pin and the protected value would go to whatever Slurm starts next:
    a failed or held-back write of the blocked job skips its victims' requeue, audited with why."""
    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    failing = cluster_with_a_victim(NOW)
    failing.failing_jobs.add(2)
    store = StateStore(cfg.engine.state_db)
    Engine(cfg, failing, store).cycle(apply=True)
    assert failing.requeued == []
    assert [(e.action, e.message) for e in store.audit_log(1) if e.action != "update"] == [
        ("skipped", "job 2's pin and priority were not written")]
    # written: the same plan requeues, and the blocked job has the top of the span and its pin
    written = cluster_with_a_victim(NOW + 60)
    Engine(cfg, written, StateStore(cfg.engine.state_db)).cycle(apply=True)
    assert written.requeued == [1]
    update = {field: value for u in written.applied if u.job_id == 2 for field, value in u.values}
    assert update[JobField.REQUIRED_NODES] == ("n1",) and update[JobField.SITE_FACTOR] == cfg.engine.priority_span


def follow(cfg, store, time: float, jobs) -> "CycleReport":  # noqa: F821
    backend = FakeBackend(jobs, nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=time)
    return Engine(cfg, backend, store).cycle(apply=True)


def test_a_preemption_lands_when_its_job_starts_on_the_freed_node(tmp_path):
    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    first = cluster_with_a_victim(NOW)
    Engine(cfg, first, store).cycle(apply=True)
    assert first.requeued == [1] and [(r.job_id, r.nodes, r.victims) for r in store.freed_rooms()] == [(2, ("n1",), (1,))]
    report = follow(cfg, store, NOW + 60, [pending(1, "alice", gpus=32, waited=60, **OPTED),
                                           running(2, "bob", gpus=8, ran=30, node="n1")])
    assert [o.outcome for o in report.plan.room_outcomes] == ["landed"] and store.freed_rooms() == []
    assert report.preemption_totals == {"landed": 1, "wasted": 0, "gone": 0}
    audited = [(e.action, e.change, e.ok, e.message) for e in store.audit_log(2) if e.action == "preemption"]
    assert audited == [("preemption", "landed", True, "job 2 started on n1, freed for it")]


def test_a_preemption_is_wasted_when_its_job_still_waits_two_cycles_after_the_victims_left(tmp_path):
    cfg = config(tmp_path, policies={"dike": {**PREEMPTING, "protect_freed_nodes": False}})
    store = StateStore(cfg.engine.state_db)
    Engine(cfg, cluster_with_a_victim(NOW), store).cycle(apply=True)
    # others took n1: the job the room was for waits, its victim requeued (held by Slurm)
    taken = [running(3, "carol", gpus=8, ran=20, node="n1"),
             pending(1, "alice", gpus=32, waited=60, eligible_time=NOW + 600, **OPTED),
             pending(2, "bob", gpus=8, waited=120, placement=Placement(require_nodes=("n1",)))]
    for step, cycles_since_end in ((1, 1), (2, 2)):
        report = follow(cfg, store, NOW + 60 * step, taken)
        assert report.plan.room_outcomes == () and [r.cycles_since_end for r in store.freed_rooms()] == [cycles_since_end]
    report = follow(cfg, store, NOW + 180, taken)
    assert [(o.outcome, o.why) for o in report.plan.room_outcomes] == [
        ("wasted", "job 2 still waits 2 cycles after its victims left n1")]
    assert "preemption wasted: job 2 still waits 2 cycles after its victims left n1" in report.plan.notes
    assert report.preemption_totals["wasted"] == 1 and store.freed_rooms() == []
    assert [(e.change, e.ok) for e in store.audit_log(2) if e.action == "preemption"] == [("wasted", False)]


def test_a_grace_period_does_not_count_against_the_preemption():
    from dike_slurm.domain.freed_rooms import FreedRoom, follow_rooms

    room = FreedRoom(2, ("n1",), (1,), NOW)
    victim_still_on_n1 = {1: running(1, gpus=32, node="n1"), 2: pending(2, "bob", gpus=8)}
    still_open, settled = follow_rooms([room], victim_still_on_n1)
    assert settled == [] and still_open == [room]
    elsewhere = {2: running(2, "bob", gpus=8, node="n3")}
    assert [(o.outcome, o.why) for o in follow_rooms([room], elsewhere)[1]] == [
        ("wasted", "job 2 started on n3, not on n1, freed for it")]
    assert [o.outcome for o in follow_rooms([room], {})[1]] == ["gone"]


def test_a_pin_outlives_its_run_and_is_cleared_once_the_job_is_requeued_or_by_revert(tmp_path):
    """Slurm keeps a running job's ReqNodeList (an update would shrink the job) and applies it
    again after a requeue: the engine keeps owning the pin, revert names it instead of forgetting
    it, and once the job is pending again without a live preemption the pin is cleared."""
    from dike_slurm.domain.model import JobState

    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    Engine(cfg, cluster_with_a_victim(NOW), store).cycle(apply=True)
    ran = FakeBackend([running(2, "bob", gpus=8, ran=30, node="n1", placement=Placement(require_nodes=("n1",)))],
                      nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=NOW + 60)
    Engine(cfg, ran, store).cycle(apply=True)
    assert JobField.REQUIRED_NODES in store.owned()[2]
    plan = Engine(cfg, ran, store).revert_plan()
    assert [(j, f, why.split(":")[0]) for j, f, why in plan.kept] == [
        (2, JobField.REQUIRED_NODES, "ReqNodeList n1 stays on the running job")]
    assert not any(j == 2 and f is JobField.REQUIRED_NODES for j, f, _ in plan.released)
    # requeued: pending with the pin Slurm kept, no preemption followed for it any more
    requeued = FakeBackend([pending(2, "bob", gpus=8, waited=10, placement=Placement(require_nodes=("n1",)))],
                           nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=NOW + 600)
    Engine(cfg, requeued, store).cycle(apply=True)
    assert requeued.jobs[2].placement.require_nodes == () and requeued.jobs[2].state is JobState.PENDING
    assert JobField.REQUIRED_NODES not in store.owned().get(2, {})


def test_a_job_that_started_before_its_constraint_was_cleared_stays_owned(tmp_path):
    """Between the read and the write the job started: Slurm refuses the placement write ("no
    longer pending") but keeps the constraint, so the engine keeps owning it (to clear it after
    a requeue); a job that is gone for good is let go of."""
    from dike_slurm.domain.model import JobState

    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    Engine(cfg, cluster_with_a_victim(NOW), store).cycle(apply=True)  # pins job 2 to n1

    class StartsMeanwhile(FakeBackend):
        def read_cluster(self):
            state = super().read_cluster()
            self.jobs[2] = replace(self.jobs[2], state=JobState.RUNNING, nodes=("n2",))
            return state

    # job 2 waits, pinned, with no preemption left for it on n1: the engine clears the pin
    backend = StartsMeanwhile([pending(2, "bob", gpus=8, waited=120, placement=Placement(require_nodes=("n1",))),
                               running(3, "carol", gpus=8, ran=100, node="n1")],
                              nodes({f"n{i}": 8 for i in range(1, 5)}), TOPOLOGY, time=NOW + 60)
    with store.transaction():
        store.set_freed_rooms([])  # no preemption followed for it any more
    report = Engine(cfg, backend, store).cycle(apply=True)
    refused = [o for w, o in report.outcomes if w.job_id == 2 and not o.ok]
    assert refused and "no longer pending" in refused[0].message
    assert JobField.REQUIRED_NODES in store.owned()[2]


def test_explain_says_whether_the_preemption_for_a_job_landed(tmp_path):
    from dike_slurm.cli.explain import explain_lines
    from dike_slurm.cli.views import audit_row

    cfg = config(tmp_path, policies={"dike": PREEMPTING})
    store = StateStore(cfg.engine.state_db)
    Engine(cfg, cluster_with_a_victim(NOW), store).cycle(apply=True)
    follow(cfg, store, NOW + 60, [pending(1, "alice", gpus=32, waited=60, **OPTED),
                                  running(2, "bob", gpus=8, ran=30, node="n1")])
    document = {"job_id": 2, "status": "finished", "query": "2", "job": None, "owned": [],
                "audit": [audit_row(e) for e in store.audit_log(2) if e.action == "preemption"]}
    lines = explain_lines(document)
    assert any(line.endswith("preemption for it landed: job 2 started on n1, freed for it") for line in lines), lines
    assert any("requeued 1 at" in line and "to free n1" in line for line in lines), lines
