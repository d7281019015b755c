"""engine.priority_mode: the span the engine writes against the site's own weights and QOS tiers.

The site's model comes from the backend (FakeBackend(priority=...)); the span is
`slurm_priority.effective_span(engine.priority_mode, engine.priority_span, model)`, read once per engine.
"""

from __future__ import annotations

import pytest

from fakes import FakeBackend
from dike_slurm.domain.fields import JobField
from dike_slurm.errors import SlurmError
from dike_slurm.ops.service import Service
from dike_slurm.domain.slurm_priority import PartitionPriority, PriorityInputs, PriorityWeights, SlurmPriorityModel
from dike_slurm.store.state import StateStore

from engine_fixtures import NOW, TOPOLOGY, config, engine, finished_run, nodes, pending

# The QOS tiers step 100,000 (normal 0, urgent 1 x PriorityWeightQOS 100,000); every other factor
# together weighs 13,000 (age 1,000, fair share 10,000, job size 1,000, GRES/gpu 1,000).
SITE = SlurmPriorityModel(
    weights=PriorityWeights(age=1000, fairshare=10000, job_size=1000, qos=100_000, tres={"gres/gpu": 1000}),
    qos_priority={"normal": 0, "urgent": 1},
    partitions={"gpu": PartitionPriority()},
    node_count=4, cluster_cpus=64, partition_tres={"gpu": {"cpu": 64, "node": 4, "gres/gpu": 32}},
    source="test",
)
SPAN = 1_000_000  # engine.priority_span's default


def queue(model: SlurmPriorityModel | None) -> FakeBackend:
    """Pending jobs of users with little and much recent service: Dike puts them on every level."""
    history = [finished_run(90, "carol", 8, NOW - 7200, NOW - 3600), finished_run(91, "dave", 32, NOW - 36000, NOW - 600)]
    jobs = [pending(1, "alice", waited=3600), pending(2, "bob", gpus=2, waited=60), pending(3, "carol", waited=600),
            pending(4, "dave", gpus=8, waited=30), pending(5, "erin", qos="urgent", waited=10)]
    return FakeBackend(jobs, nodes(), TOPOLOGY, time=NOW, records=history, priority=model)


def written(tmp_path, model: SlurmPriorityModel | None, **engine_settings) -> dict[int, int]:
    backend = queue(model)
    cfg = config(tmp_path, engine=engine_settings)
    report = engine(cfg, backend).cycle(apply=True)
    assert report.errors == 0
    key = {"site_factor": JobField.SITE_FACTOR, "nice": JobField.NICE}[cfg.engine.priority_strategy]
    return {u.job_id: int(u.get(key)) for u in backend.applied if key in u.fields}  # type: ignore[arg-type]


def test_tiers_keeps_dike_under_the_smallest_qos_step_less_the_other_factors(tmp_path):
    values = written(tmp_path, SITE)  # priority_mode = "tiers", the default
    assert len(values) == 5 and max(values.values()) <= 86_999  # 100,000 - 13,000 - 1
    assert max(values.values()) > 2 * 86_999 // 3  # the top level uses the top third of that span
    assert min(values.values()) >= 1


def test_over_writes_up_to_the_configured_span(tmp_path):
    values = written(tmp_path, SITE, priority_mode="over")
    assert 2 * SPAN // 3 < max(values.values()) <= SPAN


def test_blend_writes_at_most_the_sites_weights_together(tmp_path):
    values = written(tmp_path, SITE, priority_mode="blend")
    assert 86_999 < max(values.values()) <= 113_000  # 13,000 + the QOS weight 100,000


def test_without_a_model_every_mode_writes_the_configured_span(tmp_path):
    for mode in ("tiers", "blend", "over"):
        values = written(tmp_path / mode, None, priority_mode=mode)
        assert 2 * SPAN // 3 < max(values.values()) <= SPAN


def test_the_nice_strategy_is_sized_like_site_factor(tmp_path):
    values = written(tmp_path, SITE, priority_strategy="nice")
    assert -86_999 <= min(values.values()) and max(values.values()) <= -1


def test_tiers_keep_a_qos_tier_whatever_dike_and_the_site_factors_say(tmp_path):
    """What tiers mode is for: with Dike's lowest value and every other factor at 0, an urgent job
    still comes before a normal job with Dike's highest value and every other factor at 1; with
    mode over it does not."""
    for mode, kept in (("tiers", True), ("over", False)):
        values = written(tmp_path / mode, SITE, priority_mode=mode)
        low, high = min(values.values()), max(values.values())
        urgent = PriorityInputs("gpu", "urgent", nodes=1, cpus=1, gpus=1, eligible_since=NOW, fairshare=0.0,
                                site_factor=low)
        normal = PriorityInputs("gpu", "normal", nodes=4, cpus=64, gpus=32, eligible_since=NOW - 30 * 86400,
                                fairshare=1.0, site_factor=high)
        assert (SITE.priority(urgent, NOW) > SITE.priority(normal, NOW)) is kept, mode


def test_the_model_is_read_once_per_engine_and_again_after_a_reload(tmp_path):
    backend = queue(SITE)
    cfg = config(tmp_path)
    running = engine(cfg, backend)
    first, second = running.cycle(apply=True), running.cycle(apply=True)
    assert backend.priority_reads == 1 and running.priority_span(NOW)[0].span == 86_999
    assert first.plan.read_calls == second.plan.read_calls == 2  # the model is not one of the cycle's reads
    store = StateStore(cfg.engine.state_db)
    service = Service(cfg, store, lambda: cfg, apply=True, make_engine=lambda c, s: engine(c, backend))
    assert backend.priority_reads == 1  # a new engine reads when it first plans
    service.engine.cycle(apply=True)
    assert backend.priority_reads == 2
    service._reload()  # SIGHUP
    service.engine.cycle(apply=True)
    assert backend.priority_reads == 3


def test_over_reads_the_site_for_the_protection_reserve_only(tmp_path):
    backend = queue(SITE)
    running = engine(config(tmp_path, engine={"priority_mode": "over"}), backend)
    running.cycle(apply=True)
    span = running.priority_span(NOW)[0]
    assert backend.priority_reads == 1 and (span.span, span.reserve) == (SPAN, 13_001)


def test_the_priority_strategy_is_sized_as_the_replay_sizes_it(tmp_path):
    """Priority= pins a managed job (its QOS stops counting), but its value still meets the other jobs'
    multifactor priorities: the span is the mode's, as in the replay (sim/kernel/replay.py)."""
    backend = queue(SITE)
    cfg = config(tmp_path, engine={"priority_strategy": "priority"})
    engine(cfg, backend).cycle(apply=True)
    values = [int(u.get(JobField.PRIORITY)) for u in backend.applied if JobField.PRIORITY in u.fields]
    assert backend.priority_reads == 1 and len(values) == 5 and max(values) <= 86_999


class _Unreadable(FakeBackend):
    """slurmdbd down: the QOS table cannot be read while every slurmctld read answers."""

    readable = False

    def priority_model(self):
        if self.readable:
            return super().priority_model()
        self.priority_reads += 1
        raise SlurmError("sacctmgr -nP show qos format=Name,Priority failed (exit 1): slurmdbd down")


def test_a_failed_read_with_nothing_stored_fails_the_cycle_with_the_command_and_is_tried_again(tmp_path):
    backend = _Unreadable([pending(1)], nodes(), TOPOLOGY, time=NOW, priority=SITE)
    running = engine(config(tmp_path), backend)
    for attempt in (1, 2):
        with pytest.raises(SlurmError, match="sacctmgr -nP show qos"):
            running.cycle(apply=True)
        assert backend.priority_reads == attempt and backend.applied == []


def test_a_failed_read_keeps_the_span_an_applied_cycle_stored_and_reads_again_next_cycle(tmp_path):
    """As levels survive slurmdbd down (the state store's runs), so does the span: a restarted engine
    whose read fails writes within the span last read, says so, and asks again the next cycle."""
    cfg = config(tmp_path)
    backend = _Unreadable([pending(1), pending(2, "bob", waited=60)], nodes(), TOPOLOGY, time=NOW, priority=SITE)
    backend.readable = True
    engine(cfg, backend).cycle(apply=True)
    assert StateStore(cfg.engine.state_db).site_span().span == 86_999

    backend.readable = False
    restarted = engine(cfg, backend)
    report = restarted.cycle(apply=True)
    assert report.errors == 0 and backend.priority_reads == 2
    assert any(n.startswith("site priority unreadable (sacctmgr -nP show qos") and "values 1..86999" in n
               for n in report.plan.notes), report.plan.notes
    restarted.cycle(apply=True)
    assert backend.priority_reads == 3  # not kept for the engine's life: asked again
    backend.readable = True
    report = restarted.cycle(apply=True)
    assert backend.priority_reads == 4 and not any("unreadable" in n for n in report.plan.notes)
    restarted.cycle(apply=True)
    assert backend.priority_reads == 4  # read: kept for the engine's life


def test_a_stored_span_of_another_mode_or_configured_span_is_not_used(tmp_path):
    backend = _Unreadable([pending(1)], nodes(), TOPOLOGY, time=NOW, priority=SITE)
    backend.readable = True
    engine(config(tmp_path), backend).cycle(apply=True)
    backend.readable = False
    for changed in ({"priority_mode": "blend"}, {"priority_span": 500_000}):
        with pytest.raises(SlurmError, match="sacctmgr"):
            engine(config(tmp_path, engine=changed), backend).cycle(apply=True)


def test_a_dry_run_stores_no_span(tmp_path):
    cfg = config(tmp_path)
    engine(cfg, queue(SITE)).cycle(apply=False)
    assert StateStore(cfg.engine.state_db).site_span() is None
