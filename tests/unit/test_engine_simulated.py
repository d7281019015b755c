"""The engine driving the replay simulator through the backend interface (slurm.backend = simulated)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest
import in_process

from dike_slurm.cycle import apply as apply_module
from dike_slurm.cycle.apply import FORGET_AFTER_S, LAST_SEEN_EVERY_S
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.sim.backend import SimulatedBackend
from dike_slurm.config import Config
from dike_slurm.cycle.engine import CyclePlan, Engine
from dike_slurm.errors import ConfigError
from dike_slurm.domain.fields import JobField
from dike_slurm.sim.kernel.replay import load_input, run_policy, sim_settings
from dike_slurm.store.state import StateStore


def generate(out: Path, *extra: str) -> Path:
    result = in_process.dike_slurm("trace", "generate", "--jobs", "80", "--nodes", "4", "--gpus-per-node", "8",
                                   "--nodes-per-leaf", "2", "--seed", "5", "--out", str(out), *extra)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("trace"))


@pytest.fixture(scope="module")
def busy_trace(tmp_path_factory) -> Path:
    """Three times the cluster's GPUs offered: heavy jobs wait behind light ones."""
    return generate(tmp_path_factory.mktemp("busy"), "--load", "3")


# The simulated cluster's cycle every 4 simulated minutes, not the default minute: a quarter of the
# cycles, and every property below still shows. Measured 2026-12-07 (apply, no fresh-engine check):
# the node hold's diffs kept 34 jobs' sides from one cycle to the next at 3 minutes, 8 at 4 and 13 at
# 5 (it kept none at 5 before); the default run's 138, 83 and 59.
REPLAY_INTERVAL_S = 240.0


def config(trace: Path, state: Path) -> Config:
    return Config.model_validate({
        # Every job opted in to preemption, as the replay's default `preemptible = 1` assumes.
        "engine": {"state_db": str(state), "interval_s": 300, "max_changes_per_cycle": 10000,
                   "breaker_min_jobs": 100000, "preemptible_partitions": ["gpu"]},
        "slurm": {"backend": "simulated", "simulated_trace": str(trace / "sacct.txt"),
                  "slurm_conf": str(trace / "slurm.conf")},
        "policies": {"dike": {"thresholds_gpuh": [1.0, 8.0]}},
        "replay": {"interval_s": REPLAY_INTERVAL_S},
    })


class SameRead:
    """The read a cycle just made, served again (accounting from the simulation, which it only filters)."""

    def __init__(self, backend: SimulatedBackend, cluster: ClusterState) -> None:
        self.backend, self.cluster, self.calls = backend, cluster, 0

    def keep_reads_in(self, memory) -> None:
        pass

    def read_cluster(self) -> ClusterState:
        return self.cluster

    def accounting(self, start: float, end: float):
        return self.backend.accounting(start, end)

    def priority_model(self):
        return self.backend.priority_model()


class LastRead(SimulatedBackend):
    """The simulated cluster, keeping the last read it handed out."""

    last: ClusterState | None = None

    def read_cluster(self) -> ClusterState:
        self.last = super().read_cluster()
        return self.last


class Kept(NamedTuple):
    """What a running engine's memory kept over a run: jobs' sides of the diff taken from the cycle
    before, and cycles that used the service prior learned by the cycle before."""

    sides: int
    priors: int


def run_to_the_end(cfg: Config, *, apply: bool, against_fresh: bool = True) -> tuple[SimulatedBackend, list, Kept]:
    """Every cycle of an engine on the simulated cluster, planned then applied (what
    `Engine.cycle` does). Each plan is checked against the plan of an engine just started on the
    same read and state file (unless `against_fresh` is False): what a running engine keeps between
    cycles (its CycleMemory, and the store's maps) changes nothing. The service prior is learned
    again exactly when the finished jobs differ from the cycle before's. Also returns what the
    memory kept."""
    backend = LastRead.from_config(cfg)
    engine = Engine(cfg, backend, StateStore(cfg.engine.state_db, read_only=not apply))
    reports = []
    carried = priors = 0  # jobs whose side of the diff was kept from the cycle before; priors kept
    learned = None
    while not backend.finished():
        if apply:
            planned = engine.plan()
        else:
            report = engine.cycle(apply=False)
            planned = report.plan
        assert backend.last is not None
        # the backend keeps its reads in the engine's memory: the jobs it served, by job id
        assert {job.job_id for job in backend.last.jobs} <= engine.memory.reads.jobs.keys()
        if against_fresh:
            fresh = Engine(cfg, SameRead(backend, backend.last), StateStore(cfg.engine.state_db, read_only=True)).plan()
            # a new engine reads the site's span (and an applied cycle would store it); a running one read it once
            assert planned == replace(fresh, read_calls=planned.read_calls, site_span=planned.site_span)
            assert fresh.site_span is not None and fresh.site_span.span == engine.priority_span(planned.time)[0].span
        carried += engine.memory.diff.carried
        if engine.memory.prior is not None:
            if learned is not None:  # the same prior exactly when the same finished jobs
                same = engine.memory.prior.finished == learned.finished
                assert (engine.memory.prior.prior is learned.prior) == same
                priors += same
            learned = engine.memory.prior
        reports.append(engine.apply(planned) if apply else report)
        assert len(reports) < 20000, "the simulation did not end"
        if apply:  # the owned fields and jobs the store keeps between cycles are the ones the file holds
            fresh_store = StateStore(cfg.engine.state_db, read_only=True)
            assert engine.store.owned() == fresh_store.owned() and engine.store.jobs() == fresh_store.jobs()
    return backend, reports, Kept(carried, priors)


@pytest.fixture(scope="module")
def default_run(small_trace, tmp_path_factory) -> tuple[Config, SimulatedBackend, list, int]:
    """The engine at its defaults on the small trace, applied cycle by cycle to the end: two tests
    read this one run (what it did, and that the replay does the same)."""
    cfg = config(small_trace, tmp_path_factory.mktemp("default") / "state.sqlite")
    return (cfg, *run_to_the_end(cfg, apply=True))


def test_the_engine_runs_a_simulated_cluster_to_the_end_of_its_trace(default_run):
    _, backend, reports, kept = default_run
    assert kept.sides > 0, "the diff kept no job's side from one cycle to the next"
    assert 0 < kept.priors < len(reports), "the prior was never kept, or never learned again"
    summary = backend.summary()
    replayed = len(backend.accounts)
    assert summary["jobs"] == replayed > 0
    assert all(r.errors == 0 for r in reports)
    written = [w.update for r in reports for w, o in r.outcomes if o.ok]
    assert any(JobField.SITE_FACTOR in u.fields for u in written)
    assert any(r.write_calls == 0 and r.plan.jobs for r in reports)  # quiet cycles write nothing
    heavy = [u for u in written if JobField.SWITCHES in u.fields]
    assert heavy, "the trace has multi-node jobs: they were consolidated with Switches="


def test_a_dry_run_on_the_simulated_cluster_writes_nothing_and_is_deterministic(small_trace, tmp_path):
    first, reports, kept = run_to_the_end(config(small_trace, tmp_path / "none.sqlite"), apply=False)
    assert kept.sides > 0
    assert first.raw == {} and all(r.write_calls == 0 for r in reports)
    assert any(r.plan.writes for r in reports)  # there was something to plan
    # the same run again, without the first one's check of every plan against a fresh engine's
    again, _, _ = run_to_the_end(config(small_trace, tmp_path / "none.sqlite"), apply=False, against_fresh=False)
    assert again.summary() == first.summary()
    assert not (tmp_path / "none.sqlite").exists()


def test_the_simulated_backend_needs_a_trace_and_a_cluster(tmp_path):
    cfg = Config.model_validate({"slurm": {"backend": "simulated"}})
    with pytest.raises(ConfigError, match="slurm.simulated_trace"):
        SimulatedBackend.from_config(cfg)


@pytest.mark.parametrize("tolerance", [0.0, None])
def test_the_engine_driving_the_simulator_reproduces_the_replay_exactly(small_trace, tmp_path, tolerance, request):
    """The live engine and the replay call the same policy on the same snapshots. Whether the
    engine rewrites every changed value (tolerance 0) or only what drifted or would break the
    policy's order (None: the default, 1%), the simulated outcome is the replay's, bit for bit."""
    if tolerance is None:
        cfg, backend, _, _ = request.getfixturevalue("default_run")
        assert cfg.engine.priority_tolerance == 0.01
    else:
        cfg = config(small_trace, tmp_path / "state.sqlite")
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"priority_tolerance": tolerance})})
        backend, _, _ = run_to_the_end(cfg, apply=True)
    replay_input = load_input(small_trace / "sacct.txt", small_trace / "slurm.conf", None)
    replayed = run_policy("dike", replay_input, cfg, sim_settings(cfg, replay_input.conf))
    assert backend.summary() == replayed.metrics.summary
    # with Dike's default preemption on, both paths requeued jobs through the same guard
    assert replayed.metrics.summary["preemptions"] > 0 and replayed.stats.requeues_refused > 0
    assert backend.recorded_gpu_s == {}  # what a requeued run used is kept only until its job finishes


def two_types_billed(trace: Path, out: Path) -> Path:
    """The trace's cluster split into two GPU types (n001 and n003 a100, n002 and n004 v100: one of
    each per leaf) where the site charges an a100 GPU-second three times a v100 one (issue 33)."""
    out.mkdir()
    for name in ("sacct.txt", "topology.conf"):
        (out / name).write_text((trace / name).read_text())
    conf = (trace / "slurm.conf").read_text()
    nodes = "NodeName=n[001-004] Gres=gpu:a100:8 "
    assert nodes in conf and "PartitionName=gpu " in conf
    conf = conf.replace(nodes, "NodeName=n[002,004] Gres=gpu:v100:8 CPUs=64 RealMemory=512000 State=UNKNOWN\n"
                                "NodeName=n[001,003] Gres=gpu:a100:8 ")
    conf = conf.replace("PartitionName=gpu ", "PartitionName=gpu TRESBillingWeights=CPU=0,GRES/gpu:a100=3.0,GRES/gpu:v100=1.0 ")
    (out / "slurm.conf").write_text(conf)
    return out


def test_the_engine_reproduces_the_replay_on_a_site_that_weighs_gpu_types(small_trace, tmp_path):
    """Attained service weighs each run's GPU type by the site's TRESBillingWeights in the replay
    and, through the simulated backend's accounting records (their partition and AllocTRES types),
    in the engine: the same levels, so the same outcome, bit for bit."""
    billed = two_types_billed(small_trace, tmp_path / "billed")
    cfg = config(billed, tmp_path / "state.sqlite")
    backend, _, _ = run_to_the_end(cfg, apply=True)
    replay_input = load_input(billed / "sacct.txt", billed / "slurm.conf", None)
    settings = sim_settings(cfg, replay_input.conf)
    assert settings.priority_model.gpu_weight("gpu", ("a100",)) == 3.0
    replayed = run_policy("dike", replay_input, cfg, settings)
    assert backend.summary() == replayed.metrics.summary
    ran = [r for r in backend.records if r.end is not None]
    assert {r.alloc_gpu_types for r in ran} == {("a100",), ("v100",)} and {r.partition for r in ran} == {"gpu"}
    assert replayed.metrics.summary["preemptions"] > 0  # requeued runs were recorded too


def test_the_engine_reproduces_the_replay_with_dikes_node_hold(busy_trace, tmp_path):
    """Dike's node hold writes ExcNodeList on many pending jobs and takes it off again as the
    held job changes: the engine's diff, restores and the simulator's placements stay in step.
    Preemption off: with every job preemptible the hold leaves blocked jobs to the planner."""
    cfg = config(busy_trace, tmp_path / "state.sqlite")
    cfg = cfg.model_copy(update={"policies": {"dike": {**cfg.policies["dike"], "hold_nodes": "blocked", "preemption": False}}})
    backend, reports, kept = run_to_the_end(cfg, apply=True)
    assert kept.sides > 0
    replay_input = load_input(busy_trace / "sacct.txt", busy_trace / "slurm.conf", None)
    replayed = run_policy("dike", replay_input, cfg, sim_settings(cfg, replay_input.conf))
    assert backend.summary() == replayed.metrics.summary
    held = [w for r in reports for w, o in r.outcomes if o.ok and "held for blocked heavy job" in w.reason]
    assert held and all(JobField.EXCLUDED_NODES in w.update.fields for w in held)
    released = [w for r in reports for w, o in r.outcomes if o.ok and JobField.EXCLUDED_NODES in w.restores]
    assert released, "a hold that moved on put the jobs' ExcNodeList back"


def test_a_quiet_cycle_rewrites_no_memory_and_remembers_what_rewriting_every_job_would(busy_trace, tmp_path):
    """Applier._memories rewrites a job's memory only when it changed or its last_seen is
    LAST_SEEN_EVERY_S old. Cycle by cycle against the reference that rewrote every job (the same
    code with LAST_SEEN_EVERY_S = 0: each job's row written every cycle, forgotten FORGET_AFTER_S
    after it was last seen, as before): the same writes and requeues, the same memories but for
    last_seen (behind by less than LAST_SEEN_EVERY_S), and a job the reference forgot is one no
    longer in the queue."""
    cfg = config(busy_trace, tmp_path / "state.sqlite")
    reference_cfg = config(busy_trace, tmp_path / "reference.sqlite")
    backend, reference_backend = SimulatedBackend.from_config(cfg), SimulatedBackend.from_config(reference_cfg)
    engine = Engine(cfg, backend, StateStore(cfg.engine.state_db))
    reference = Engine(reference_cfg, reference_backend, StateStore(reference_cfg.engine.state_db))
    skipped = 0
    while not reference_backend.finished():
        report = engine.cycle(apply=True)
        try:
            apply_module.LAST_SEEN_EVERY_S = 0.0
            expected = reference.cycle(apply=True)
        finally:
            apply_module.LAST_SEEN_EVERY_S = LAST_SEEN_EVERY_S
        assert [(w.update, o.ok) for w, o in report.outcomes] == [(w.update, o.ok) for w, o in expected.outcomes]
        assert report.plan.requeues == expected.plan.requeues
        now, active = report.plan.time, {p.job.job_id for p in report.plan.jobs if p.managed}
        kept, truth = engine.store.jobs(), reference.store.jobs()
        for job_id, memory in truth.items():
            assert replace(kept[job_id], last_seen=memory.last_seen) == memory
            assert memory.last_seen - LAST_SEEN_EVERY_S < kept[job_id].last_seen <= memory.last_seen
            skipped += kept[job_id].last_seen < memory.last_seen
        assert not (set(kept) - set(truth)) & active
        assert all(kept[j].last_seen >= now - FORGET_AFTER_S - LAST_SEEN_EVERY_S for j in set(kept) - set(truth))
    assert backend.finished() and backend.summary() == reference_backend.summary()
    assert skipped > 0, "no quiet cycle skipped a memory"


@pytest.mark.parametrize("hold_nodes", ["never", "blocked"])
def test_the_engine_reproduces_the_replay_with_a_head_window_and_a_write_cap(busy_trace, tmp_path, hold_nodes):
    """A window of 3 pending jobs per partition and 4 writes per cycle, both binding on the busy
    trace: the engine hands back the values of jobs that fall beyond the window, holds back the
    queue's tail, and the replay (sim/kernel/priority.py: engine_writes, within_budget) lands the same."""
    cfg = config(busy_trace, tmp_path / "state.sqlite")
    cfg = cfg.model_copy(update={
        "engine": cfg.engine.model_copy(update={"head_window": 3, "max_changes_per_cycle": 4}),
        "policies": {"dike": {**cfg.policies["dike"], "hold_nodes": hold_nodes, "preemption": False}},
    })
    backend, reports, _ = run_to_the_end(cfg, apply=True)
    replay_input = load_input(busy_trace / "sacct.txt", busy_trace / "slurm.conf", None)
    settings = sim_settings(cfg, replay_input.conf)
    assert (settings.head_window, settings.writes_per_cycle) == (3, 4)
    replayed = run_policy("dike", replay_input, cfg, settings)
    assert backend.summary() == replayed.metrics.summary
    released = [w for r in reports for w, o in r.outcomes if o.ok and JobField.SITE_FACTOR in w.restores]
    assert released and all("beyond the head window" in w.reason for w in released)
    assert any(r.plan.held_back for r in reports)
    outside = [p for r in reports for p in r.plan.jobs if p.outside_window]
    assert outside and not any(w.update.values and JobField.SITE_FACTOR not in w.restores
                               for p in outside for w in p.writes)
