"""Each policy on hand-built snapshots: real assertions on order, levels and placement."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from dike_slurm.domain.decisions import ClearPlacement, Decisions, Requeue, SetPlacement
from dike_slurm.errors import PolicyError
from dike_slurm.policies.common import CommRule
from dike_slurm.policies.dike import DikeParams, DikePolicy
from dike_slurm.policies.fifo import FifoPolicy
from dike_slurm.policies.multifactor import MultifactorParams, MultifactorPolicy
from dike_slurm.policies.srtf_oracle import SrtfOraclePolicy
from dike_slurm.policies.tiresias import TiresiasParams, TiresiasPolicy
from dike_slurm.domain.model import JobState, Placement

from snapshots import NOW, pending, running, snapshot

RNG = random.Random(0)
GPUH = 3600.0


def test_fifo_orders_by_submit_time():
    snap = snapshot([pending(3, waited=10), pending(1, waited=300), pending(2, waited=100)])
    decisions = FifoPolicy().decide(snap, FifoPolicy.Params(), RNG)
    assert decisions.order() == (1, 2, 3)
    assert {p.level for p in decisions.priorities} == {0}
    assert decisions.placements == () and decisions.requeues == ()


def test_multifactor_leaves_the_order_to_slurm():
    """Slurm's own multifactor writes nothing: the replay orders its queue by slurm_priority."""
    snap = snapshot([pending(1, waited=6 * 86400, gpus=1), pending(2, waited=0, gpus=16)])
    assert MultifactorPolicy().decide(snap, MultifactorParams(), RNG) == Decisions()


def test_tiresias_demotes_past_3600_gpu_seconds_and_is_fifo_inside():
    served = pending(1, waited=500, attained_gpu_s=4 * 1000.0, run_count=1, last_run_s=1000)  # 4000 GPU-s
    fresh_late = pending(2, waited=10)
    fresh_early = pending(3, waited=20)
    decisions = TiresiasPolicy().decide(snapshot([served, fresh_late, fresh_early]), TiresiasParams(), RNG)
    assert decisions.priority_of(1).level == 1
    assert decisions.priority_of(2).level == 0
    assert decisions.order() == (3, 2, 1)


def test_promotion_at_says_when_a_waiting_job_is_promoted():
    """`explain`'s promotion time: the first of knob x last run and max_wait_s after the job began
    to wait, as levels_with_promotion decides it."""
    served = pending(1, waited=500, attained_gpu_s=4000.0, run_count=1, last_run_s=1000.0)
    began = NOW - 500
    assert DikePolicy().promotion_at(served, DikeParams()) == began + 8 * 1000.0
    assert DikePolicy().promotion_at(served, DikeParams(max_wait_s=600.0)) == began + 600.0
    assert DikePolicy().promotion_at(served, DikeParams(promote_knob=None, max_wait_s=None)) is None
    assert TiresiasPolicy().promotion_at(served, TiresiasParams()) is None  # no knob: never
    assert TiresiasPolicy().promotion_at(served, TiresiasParams(promote_knob=8)) == began + 8000.0
    later = served.with_changes(submit_time=NOW - 10_000, pending_since=NOW - 500)  # requeued: waits anew
    assert DikePolicy().promotion_at(later, DikeParams()) == began + 8000.0
    # exactly when decide promotes it
    at = DikePolicy().promotion_at(served, FIXED)
    for moment, promoted in ((at - 1, False), (at, True)):
        state = replace(snapshot([served]), time=moment)
        assert DikePolicy().decide(state, FIXED, RNG).priority_of(1).promoted is promoted


def test_tiresias_consolidates_only_large_jobs():
    decisions = TiresiasPolicy().decide(snapshot([pending(1, gpus=16), pending(2, gpus=4)]), TiresiasParams(), RNG)
    big = decisions.placement_of(1)
    assert isinstance(big, SetPlacement) and big.placement.max_switches == 1
    assert decisions.placement_of(2) is None


def test_tiresias_promote_knob():
    starving = pending(1, waited=9000, attained_gpu_s=4000.0, last_run_s=1000.0)
    assert TiresiasPolicy().decide(snapshot([starving]), TiresiasParams(), RNG).priority_of(1).level == 1
    promoted = TiresiasPolicy().decide(snapshot([starving]), TiresiasParams(promote_knob=8), RNG).priority_of(1)
    assert promoted.level == 0 and promoted.promoted


def test_srtf_oracle_orders_by_remaining_gpu_time_and_refuses_without_durations():
    jobs = [pending(1, gpus=1, true_duration_s=7200), pending(2, gpus=4, true_duration_s=600), pending(3, gpus=1, true_duration_s=60)]
    assert SrtfOraclePolicy().decide(snapshot(jobs), SrtfOraclePolicy.Params(), RNG).order() == (3, 2, 1)
    assert SrtfOraclePolicy.live is False
    with pytest.raises(PolicyError, match="true durations"):
        SrtfOraclePolicy().decide(snapshot([pending(1)]), SrtfOraclePolicy.Params(), RNG)


# --- Dike -------------------------------------------------------------------------------

FIXED = DikeParams(thresholds_gpuh=[1.0, 10.0], steer_light_jobs=False, preemption=False)


def test_dike_levels_from_attained_gpu_hours():
    jobs = [
        pending(1, attained_gpu_s=0.5 * GPUH),
        pending(2, attained_gpu_s=2 * GPUH, last_run_s=1800),
        pending(3, attained_gpu_s=20 * GPUH, last_run_s=3600),
    ]
    decisions = DikePolicy().decide(snapshot(jobs), FIXED, RNG)
    assert [decisions.priority_of(i).level for i in (1, 2, 3)] == [0, 1, 2]
    assert decisions.order() == (1, 2, 3)


def test_dike_job_past_threshold_drops_a_level():
    before = running(1, gpus=4, ran=0.9 * GPUH / 4)
    after = running(1, gpus=4, ran=1.1 * GPUH / 4)
    assert DikePolicy().decide(snapshot([before]), FIXED, RNG).priority_of(1).level == 0
    assert DikePolicy().decide(snapshot([after]), FIXED, RNG).priority_of(1).level == 1


def test_dike_heavier_user_sorts_after_lighter_user_inside_a_level():
    jobs = [pending(1, "heavy", waited=600), pending(2, "light", waited=600)]
    decisions = DikePolicy().decide(snapshot(jobs, usage={"heavy": 500 * GPUH, "light": 5 * GPUH}), FIXED, RNG)
    assert decisions.priority_of(1).level == decisions.priority_of(2).level == 0
    assert decisions.order() == (2, 1)


def test_dike_levels_dominate_fairness():
    jobs = [pending(1, "light", attained_gpu_s=2 * GPUH, last_run_s=100, waited=10), pending(2, "heavy", waited=10)]
    decisions = DikePolicy().decide(snapshot(jobs, usage={"heavy": 1000 * GPUH}), FIXED.model_copy(update={"promote_knob": None}), RNG)
    assert decisions.order() == (2, 1)


def test_dike_longer_wait_sorts_first_for_equal_owners():
    jobs = [pending(1, "a", waited=60), pending(2, "a", waited=7200)]
    assert DikePolicy().decide(snapshot(jobs), FIXED, RNG).order() == (2, 1)


def test_dike_starving_job_is_promoted_and_counters_reset():
    starving = pending(1, attained_gpu_s=20 * GPUH, last_run_s=600.0, waited=8 * 600.0 + 1)
    not_yet = pending(2, attained_gpu_s=20 * GPUH, last_run_s=600.0, waited=8 * 600.0 - 100)
    decisions = DikePolicy().decide(snapshot([starving, not_yet]), FIXED, RNG)
    assert decisions.priority_of(1).level == 0 and decisions.priority_of(1).promoted
    assert decisions.priority_of(2).level == 2 and not decisions.priority_of(2).promoted
    # The engine then records attained_at_promotion: the job counts from zero again.
    reset = pending(1, attained_gpu_s=20 * GPUH, attained_at_promotion_gpu_s=20 * GPUH, last_run_s=600.0, waited=5)
    assert DikePolicy().decide(snapshot([reset]), FIXED, RNG).priority_of(1).level == 0


def test_dike_max_wait_promotes_even_without_a_run_history():
    old = pending(1, attained_gpu_s=20 * GPUH, waited=3 * 86400)
    assert DikePolicy().decide(snapshot([old]), FIXED, RNG).priority_of(1).promoted


def test_dike_16_gpu_job_gets_a_single_leaf_constraint():
    decisions = DikePolicy().decide(snapshot([pending(1, gpus=16), pending(2, gpus=1)]), FIXED, RNG)
    constraint = decisions.placement_of(1)
    assert isinstance(constraint, SetPlacement)
    assert constraint.placement == Placement(max_switches=1, switches_wait_s=1800)
    assert decisions.placement_of(2) is None


def test_dike_job_bigger_than_a_leaf_asks_for_the_fewest_leaves():
    decisions = DikePolicy().decide(snapshot([pending(1, gpus=24)]), FIXED, RNG)
    assert decisions.placement_of(1).placement.max_switches == 2


def test_dike_comm_tags_override_size():
    tagged_light = pending(1, gpus=16, comment="dike:comm=low")
    tagged_heavy = pending(2, gpus=2, comment="please dike:comm=high")
    by_rule = pending(3, gpus=2, name="gpt-pretrain-7b")
    params = DikeParams(thresholds_gpuh=[1.0, 10.0], steer_light_jobs=False, comm_rules=[CommRule(comm="high", name_pattern="gpt-*")])
    decisions = DikePolicy().decide(snapshot([tagged_light, tagged_heavy, by_rule]), params, RNG)
    assert decisions.placement_of(1) is None
    assert decisions.placement_of(2).placement.max_switches == 1
    assert decisions.placement_of(3).placement.max_switches == 1


def test_dike_leaf_feature_mode_pins_the_freest_leaf_then_relaxes():
    params = FIXED.model_copy(update={"placement_mode": "leaf_feature", "max_consolidation_wait_s": 600})
    fresh = pending(1, gpus=8, waited=60)
    decisions = DikePolicy().decide(snapshot([fresh], alloc={"n1": 4}), params, RNG)
    assert decisions.placement_of(1).placement.features == "leaf_s2"
    waited = pending(1, gpus=8, waited=900, placement=Placement(features="leaf_s2"))
    decisions = DikePolicy().decide(snapshot([waited], alloc={"n1": 4}), params, RNG)
    assert isinstance(decisions.placement_of(1), ClearPlacement)


def test_dike_steers_light_jobs_away_from_idle_leaves():
    params = DikeParams(thresholds_gpuh=[1.0, 10.0])
    jobs = [pending(1, gpus=2), running(9, gpus=4, node="n1")]
    decisions = DikePolicy().decide(snapshot(jobs, alloc={"n1": 4}), params, RNG)
    steer = decisions.placement_of(1)
    assert isinstance(steer, SetPlacement) and steer.placement.exclude_nodes == ("n3", "n4")
    # No fragmented room for it: no steering (it would only wait).
    decisions = DikePolicy().decide(snapshot([pending(1, gpus=8), running(9, gpus=4, node="n1")], alloc={"n1": 4, "n2": 8}), params, RNG)
    assert decisions.placement_of(1).placement.max_switches == 1  # 8 GPUs: heavy, consolidated instead


def test_dike_thresholds_derive_from_history_quantiles():
    history = [i * 360.0 for i in range(1, 101)]  # 0.1 .. 10 GPU-hours
    params = DikeParams(steer_light_jobs=False)
    job = pending(1, attained_gpu_s=6 * GPUH, last_run_s=100, waited=1)
    decisions = DikePolicy().decide(snapshot([job], history=history), params, RNG)
    assert decisions.priority_of(1).level == 1  # median ~5 GPUh < 6 < p75 ~7.5 GPUh
    assert "derived from 100 finished jobs" in decisions.priority_of(1).reason
    decisions = DikePolicy().decide(snapshot([job], history=history[:10]), params, RNG)
    assert decisions.priority_of(1).level == 1  # fallback 1 and 8 GPU-hours
    assert "fallback" in decisions.priority_of(1).reason


def test_dike_preemption_requeues_the_cheapest_opted_in_victim_and_pins_the_blocked_job():
    params = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 600})
    full = {"n1": 8, "n2": 8, "n3": 8, "n4": 8}
    victims = [
        running(10, "a", gpus=8, ran=11 * GPUH, node="n1", requeueable=True),  # level 2, just checkpointed
        running(11, "a", gpus=8, ran=900, node="n2", requeueable=True, attained_gpu_s=2 * GPUH),  # level 1
        running(12, "b", gpus=8, ran=100 * GPUH, node="n3", requeueable=False),  # level 2 but not opted in
        running(13, "b", gpus=8, ran=300, node="n4", requeueable=True, attained_gpu_s=20 * GPUH),  # too young
    ]
    blocked = pending(1, "c", gpus=8)
    decisions = DikePolicy().decide(snapshot([blocked, *victims], alloc=full), params, RNG)
    # 11 h is a whole number of 30-minute checkpoints: job 10 loses nothing, job 11 loses 15 min x 8 GPUs.
    assert [(r.job_id, r.for_job) for r in decisions.requeues] == [(10, 1)]
    pin = decisions.placement_of(1)
    assert isinstance(pin, SetPlacement) and pin.placement == Placement(require_nodes=("n1",))
    off = DikePolicy().decide(snapshot([blocked, *victims], alloc=full), FIXED, RNG)
    assert off.requeues == () and not off.placement_of(1).placement.require_nodes


@pytest.mark.parametrize("policy, params", [
    (DikePolicy(), FIXED.model_copy(update={"preemption": True, "min_runtime_s": 600})),
    (TiresiasPolicy(), TiresiasParams()),
    (SrtfOraclePolicy(), SrtfOraclePolicy.Params(preemptive=True)),
], ids=["dike", "tiresias", "srtf_oracle"])
def test_nobody_is_preempted_for_a_job_slurm_holds_until_its_begin_time(policy, params):
    """A requeued job waits cred_expire + 1 s (reason BeginTime) before Slurm may start it again:
    requeueing a victim for it would only idle the victim's GPUs (seen on the lab, six victims in
    24 s for one held job: docs/replay.md, Fidelity)."""
    full = {"n1": 8, "n2": 8, "n3": 8, "n4": 8}
    victims = [running(10 + i, "a", gpus=8, ran=20 * GPUH, node=f"n{i}", requeueable=True, true_duration_s=90 * GPUH)
               for i in range(1, 5)]

    def requeues(eligible_in: float) -> tuple:
        blocked = pending(1, "c", gpus=8, eligible_time=NOW + eligible_in, true_duration_s=60.0)
        return policy.decide(snapshot([blocked, *victims], alloc=full), params, RNG).requeues

    assert requeues(eligible_in=-1.0)  # eligible: a victim is requeued for it
    assert requeues(eligible_in=90.0) == ()  # held until its begin time: nobody


def test_dike_blocked_means_does_not_fit_on_a_node_not_too_few_free_gpus_in_total():
    params = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 600})
    # 2 free GPUs on each of the 4 nodes: 8 free in total, but no node holds a 4-GPU job.
    victims = [running(10 + i, "a", gpus=6, ran=20 * GPUH, node=f"n{i}", requeueable=True) for i in range(1, 5)]
    alloc = {f"n{i}": 6 for i in range(1, 5)}
    decisions = DikePolicy().decide(snapshot([pending(1, "c", gpus=4), *victims], alloc=alloc), params, RNG)
    assert len(decisions.requeues) == 1 and decisions.requeues[0].for_job == 1
    victim = decisions.requeues[0].job_id
    assert decisions.placement_of(1).placement.require_nodes == (f"n{victim - 10}",)
    # A 2-GPU job fits on any node as it is: nobody is preempted for it.
    fits = DikePolicy().decide(snapshot([pending(1, "c", gpus=2), *victims], alloc=alloc), params, RNG)
    assert fits.requeues == ()


def test_dike_a_heavy_job_gets_two_nodes_under_one_leaf_and_any_better_level_preempts():
    params = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 600})
    # n1 and n3 are free (different leaves); n2 (leaf s1) runs a level-2 job, n4 a level-1 job.
    jobs = [
        running(20, "a", gpus=8, ran=20 * GPUH, node="n2", requeueable=True),  # level 2
        running(21, "a", gpus=8, ran=2 * GPUH, node="n4", requeueable=True, attained_gpu_s=5 * GPUH),  # level 1
        pending(1, "c", gpus=16, attained_gpu_s=2 * GPUH, last_run_s=900),  # level 1, 2 nodes: heavy
    ]
    decisions = DikePolicy().decide(snapshot(jobs, alloc={"n2": 8, "n4": 8}), params, RNG)
    # A level-1 job preempts the level-2 job (never the level-1 one) and gets one whole leaf.
    assert [r.job_id for r in decisions.requeues] == [20]
    assert decisions.placement_of(1).placement.require_nodes == ("n1", "n2")


def test_dike_preemption_backs_off_instead_of_a_per_job_cap():
    params = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 1800, "preemption_backoff": 2.0})
    full = {f"n{i}": 8 for i in range(1, 5)}

    def requeues(ran: float, preemptions: int) -> tuple:
        victim = running(10, gpus=8, ran=ran, node="n1", requeueable=True, preemptions=preemptions,
                         attained_gpu_s=20 * GPUH)
        # bob's job: alice's own job of the same name and size is never preempted for
        return DikePolicy().decide(snapshot([pending(1, "bob", gpus=8), victim], alloc=full), params, RNG).requeues

    assert requeues(ran=1900, preemptions=0)  # once past min_runtime_s
    assert not requeues(ran=1900, preemptions=1)  # preempted once: needs 2 x 1800 s now
    assert requeues(ran=3700, preemptions=1)
    assert not requeues(ran=3700, preemptions=3)  # needs 8 x 1800 s
    assert requeues(ran=8 * 1800 + 60, preemptions=3)  # never immune: only slower


def test_dike_never_requeues_a_job_for_its_own_users_job_of_the_same_name_and_size():
    """The swap would gain nothing to expect but the loss; another name, user or size is preempted
    for as before. With preemption_gain, only for a job expected to run that many times shorter."""
    from dike_slurm.domain.service_prior import FinishedJob, ServicePrior

    params = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 600})
    full = {f"n{i}": 8 for i in range(1, 5)}

    def requeues(params: DikeParams, **blocked) -> tuple:
        victim = running(10, "alice", gpus=8, ran=20 * GPUH, node="n1", requeueable=True, name="train.sh")
        return DikePolicy().decide(snapshot([pending(1, gpus=8, **blocked), victim], alloc=full), params, RNG).requeues

    assert requeues(params, user="alice", name="train.sh") == ()
    assert requeues(params, user="alice", name="eval.sh")
    assert requeues(params, user="bob", name="train.sh")
    # eval.sh ran 20 min, train.sh 10 h: 30x shorter, so a gain of 2 lets it preempt; a gain of 100 not
    history = ([FinishedJob("alice", "eval.sh", 8, 1200.0, NOW - 60 * i) for i in range(1, 40)]
               + [FinishedJob("alice", "train.sh", 8, 36000.0, NOW - 60 * i) for i in range(1, 40)])
    prior = ServicePrior.learn(history)
    victim = running(10, "alice", gpus=8, ran=20 * GPUH, node="n1", requeueable=True, name="train.sh")
    state = replace(snapshot([pending(1, gpus=8, name="eval.sh"), victim], alloc=full), service_prior=prior)
    for gain, expected in ((2.0, [10]), (100.0, [])):
        decided = DikePolicy().decide(state, params.model_copy(update={"preemption_gain": gain}), RNG)
        assert [r.job_id for r in decided.requeues] == expected, gain


def test_dike_says_which_prior_it_used_and_trusts_its_run_times_by_its_power():
    """Decisions.prior: the learned prior's power and job count, the trust in its run times (power /
    prior_power_full, at most 1; 1 with the default 0) and its weight; trust shrinks each expected
    run time toward the median of every finished job, GPUs kept."""
    from dike_slurm.domain.service_prior import FinishedJob, ServicePrior

    rng = random.Random(3)
    history = [FinishedJob(f"u{i % 3}", name, 2, run * rng.uniform(0.9, 1.1), NOW - 60 * i)
               for i, (name, run) in enumerate([("a.sh", 600.0), ("b.sh", 36000.0)] * 40)]
    prior = ServicePrior.learn(history)
    assert 0.5 < prior.power < 1.0
    state = replace(snapshot([pending(1, "u0", gpus=2, name="a.sh")], history=[j.run_s * 2 for j in history]),
                    service_prior=prior)
    params = DikeParams(steer_light_jobs=False)
    used = DikePolicy().decide(state, params, RNG)
    assert (used.prior.power, used.prior.jobs, used.prior.trust, used.prior.weight) == (prior.power, 80, 1.0, 2.0)
    half = DikePolicy().decide(state, params.model_copy(update={"prior_power_full": 2 * prior.power}), RNG)
    assert half.prior.trust == pytest.approx(0.5)
    median = prior.predict("u0", "x.sh", 2, 0, 0.0).gpu_s  # every finished job's median run, x 2 GPUs
    expected, trusted = used.expected[1].gpu_s, half.expected[1].gpu_s
    assert trusted == pytest.approx(math.sqrt(expected * median))
    off = DikePolicy().decide(state, params.model_copy(update={"service_prior": False}), RNG)
    assert off.prior is None and off.expected == {}


def test_dike_cuts_a_run_expected_to_be_short_after_a_share_of_its_expected_run():
    from dike_slurm.domain.service_prior import FinishedJob, ServicePrior

    # alice's finished 8-GPU eval.sh jobs ran 20 min each; train.sh has no history of its own
    prior = ServicePrior.learn([FinishedJob("alice", "eval.sh", 8, 1200.0, NOW - 3600 * i) for i in range(1, 30)])
    full = {f"n{i}": 8 for i in range(1, 5)}
    dike = DikePolicy()

    def requeues(params: DikeParams, ran: float, name: str = "eval.sh", preemptions: int = 0) -> tuple:
        victim = running(10, gpus=8, ran=ran, node="n1", requeueable=True, attained_gpu_s=20 * GPUH, name=name,
                         preemptions=preemptions)
        state = replace(snapshot([pending(1, user="bob", gpus=8), victim], alloc=full), service_prior=prior)
        return dike.decide(state, params, RNG).requeues

    # these invented histories are short (29 jobs, then 1) and have no spread (power 0): the prior
    # may act on any history here
    plain = FIXED.model_copy(update={"preemption": True, "min_runtime_s": 1800, "min_runtime_share": 0.0,
                                     "min_history_jobs": 1, "prior_min_power": -1.0})
    share = plain.model_copy(update={"min_runtime_share": 0.5})
    # at the default, 29 finished jobs are too little evidence: no prediction, so min_runtime_s
    assert not requeues(share.model_copy(update={"min_history_jobs": 50}), ran=610)
    # at the default prior_min_power, a history of power 0 predicts nothing either
    assert not requeues(share.model_copy(update={"prior_min_power": 0.0}), ran=610)
    assert not requeues(plain, ran=700) and requeues(plain, ran=1900)
    # expected 1200 s: cut after half of it, and the backoff still multiplies that
    assert not requeues(share, ran=590) and requeues(share, ran=610)
    assert not requeues(share, ran=1000, preemptions=1) and requeues(share, ran=1810, preemptions=1)
    # predicted from the coarser groups (alice / 8 GPUs): the same 1200 s
    assert requeues(share, ran=610, name="train.sh")
    # a prediction of seconds is never cut before the floor
    tiny = ServicePrior.learn([FinishedJob("alice", "eval.sh", 8, 5.0, NOW - 60)])
    victim = running(10, gpus=8, ran=30, node="n1", requeueable=True, attained_gpu_s=20 * GPUH, name="eval.sh")
    state = replace(snapshot([pending(1, user="bob", gpus=8), victim], alloc=full), service_prior=tiny)
    assert not dike.decide(state, share, RNG).requeues
    assert dike.decide(replace(state, time=NOW + 40), share, RNG).requeues
    # the engine's requeue guard is told the shortest run the policy may cut
    assert dike.requeue_min_run_s(plain) == 1800 and dike.requeue_min_run_s(share) == 60
    assert dike.requeue_min_run_s(share.model_copy(update={"service_prior": False})) == 1800


def test_dike_holds_the_nodes_closest_to_fitting_the_first_blocked_heavy_job():
    params = FIXED.model_copy(update={"preemption": False, "hold_nodes": "blocked"})
    # Every node half busy. Leaf s2's jobs started 1 h ago, leaf s1's 40 h ago: with heavy-tailed
    # run times the young ones are the likelier to end first, so s2 is held for the 16-GPU job.
    jobs = [
        running(10, "a", gpus=4, ran=40 * GPUH, node="n1"), running(11, "a", gpus=4, ran=40 * GPUH, node="n2"),
        running(12, "a", gpus=4, ran=GPUH, node="n3"), running(13, "a", gpus=4, ran=GPUH, node="n4"),
        pending(1, "c", gpus=16, waited=7200),  # heavy, first in line
        pending(2, "d", gpus=2, waited=60),  # light, behind it: fits on s2 now, kept off it
        pending(3, "d", gpus=24, waited=30),  # 3 nodes: without s2's two it could never run, so not kept off
    ]
    alloc = {f"n{i}": 4 for i in range(1, 5)}
    decisions = DikePolicy().decide(snapshot(jobs, alloc=alloc), params, RNG)
    light = decisions.placement_of(2)
    assert isinstance(light, SetPlacement) and light.placement.exclude_nodes == ("n3", "n4")
    assert "held for blocked heavy job 1" in light.reason
    assert not decisions.placement_of(3).placement.exclude_nodes
    assert not decisions.placement_of(1).placement.exclude_nodes  # the held job itself is not kept off
    assert decisions.requeues == ()
    # "promoted" holds only for a job that starvation promotion lifted; "never" (the default) not at all.
    for mode in ("promoted", "never"):
        quiet = DikePolicy().decide(snapshot(jobs, alloc=alloc), params.model_copy(update={"hold_nodes": mode}), RNG)
        assert quiet.placement_of(2) is None or not quiet.placement_of(2).placement.exclude_nodes
    # Level 1 (2 GPU-hours served) but waiting 3 days, past max_wait_s: promoted to level 0.
    starving = [*jobs[:4], pending(1, "c", gpus=16, waited=3 * 86400, attained_gpu_s=2 * GPUH), *jobs[5:]]
    promoted = DikePolicy().decide(
        snapshot(starving, alloc=alloc), params.model_copy(update={"hold_nodes": "promoted"}), RNG
    )
    assert promoted.placement_of(2).placement.exclude_nodes == ("n3", "n4")
    # A 3-node job first in line is bigger than a leaf: nothing is held for it, the hold goes to job 1.
    bigger_first = [*jobs, pending(4, "e", gpus=24, waited=9000)]
    passed_over = DikePolicy().decide(snapshot(bigger_first, alloc=alloc), params, RNG)
    assert "held for blocked heavy job 1" in passed_over.placement_of(2).reason
    # Blockers that may be preempted (opted in, only too young yet): the preemption planner will
    # make room in a later cycle, so nothing is held (measured: holding as well only idles nodes).
    preemptible = [replace(job, requeueable=True) if job.state is JobState.RUNNING else job for job in jobs]
    later = DikePolicy().decide(
        snapshot(preemptible, alloc=alloc), params.model_copy(update={"preemption": True, "min_runtime_s": 200 * GPUH}), RNG
    )
    assert later.requeues == () and not (later.placement_of(2) and later.placement_of(2).placement.exclude_nodes)


def test_dike_node_hold_adds_to_the_steering_exclusions_and_leaves_jobs_that_fit_first_alone():
    params = FIXED.model_copy(update={"preemption": False, "hold_nodes": "blocked", "steer_light_jobs": True})
    # Leaf s2 idle (steering keeps light jobs off it); s1 full but n1's job is young.
    jobs = [
        running(10, "a", gpus=8, ran=GPUH, node="n1"), running(11, "a", gpus=6, ran=30 * GPUH, node="n2"),
        pending(5, "e", gpus=16, waited=9000),  # fits on s2 as it is: takes it, nobody held for it
        pending(1, "c", gpus=8, waited=7200),  # a whole node: blocked once s2 is taken
        pending(2, "d", gpus=1, waited=60),
    ]
    decisions = DikePolicy().decide(snapshot(jobs, alloc={"n1": 8, "n2": 6}), params, RNG)
    light = decisions.placement_of(2)
    # n1's 8 GPUs go first (its job is the youngest): held for job 1, on top of s2's steering.
    assert light.placement.exclude_nodes == ("n1", "n3", "n4")
    assert "steered" in light.reason and "held for blocked heavy job 1" in light.reason


def test_dike_params_reject_bad_thresholds():
    with pytest.raises(ValueError, match="ascending"):
        DikeParams(thresholds_gpuh=[5.0, 1.0])
    with pytest.raises(ValueError, match="levels-1"):
        DikeParams(levels=4, thresholds_gpuh=[1.0, 2.0])


@pytest.mark.parametrize("policy", [FifoPolicy(), TiresiasPolicy(), DikePolicy()])
def test_policies_are_deterministic_and_do_not_mutate(policy):
    jobs = [pending(i, f"u{i % 3}", gpus=1 + i % 9, waited=i * 37.0, attained_gpu_s=i * 500.0, last_run_s=100.0) for i in range(1, 40)]
    snap = snapshot(jobs, usage={"u0": 10 * GPUH, "u1": 1 * GPUH})
    first = policy.decide(snap, policy.Params(), random.Random(1))
    second = policy.decide(snap, policy.Params(), random.Random(1))
    assert first == second
    assert snap.jobs == tuple(jobs)
    assert set(first.order()) == {j.job_id for j in jobs}


def test_only_a_policy_that_reads_finished_jobs_service_is_handed_it():
    from dataclasses import replace

    from dike_slurm.policies.base import Policy

    for policy in (FifoPolicy(), MultifactorPolicy(), TiresiasPolicy(), SrtfOraclePolicy()):
        assert not policy.reads_completed_service(policy.Params())
    dike = DikePolicy()
    assert dike.reads_completed_service(DikeParams())  # derived thresholds: quantiles of that history
    # the service prior ranks a job by where its expected service falls in that history
    assert dike.reads_completed_service(DikeParams(thresholds_gpuh=[1.0, 8.0]))
    configured = DikeParams(thresholds_gpuh=[1.0, 8.0], service_prior=False)
    assert not dike.reads_completed_service(configured)
    assert not dike.reads_service_prior(configured) and dike.reads_service_prior(DikeParams())
    assert Policy.reads_completed_service(dike, configured)  # a policy that does not say gets it
    # and with configured thresholds the history changes nothing in Dike's decisions
    snap = snapshot([pending(1, "alice"), running(2, "bob", attained_gpu_s=7200.0)])
    with_history = replace(snap, completed_service_gpu_s=tuple(float(i) for i in range(100)))
    rng = random.Random
    assert dike.decide(snap, configured, rng(0)) == dike.decide(with_history, configured, rng(0))


def test_dike_reasons_made_when_read_state_level_service_prediction_thresholds_fair_share_and_wait():
    """Dike hands its reasons over as functions (SetPriority: a replay reads none); read, each is
    the text the ranking used to write at once, field for field: a pending job named by its
    prediction, a pending job of no history, a running job (wait 0). Equal and hashed as the
    same decision with the text given."""
    from dike_slurm.domain.decisions import SetPriority
    from dike_slurm.domain.service_prior import FinishedJob, ServicePrior

    history = [FinishedJob("alice", "train.sh", 4, 3600.0 * (1 + i % 3), NOW - 600 * i) for i in range(1, 61)]
    prior = ServicePrior.learn(history)
    state = replace(snapshot([pending(1, "alice", gpus=4, name="train.sh", waited=600.0),
                              pending(2, "bob", gpus=1, name="new.sh", waited=60.0),
                              running(3, "carol", gpus=2, ran=7200.0)],
                             history=[j.run_s * j.gpus for j in history]),
                    service_prior=prior)
    params = DikeParams(steer_light_jobs=False, prior_min_power=-1)
    decisions = DikePolicy().decide(state, params, RNG)
    by_id = {p.job_id: p for p in decisions.priorities}
    assert all(not isinstance(p.made_reason, str) for p in decisions.priorities)
    thresholds = by_id[1].reason.split("; thresholds ")[1].split("; fair=")[0]
    assert thresholds.endswith("gpuh (derived from 60 finished jobs)")
    alice = decisions.expected[1]
    assert by_id[1].reason == (f"level={by_id[1].level} attained=0.00gpuh expected={alice.gpu_s / 3600:.2f}gpuh "
                               f"({alice.describe()}); thresholds {thresholds}; fair=1.00 wait="
                               f"{600 / (600 + params.wait_scale_s):.2f}")
    bob = decisions.expected[2]
    assert bob.gpu_s > 0 and by_id[2].reason.startswith(f"level={by_id[2].level} attained=0.00gpuh expected=")
    assert by_id[2].reason.endswith(f"fair=1.00 wait={60 / (60 + params.wait_scale_s):.2f}")
    assert by_id[3].reason.startswith(f"level={by_id[3].level} attained={2 * 7200 / 3600:.2f}gpuh")
    assert by_id[3].reason.endswith("wait=0.00")
    for decision in decisions.priorities:
        given = SetPriority(decision.job_id, decision.level, decision.score, decision.reason, decision.promoted)
        assert given == decision and hash(given) == hash(decision) and repr(given) == repr(decision)
