"""Slurm's priority as the replay models it (dike_slurm/domain/slurm_priority.py, sim/kernel/priority.py).

The formula is pinned against real Slurm by tests/integration/test_priority_lab.py; here the
pure parts: each factor by hand, fair share, the tiers and the span each mode gives, the readers.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.errors import InputError
from dike_slurm.slurm.slurm_conf import parse_slurm_conf
from dike_slurm.domain.slurm_priority import (
    PartitionPriority,
    PriorityInputs,
    effective_span,
    fairshare_factors,
    parse_qos_dump,
    parse_tres_weights,
    tier_gap,
    weights_from_options,
)
from dike_slurm.sim.kernel.job import SimJob
from dike_slurm.sim.kernel.priority import SlurmOrder
from dike_slurm.sim.kernel.records import SimSettings
from dike_slurm.sim.kernel.trace import TraceJob

CONF = """\
PriorityType=priority/multifactor
PriorityWeightAge=1000
PriorityWeightFairshare=10000
PriorityWeightJobSize=1000
PriorityWeightQOS=100000
PriorityWeightPartition=500
PriorityWeightTRES=CPU=0,GRES/gpu=1000
PriorityMaxAge=1-0
NodeName=n[1-4] Gres=gpu:8 CPUs=16
PartitionName=gpu Nodes=n[1-4] Default=YES PriorityJobFactor=10
PartitionName=debug Nodes=n1 PriorityJobFactor=5 PriorityTier=2
"""
QOS = {"normal": 0, "low": 10, "urgent": 100}


def model():
    return parse_slurm_conf(CONF).priority_model(QOS, "test")


def test_every_factor_as_slurm_weighs_it():
    job = PriorityInputs(partition="gpu", qos="low", nodes=2, cpus=8, gpus=16, eligible_since=0.0,
                         fairshare=0.25, site_factor=700, nice=50)
    age = 1000 * 0.5  # half of PriorityMaxAge
    fairshare = 10000 * 0.25
    size = 1000 * (2 / 4 + 8 / 64) / 2  # nodes over cluster nodes and CPUs over cluster CPUs, halved
    partition = 500 * 10 / 10  # PriorityJobFactor over the largest one
    qos = 100000 * 10 / 100  # QOS priority over the largest one
    tres = 1000 * 16 / 32  # GPUs over the partition's GPUs
    expected = int(age + fairshare + size + partition + qos + tres + 700 - 50)
    assert model().priority(job, 43200.0) == expected


def test_priority_is_at_least_one_and_age_saturates():
    m = model()
    job = PriorityInputs("gpu", "normal", 1, 1, 0, eligible_since=0.0, fairshare=0.0, nice=10**6)
    assert m.priority(job, 10.0) == 1  # Slurm reserves 0 for held jobs
    fresh = PriorityInputs("gpu", "normal", 1, 1, 0, eligible_since=0.0, fairshare=0.0)
    assert m.factors_sum(fresh, 5 * 86400.0) - m.factors_sum(fresh, 86400.0) == 0.0


def test_favor_small_turns_the_size_factor_round():
    conf = CONF.replace("PriorityMaxAge=1-0", "PriorityMaxAge=1-0\nPriorityFavorSmall=YES")
    small = parse_slurm_conf(conf).priority_model(QOS, "t")
    assert small.job_size_factor(1, 16) == pytest.approx(((4 - 1) / 4 + (64 - 16) / 64) / 2)
    assert model().job_size_factor(1, 16) == pytest.approx((1 / 4 + 16 / 64) / 2)


def test_partition_tiers_and_defaults():
    m = model()
    assert m.tier("debug") == 2 and m.tier("gpu") == 1 and m.tier("unknown") == 1
    conf = parse_slurm_conf("NodeName=a Gres=gpu:1\nPartitionName=p Nodes=a Priority=7\n")
    assert conf.partition("p").priority == PartitionPriority(job_factor=7, tier=7)


def test_basic_and_defaults():
    assert not weights_from_options({"prioritytype": "priority/basic"}, "s").multifactor
    w = weights_from_options({}, "s")
    assert w.multifactor and w.fair_tree and w.total == 0 and w.max_age_s == 7 * 86400
    assert not weights_from_options({"priorityflags": "ACCRUE_ALWAYS,NO_FAIR_TREE"}, "s").fair_tree


def test_readers_name_what_is_wrong():
    assert parse_tres_weights("CPU=1000,Mem=2000,GRES/gpu=3000", "s") == {"cpu": 1000, "mem": 2000, "gres/gpu": 3000}
    with pytest.raises(InputError, match="PriorityWeightTRES item 'GRES/gpu'"):
        parse_tres_weights("GRES/gpu", "s")
    with pytest.raises(InputError, match="PriorityWeightAge='lots'"):
        weights_from_options({"priorityweightage": "lots"}, "slurm.conf")
    dump = "Name|Priority|GraceTime\nnormal|0|00:00:00\nurgent|100|00:00:00\n"
    assert parse_qos_dump(dump, "qos.txt") == {"normal": 0, "urgent": 100}
    with pytest.raises(InputError, match="qos.txt:3: QOS 'bad': Priority 'x' is not an integer"):
        parse_qos_dump("Name|Priority\nnormal|0\nbad|x\n", "qos.txt")
    with pytest.raises(InputError, match="Name and Priority"):
        parse_qos_dump("Name|Flags\nnormal|\n", "qos.txt")


def test_fair_tree_ranks_associations_and_ties_share_a_rank():
    usage = {("a", "u1"): 0.0, ("a", "u2"): 10.0, ("b", "u3"): 5.0, ("b", "u4"): 5.0}
    factors = fairshare_factors(usage, fair_tree=True)
    # account a (usage 10 of 20) and b (10 of 20) tie; inside a, u1 never ran: it ranks first
    assert factors[("a", "u1")] == 1.0
    assert factors[("b", "u3")] == factors[("b", "u4")]
    assert sorted(set(factors.values()), reverse=True) == [1.0, 0.75, 0.25]
    assert factors[("a", "u2")] == 0.25


def test_classic_fair_share_is_two_to_the_minus_usage_over_shares():
    usage = {("a", "u1"): 30.0, ("a", "u2"): 10.0}
    factors = fairshare_factors(usage, fair_tree=False)
    assert factors[("a", "u1")] == pytest.approx(2 ** (-(30 / 40) / 0.5))
    assert factors[("a", "u2")] == pytest.approx(2 ** (-(10 / 40) / 0.5))


def test_the_span_each_mode_gives():
    m = model()
    # tiers 0, 10,000, 100,000: the smallest step 10,000; the rest at most 1000+10000+1000+500+1000
    assert tier_gap(m) == 10000
    # the site's other factors (13,500) already cross that step: no room is left, the span is 1
    assert effective_span("tiers", 1_000_000, m) == 1
    roomy = parse_slurm_conf(CONF.replace("PriorityWeightQOS=100000", "PriorityWeightQOS=1000000")).priority_model(QOS, "t")
    assert effective_span("tiers", 1_000_000, roomy) == 100000 - 13500 - 1
    assert effective_span("over", 1_000_000, roomy) == 1_000_000
    assert effective_span("blend", 1_000_000, roomy) == 1_000_000  # the weights (1,013,500) capped by the span
    no_tiers = parse_slurm_conf(CONF).priority_model({"normal": 0}, "t")
    assert tier_gap(no_tiers) is None and effective_span("tiers", 1_000_000, no_tiers) == 1_000_000
    assert effective_span("blend", 1_000_000, no_tiers) == 13500
    assert effective_span("tiers", 1_000_000, None) == 1_000_000


def sim_job(job_id, partition="gpu", qos="normal", submit=0.0, gpus=8, user="u1"):
    trace = TraceJob(job_id=job_id, display_id=str(job_id), user=user, account="a", partition=partition, qos=qos,
                     name="j", comment="", submit=submit, eligible_delay_s=0.0, duration_s=60.0, time_limit_s=3600,
                     gpus=gpus, num_nodes=1, cpus=1)
    return SimJob(trace, heavy=False, fewest_leaves=1, preemptible=True)


def test_the_replay_orders_by_tier_then_slurms_priority_then_submit():
    order = SlurmOrder(SimSettings(priority_model=model()), {})
    low_written = sim_job(1, submit=0.0)
    low_written.written, low_written.owned = 9000, True  # below the 10,000 QOS step
    urgent = sim_job(2, qos="low", submit=50.0)
    debug = sim_job(3, partition="debug", submit=100.0, gpus=1)
    plain = sim_job(4, submit=10.0)
    jobs = [low_written, urgent, debug, plain]
    for job in jobs:
        order.join(job, 0.0)
    order.recalculate(100.0)
    ranked = sorted(jobs, key=lambda j: order.key(j, 100.0))
    assert [j.trace.job_id for j in ranked] == [3, 2, 1, 4]  # tier 2 first; the QOS step beats 9,000


def test_priority_strategy_pins_and_nice_subtracts():
    pinned = SlurmOrder(SimSettings(priority_model=model(), priority_strategy="priority"), {})
    job = sim_job(1)
    pinned.join(job, 0.0)
    job.written, job.owned = 42, True
    assert pinned.priority(job, 1000.0) == 42
    nice = SlurmOrder(SimSettings(priority_model=model(), priority_strategy="nice"), {})
    other = sim_job(2)
    base = nice.priority(other, 1000.0)
    other.written, other.owned = -300, True  # the engine writes a negative Nice
    assert nice.priority(other, 1000.0) == base + 300


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.sampled_from(["gpu", "debug", "elsewhere"]), st.sampled_from(["normal", "low", "urgent", "x"]),
                            st.integers(1, 4), st.integers(0, 64), st.integers(0, 32),
                            st.floats(0, 3 * 86400), st.floats(0, 1), st.integers(-10**6, 10**7), st.booleans()),
                  min_size=1, max_size=6),
    strategy=st.sampled_from(["site_factor", "nice", "priority"]),
    favor_small=st.booleans(),
    now=st.floats(0, 4 * 86400),
)
def test_the_replays_priority_with_its_request_terms_kept_equals_the_formula_each_time(jobs, strategy, favor_small, now):
    """SlurmOrder keeps each request's weighted factors; the priority is the formula's
    (SlurmPriorityModel.priority on fresh PriorityInputs) to the integer, for every strategy."""
    conf = CONF + ("PriorityFavorSmall=YES\n" if favor_small else "")
    site = parse_slurm_conf(conf).priority_model(QOS, "test")
    order = SlurmOrder(SimSettings(priority_model=site, priority_strategy=strategy), {})
    for index, (partition, qos, nodes, cpus, gpus, eligible, fairshare, written, owned) in enumerate(jobs * 2):
        job = sim_job(index, partition=partition, qos=qos, gpus=gpus)
        job.trace = replace(job.trace, num_nodes=nodes, cpus=cpus)
        job.eligible_at, job.written, job.owned = eligible, written, owned
        order.fairshare[job.association] = fairshare
        plain = PriorityInputs(partition, qos, nodes, cpus, gpus, eligible_since=eligible, fairshare=fairshare,
                               site_factor=written if strategy == "site_factor" else 0,
                               nice=written if strategy == "nice" else 0)
        expected = written if strategy == "priority" and owned else site.priority(plain, now)
        assert order.priority(job, now) == expected


def test_the_scheduler_depth_comes_from_schedulerparameters_and_a_bad_value_names_its_source():
    from dike_slurm.errors import InputError
    from dike_slurm.parsing.slurm_options import scheduler_depth, scheduler_parameters
    from dike_slurm.domain.slurm_priority import build_model

    assert scheduler_depth({}) == 500  # Slurm's bf_max_job_test default
    assert scheduler_depth(scheduler_parameters("bf_continue,bf_max_job_test=1000,bf_max_job_part=300")) == 300
    assert scheduler_depth(scheduler_parameters("bf_max_job_test=50,default_queue_depth=80")) == 80
    model = build_model({"schedulerparameters": "bf_max_job_test=2000"}, (), 1, 1, {}, "scontrol show config")
    assert model.scheduler_depth == 2000
    with pytest.raises(InputError, match="bf_max_job_part='x' is not a whole number") as caught:
        build_model({"schedulerparameters": "bf_max_job_part=x"}, (), 1, 1, {}, "site/slurm.conf")
    assert caught.value.source == "site/slurm.conf"
