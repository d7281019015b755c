"""The service prior: its groups, its fallbacks, and the learner's views against learning at once."""

from __future__ import annotations

import math
from dataclasses import replace
import random
import statistics

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.domain.service_prior import (
    NEVER_RAN_S, GROUPS, FinishedJob, Prediction, PriorLearner, ServicePrior, _keys, never_ran)


def job(user="alice", name="train.sh", gpus=4, run_s=3600.0, end=0.0):
    return FinishedJob(user, name, gpus, run_s, end)


@given(st.text(max_size=5), st.text(max_size=5), st.integers(min_value=-2, max_value=64))
def test_the_written_out_keys_are_the_groups_fields(user, name, gpus):
    """_keys, written out for speed, is GROUPS read field by field."""
    values = {"user": user, "name": name, "gpus": str(gpus)}
    expected = []
    for index, group in enumerate(GROUPS):
        shown = tuple(values[field] for field in group)
        expected.append(((index, *shown), shown))
    assert _keys(user, name, gpus) == expected


def test_a_job_that_never_really_ran_moves_only_its_own_users_expected_service():
    """Cancelled, failed, out of memory or lost with its node in its first NEVER_RAN_S: learned by its
    user's groups only and counted in no one's evidence (`jobs`, which min_history_jobs reads);
    completed or timed out however short, or cancelled after a real run: learned by every group. The engine's accounting
    reader and the replay's history apply the same rule (the engine-against-replay tests run a trace
    that has such jobs)."""
    from dike_slurm.domain.model import JobState
    from dike_slurm.slurm.usage import Run, finished_jobs

    for state in ("CANCELLED", "FAILED", "OUT_OF_MEMORY", "NODE_FAIL"):
        assert never_ran(state, 78.0) and never_ran(state, NEVER_RAN_S - 1) and not never_ran(state, NEVER_RAN_S)
    assert not never_ran("COMPLETED", 5.0) and not never_ran("TIMEOUT", 5.0)
    runs = [Run(1, "u", "a", 2, 0.0, 78.0, True, "x", state=JobState.CANCELLED),
            Run(2, "u", "a", 2, 0.0, 78.0, True, "x", state=JobState.COMPLETED),
            Run(3, "u", "a", 2, 0.0, 50.0, False, "x", state=JobState.REQUEUED),  # requeued, then ran on
            Run(3, "u", "a", 2, 100.0, 400.0, True, "x", state=JobState.FAILED)]  # 350 s in all: a real run
    assert [(job.run_s, job.own_only) for job in finished_jobs(runs, 1000.0)] == [(78.0, True), (78.0, False),
                                                                                   (350.0, False)]
    # the lab's case: others' jobs ran 2 h; alice's job cancelled after 78 s moves bob's prediction
    # (every finished job, and the same name and size) not at all, and alice's own downward
    others = [FinishedJob("carol", "train.sh", 4, 7200.0, float(i)) for i in range(60)]
    cancelled = FinishedJob("alice", "train.sh", 4, 78.0, 100.0, own_only=True)
    before, after = ServicePrior.learn(others), ServicePrior.learn([*others, cancelled])
    assert after.predict("bob", "train.sh", 4, 10.0) == before.predict("bob", "train.sh", 4, 10.0)
    assert after.predict("alice", "train.sh", 4, 10.0).gpu_s < before.predict("alice", "train.sh", 4, 10.0).gpu_s
    # not evidence for anyone (it cannot bring the prior into force), but counted as what it is
    assert (after.jobs, after.not_run) == (before.jobs, 1) and before.not_run == 0
    learner = PriorLearner()
    for finished in [*others, cancelled]:
        learner.add(finished)
    assert (learner.view().jobs, learner.view().not_run) == (before.jobs, 1)
    learner.remove(cancelled)
    assert (learner.view().jobs, learner.view().not_run) == (before.jobs, 0)


def test_without_shrinkage_the_finest_group_with_jobs_answers_and_says_which():
    prior = ServicePrior.learn(
        [job(run_s=100.0), job(run_s=300.0), job(run_s=200.0), job(name="eval.sh", run_s=10.0)]
        + [job(user="bob", run_s=9000.0) for _ in range(5)]
    )
    own = prior.predict("alice", "train.sh", 4, 0)
    assert (own.gpu_s, own.count, own.group) == (pytest.approx(200.0 * 4), 3, ("user", "name", "gpus"))
    assert own.describe() == "0.222 GPU-h from 3 finished jobs of alice / train.sh / 4 GPUs"
    assert own.own
    # a name alice never ran on 2 GPUs: alice's own jobs (median of 10, 100, 200, 300) per GPU
    fallback = prior.predict("alice", "other.sh", 2, 0)
    assert (fallback.gpu_s, fallback.group, fallback.count) == (pytest.approx(150.0 * 2), ("user",), 4)


def test_a_small_group_is_shrunk_toward_the_groups_above_it():
    """alice's one job ran 100 s, bob's nine of the same name and size 10,000 s. Each of alice's four
    own groups (one job each) pulls the estimate by 1 / (1 + 10) toward 100 s, in log space."""
    prior = ServicePrior.learn([job(run_s=100.0)] + [job(user="bob", run_s=10_000.0)] * 9)
    shrunk = prior.predict("alice", "train.sh", 4, 10)
    expected_log = math.log(100.0) + (math.log(10_000.0) - math.log(100.0)) * (10 / 11) ** 4
    assert shrunk.gpu_s == pytest.approx(math.exp(expected_log) * 4)
    assert (shrunk.group, shrunk.count) == (("user", "name", "gpus"), 1)  # named by the finest group with jobs
    assert prior.predict("alice", "train.sh", 4, 0).gpu_s == pytest.approx(400.0)  # no shrinkage: alice's own
    # every group agrees: shrinkage changes nothing
    same = ServicePrior.learn([job(run_s=700.0)] * 4)
    assert same.predict("alice", "train.sh", 4, 10).gpu_s == pytest.approx(2800.0)


def test_a_new_user_borrows_from_every_user_and_sees_only_a_count():
    prior = ServicePrior.learn([job(run_s=100.0)] * 3 + [job(user="bob", run_s=9000.0)] * 5)
    stranger = prior.predict("carol", "train.sh", 4, 0)
    assert (stranger.group, stranger.count, stranger.gpu_s) == (("name", "gpus"), 8, pytest.approx(9000.0 * 4))
    assert stranger.describe() == "10 GPU-h from 8 finished jobs of train.sh / 4 GPUs"
    assert not stranger.own
    elsewhere = prior.predict("carol", "x", 2, 0)
    assert (elsewhere.group, elsewhere.gpu_s) == ((), pytest.approx(9000.0 * 2))  # every job: the median per GPU
    assert elsewhere.describe() == "5 GPU-h from 8 finished jobs (every finished job)"


def test_no_prediction_without_gpus_or_history():
    prior = ServicePrior.learn([job(), job()])
    assert prior.predict("alice", "train.sh", 0, 10) is None
    assert ServicePrior.learn([]).predict("alice", "x", 1, 10) is None
    assert ServicePrior.learn([job(gpus=0)]).jobs == 0  # jobs without GPUs teach nothing


finished = st.builds(
    FinishedJob,
    user=st.sampled_from(["a", "b", "c"]),
    name=st.sampled_from(["x", "y"]),
    gpus=st.sampled_from([0, 1, 2, 8]),
    run_s=st.floats(0, 1e6, allow_nan=False).map(lambda v: round(v, 1)),
    end=st.just(0.0),
    own_only=st.booleans(),
)


def plain_predict(prior: ServicePrior, user: str, name: str, gpus: int, shrink_jobs: float):
    """The prediction as the module's docstring states it, group by group through `_keys` and
    `estimate`, each group's log worked out where it is read: what `predict`'s written-out fold
    must equal bit for bit."""
    if gpus <= 0:
        return None
    log_run, finest = None, None
    for index, (key, shown) in reversed(list(enumerate(_keys(user, name, gpus)))):
        estimate = prior.estimate(key)
        if estimate is None:
            continue
        mine = math.log(max(estimate.run_s, 1.0))
        log_run = mine if log_run is None else log_run + (mine - log_run) * estimate.count / (estimate.count + shrink_jobs)
        finest = (index, shown, estimate.count)
    if log_run is None:
        return None
    index, shown, count = finest
    overrun = prior.estimate((-1, user))
    factor = overrun.run_s if overrun is not None else 1.0
    return Prediction(math.exp(log_run) * gpus * factor, GROUPS[index], shown, count, factor)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), finished), max_size=80), st.sampled_from([0, 0.5, 2, 10]))
def test_the_written_out_prediction_is_the_plain_fold_bit_for_bit(steps, shrink):
    """predict folds the groups written out, with each estimate's log kept: on learner views (base
    and recent changes both read) every answer equals the plain fold's, float for float."""
    learner, held = PriorLearner(), []
    for remove, item in steps:
        if remove and held:
            learner.remove(held.pop(0))
        else:
            learner.add(item)
            held.append(item)
        view = learner.view()
        for user in "abz":
            for name in "xz":
                for gpus in (0, 1, 8, 3):
                    assert view.predict(user, name, gpus, shrink) == plain_predict(view, user, name, gpus, shrink)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), finished), max_size=120))
def test_the_learner_views_match_learning_at_once_and_never_change_after(steps):
    """Adds and removes in any order (a removal forgets an earlier add): every view equals the
    prior learned at once from the jobs held then, and stays so after later changes. Each view is
    asked once when it is taken too, so that the answers it keeps are checked after those changes."""
    learner, held, views = PriorLearner(), [], []
    for remove, item in steps:
        if remove and held:
            gone = held.pop(0)
            learner.remove(gone)
        else:
            learner.add(item)
            held.append(item)
        view = learner.view()
        view.predict(item.user, item.name, item.gpus, 2)
        views.append((view, list(held)))
    for view, then in views:
        plain = ServicePrior.learn(then)
        assert view.jobs == plain.jobs
        assert view.power == plain.power  # exactly: the moments are integers
        for user in "abcz":
            for name in "xyz":
                for gpus in (1, 2, 8, 3):
                    for shrink in (0, 2, 10):
                        assert view.predict(user, name, gpus, shrink) == plain.predict(user, name, gpus, shrink)


def test_the_power_is_the_leave_one_out_correlation_less_twice_its_error():
    """Against the correlation worked out job by job (each job's log run time against the mean of
    the other jobs of its group), for both groupings, the higher less 2 / sqrt(jobs); about 0 where
    run times are unrelated to users, names and GPU counts, high where the group tells them."""
    rng = random.Random(4)
    users, names = ["a", "b", "c", "d"], ["x.sh", "y.sh", "z.sh"]
    told = [FinishedJob(rng.choice(users), name, gpus, rng.uniform(0.8, 1.2) * 600 * (1 + names.index(name)) * gpus,
                        0.0) for name, gpus in ((rng.choice(names), rng.choice([1, 2, 4])) for _ in range(400))]
    noise = [replace(j, run_s=math.exp(rng.gauss(7, 1.5))) for j in told]

    def plain(jobs, field) -> float:
        groups: dict = {}
        for j in jobs:
            groups.setdefault(field(j), []).append(math.log(max(j.run_s, 1.0)))
        pairs = [(x, (sum(v) - x) / (len(v) - 1)) for v in groups.values() if len(v) > 1 for x in v]
        return statistics.correlation(*zip(*pairs)) - 2 / math.sqrt(len(pairs))

    for jobs in (told, noise):
        expected = max(0.0, plain(jobs, lambda j: (j.user, j.name, j.gpus)), plain(jobs, lambda j: j.gpus))
        assert ServicePrior.learn(jobs).power == pytest.approx(expected, abs=1e-6)
    assert ServicePrior.learn(told).power > 0.8 and ServicePrior.learn(noise).power == 0.0
    assert ServicePrior.learn(told[:2]).power == 0.0  # no pair: nothing known


def test_trust_shrinks_the_run_time_toward_every_finished_jobs_median_and_keeps_the_gpus():
    """trust 1: the prediction as it is; 0: every job the median run of every finished job times its
    GPUs; between, the geometric mix (the overrun factor shrinks with it)."""
    prior = ServicePrior.learn([job(run_s=100.0)] * 5 + [job(user="bob", name="x.sh", run_s=10_000.0)] * 6)
    full = prior.predict("alice", "train.sh", 4, 0)
    assert prior.predict("alice", "train.sh", 4, 0, 1.0) is full
    none = prior.predict("alice", "train.sh", 4, 0, 0.0)
    assert none.gpu_s == pytest.approx(10_000.0 * 4) and none.overrun == 1.0  # median of 11 jobs: 10,000 s
    half = prior.predict("alice", "train.sh", 4, 0, 0.5)
    assert half.gpu_s == pytest.approx(math.sqrt(100.0 * 10_000.0) * 4)
    assert (half.group, half.count) == (full.group, full.count)


def test_the_statistic_is_the_median_of_run_times_charged_for_the_users_overruns():
    """One odd job does not move the median; it does charge its user: the group used 1,008 s where
    its median says 4 x 3.5 s, and every prediction for the user is multiplied by that ratio."""
    runs = [5.0, 1.0, 1000.0, 2.0]
    prior = ServicePrior.learn([job(run_s=r) for r in runs] + [job(user="bob", run_s=r) for r in (5.0, 6.0, 7.0)])
    charged = prior.predict("alice", "train.sh", 1, 0)  # no shrinkage: alice's own group alone
    overrun = sum(runs) / (len(runs) * statistics.median(runs))
    assert charged.overrun == pytest.approx(overrun)
    assert charged.gpu_s == pytest.approx(statistics.median(runs) * overrun)
    assert charged.describe().endswith(f", x{overrun:.2g}: this user's jobs overran their groups' medians")
    steady = prior.predict("bob", "train.sh", 1, 0)  # bob's jobs ran as their median says: no charge
    assert (steady.overrun, steady.gpu_s) == (1.0, pytest.approx(6.0))


# ----------------------------------------------------------------------------- no lookahead in the replay

SLURM_CONF = "NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-2] Default=YES\n"


def _trace(longer_after: float | None = None, ends: dict[int, float] | None = None):
    """Invented: 60 jobs of three users and four job names on 16 GPUs, arriving faster than they
    run; with `longer_after`, every job that ended after that time (in `ends`) runs 3x longer."""
    from dike_slurm.sim.kernel.trace import TraceJob

    jobs = []
    for i in range(60):
        duration = 300.0 + 900.0 * ((i * 7) % 5) + 60.0 * (i % 3)
        if longer_after is not None and ends[100 + i] > longer_after:
            duration *= 3
        jobs.append(TraceJob(
            job_id=100 + i, display_id=str(100 + i), user=f"user{i % 3}", account="research", partition="gpu",
            qos="normal", name=f"train{(i * 7) % 4}", comment="", submit=1_000_000.0 + 120.0 * i,
            eligible_delay_s=0.0, duration_s=duration, time_limit_s=None, gpus=(1, 2, 4, 8)[i % 4], num_nodes=1,
            cpus=1,
        ))
    return jobs


def _decisions_seen(policy_name: str, jobs, **params):
    """Every (snapshot time, order, levels, scores) the policy decided in a replay of `jobs`, and each job's end."""
    from dike_slurm.slurm.slurm_conf import parse_slurm_conf
    from dike_slurm.registry import default_registry
    from dike_slurm.sim.kernel.cluster import SimCluster
    from dike_slurm.sim.kernel.records import SimSettings, Timeline
    from dike_slurm.sim.kernel.simulator import Simulator
    from dike_slurm.domain.model import Topology

    policy = default_registry().create(policy_name)
    seen = []
    inner = policy.decide

    def recording(snapshot, params, rng):
        decisions = inner(snapshot, params, rng)
        seen.append((snapshot.time, decisions.order(), tuple((p.job_id, p.level, p.score) for p in decisions.priorities)))
        return decisions

    policy.decide = recording  # type: ignore[method-assign]
    ends = {}
    Simulator(jobs, SimCluster(parse_slurm_conf(SLURM_CONF), Topology()), policy, policy.Params(**params),
              SimSettings(), Timeline(origin=jobs[0].submit, width=60.0),
              lambda result: ends.__setitem__(result.job_id, result.end)).run()
    return seen, ends


def _before(seen, cut):
    return [entry for entry in seen if entry[0] < cut]


def test_the_prior_never_looks_ahead_durations_of_jobs_ending_later_change_no_earlier_decision():
    """The replay's prior learns only from jobs that ended before the simulated now: making every
    job that ends after T run longer leaves every decision before T as it was."""
    seen, ends = _decisions_seen("dike", _trace(), min_history_jobs=5, preemption=False)
    cut = sorted(ends.values())[len(ends) // 2]  # half the jobs have ended by then
    changed, _ = _decisions_seen("dike", _trace(cut, ends), min_history_jobs=5, preemption=False)
    before = _before(seen, cut)
    assert len(before) > 10 and any(len(order) > 5 for _, order, _ in before)  # a queue was there to order
    assert _before(changed, cut) == before
    assert changed != seen  # the longer jobs did change what came after


def test_the_lookahead_check_catches_a_policy_that_reads_the_future():
    """The same check on the oracle, which reads the true durations, finds the change: the test above can fail."""
    seen, ends = _decisions_seen("srtf_oracle", _trace())
    cut = sorted(ends.values())[len(ends) // 2]
    changed, _ = _decisions_seen("srtf_oracle", _trace(cut, ends))
    assert _before(changed, cut) != _before(seen, cut)


# ----------------------------------------------------------------------------- gaming the prior

FOUR_NODES = "NodeName=n[1-4] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-4] Default=YES\n"


def _gaming_trace(seed: int, naming: str):
    """Invented: six users submit 1,500 jobs of 1, 2 or 4 GPUs to 32 GPUs at about 93% load; a fifth of
    the jobs run 3-5 h and are named long.sh, the rest run 10-30 min and are named short.sh. User u0
    names them `honest`ly, names its long jobs short.sh (`mislabel`), or names every job alike (`alike`)."""
    from dike_slurm.sim.kernel.trace import TraceJob

    rng, jobs, now = random.Random(seed), [], 1_000_000.0
    for i in range(1500):
        user = f"u{i % 6}"
        long = rng.random() < 0.2
        duration = rng.uniform(3, 5) * 3600 if long else rng.uniform(600, 1800)
        name = "long.sh" if long else "short.sh"
        if user == "u0" and naming == "mislabel":
            name = "short.sh"
        elif user == "u0" and naming == "alike":
            name = "job.sh"
        gpus = rng.choice([1, 2, 4])
        now += rng.expovariate(1 / 300.0)
        jobs.append(TraceJob(
            job_id=1000 + i, display_id=str(1000 + i), user=user, account="research", partition="gpu", qos="normal",
            name=name, comment="", submit=now, eligible_delay_s=0.0, duration_s=duration, time_limit_s=None, gpus=gpus,
            num_nodes=1, cpus=1,
        ))
    return jobs


def _total_jct(jobs) -> tuple[float, float]:
    """(u0's, the other users') total JCT under Dike's defaults but the prior in force whatever its
    power (prior_min_power = -1), no job preemptible. At the defaults the gate keeps the prior out
    of the cycles where its power is 0, and there the two namings replay identically (ratios exactly
    1.0, 2026-12-07): the prior forced on is the case a gamer could exploit."""
    # preemptible=0: SimSettings' own default is every job preemptible
    from dike_slurm.domain.model import Topology
    from dike_slurm.slurm.slurm_conf import parse_slurm_conf
    from dike_slurm.registry import default_registry
    from dike_slurm.sim.kernel.cluster import SimCluster
    from dike_slurm.sim.kernel.records import SimSettings, Timeline
    from dike_slurm.sim.kernel.simulator import Simulator

    policy, results = default_registry().create("dike"), []
    Simulator(jobs, SimCluster(parse_slurm_conf(FOUR_NODES), Topology()), policy, policy.Params(prior_min_power=-1),
              SimSettings(preemptible=0.0), Timeline(origin=jobs[0].submit, width=60.0), results.append).run()
    return (sum(r.jct_s for r in results if r.user == "u0"), sum(r.jct_s for r in results if r.user != "u0"))


def test_a_user_who_names_long_jobs_like_short_ones_gains_no_more_than_one_who_names_every_job_alike():
    """Over three invented traces, on day one (the engine's default: no job opted in to
    preemption): mislabelling long jobs pays that user no more than giving no information at all
    (every job named alike), within 0.5%, and costs the other users no more, within 1%: the mixed
    group's median stays short, but the user's overrun factor charges every job of theirs for what
    the long ones used.

    The tolerances are measured against naming alike, so the honest replays (which only scaled
    them) are not run. On these three traces (2026-12-07, the prior forced on: `_total_jct`):
    alike/mislabel 0.980 for the user and mislabel/alike 1.004 for the others; honest/alike 1.164 and honest/mislabel 1.141 for the user.
    Until then the test ran with every job preemptible (SimSettings' default), against what this
    line said: there alike/mislabel was 0.986 and 0.987, the same verdict (docs/results.md,
    "Gaming the prior"). A shortest-expected-first order pays a user who hides the spread of their
    jobs (issue 27 asked for at most 5% over honest names)."""
    totals = {naming: [0.0, 0.0] for naming in ("mislabel", "alike")}
    for seed in range(3):
        for naming, total in totals.items():
            gamer, others = _total_jct(_gaming_trace(seed, naming))
            total[0] += gamer
            total[1] += others
    (mislabel_gamer, mislabel_others), (alike_gamer, alike_others) = totals["mislabel"], totals["alike"]
    gain_over_no_information = alike_gamer / mislabel_gamer
    assert gain_over_no_information <= 1.005, gain_over_no_information
    cost_over_no_information = mislabel_others / alike_others
    assert cost_over_no_information <= 1.01, cost_over_no_information


def _no_signal_trace(seed: int):
    """Invented: 900 jobs of six users at about 90% load on 32 GPUs, whose run times (lognormal, 5 min
    to a day) are drawn apart from their users, names and GPU counts: history predicts nothing."""
    from dike_slurm.sim.kernel.trace import TraceJob

    rng, jobs, now = random.Random(seed), [], 1_000_000.0
    for i in range(900):
        gpus = rng.choice([1, 2, 4, 8])
        now += rng.expovariate(1 / 1000.0)
        jobs.append(TraceJob(
            job_id=1000 + i, display_id=str(1000 + i), user=f"u{rng.randrange(6)}", account="research",
            partition="gpu", qos="normal", name=rng.choice(["train.sh", "eval.sh", "sweep.sh", "ft.sh"]), comment="",
            submit=now, eligible_delay_s=0.0, duration_s=min(86400.0, math.exp(rng.gauss(math.log(3600.0), 1.2))),
            time_limit_s=None, gpus=gpus, num_nodes=1, cpus=1,
        ))
    return jobs


def test_where_history_predicts_nothing_the_prior_moves_nothing():
    """At the defaults (prior_min_power = 0) the prior moves no job while its power is 0: on a trace
    whose run times nothing predicts, its weight is 0 in every cycle (at most 0.05 asked) and every
    job starts and ends as with `service_prior = false`, day one (no job preemptible). With
    prior_min_power = -1 (the prior whatever its power) the starts differ."""
    from dike_slurm.domain.model import Topology
    from dike_slurm.registry import default_registry
    from dike_slurm.sim.kernel.cluster import SimCluster
    from dike_slurm.sim.kernel.records import SimSettings, Timeline
    from dike_slurm.sim.kernel.simulator import Simulator
    from dike_slurm.slurm.slurm_conf import parse_slurm_conf

    jobs = _no_signal_trace(5)
    runs = {}
    for label, overrides in (("gated", {}), ("no prior", {"service_prior": False})):
        policy, results, weights = default_registry().create("dike"), [], []
        decide = policy.decide

        def recording(snapshot, params, rng, decide=decide, weights=weights):
            decisions = decide(snapshot, params, rng)
            weights.append((decisions.prior.power, decisions.prior.weight) if decisions.prior else None)
            return decisions

        policy.decide = recording  # type: ignore[method-assign]
        params = policy.Params(**overrides)
        Simulator(jobs, SimCluster(parse_slurm_conf(FOUR_NODES), Topology()), policy, params,
                  SimSettings(preemptible=0.0), Timeline(origin=jobs[0].submit, width=60.0), results.append).run()
        runs[label] = (sorted((r.job_id, r.start, r.end) for r in results), weights)
    (gated, weights), (plain, none_learned) = runs["gated"], runs["no prior"]
    assert len(gated) == 900 and gated == plain
    assert weights and all(w is not None and w[1] <= 0.05 for w in weights), max(w[1] for w in weights)
    assert max(power for power, _ in weights) == 0.0  # nothing here for it to know
    assert set(none_learned) == {None}
