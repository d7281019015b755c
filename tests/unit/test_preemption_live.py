"""The live engine's preemption path: write-ahead audit of requeues, the grace signal, the argv."""

from __future__ import annotations

from engine_fixtures import NOW, TOPOLOGY, config, nodes, pending, running
from test_backend_contract import Recorder, backend

from dike_slurm.backends.base import FakeBackend, JobField
from dike_slurm.engine import Engine
from dike_slurm.model import NO_PLACEMENT, Placement
from dike_slurm.state import StateStore

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
