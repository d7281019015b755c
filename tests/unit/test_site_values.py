"""A SiteFactor someone else set (an admin's `scontrol update job N SiteFactor=...`) is the site's:
found before the engine writes, on jobs it never touched too, and left alone, said in the plan, the
audit (a left-alone row), explain and the metrics; revert leaves it too."""

from __future__ import annotations

import pytest

from dike_slurm.cli.explain import explain, explain_lines
from dike_slurm.cycle import reconcile
from dike_slurm.cycle.reconcile import site_changes
from dike_slurm.domain.decisions import Decisions, SetPriority
from dike_slurm.domain.fields import JobField
from dike_slurm.domain.model import Job, JobState, Snapshot, Topology
from dike_slurm.ops.metrics import MetricsWatch, registry_of
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.store.state import JobMemory, OwnedField, StateStore

from engine_fixtures import NOW, TOPOLOGY, config, engine, nodes, pending
from fakes import FakeBackend

SITE = JobField.SITE_FACTOR


def owning(written: int) -> dict[JobField, OwnedField]:
    return {SITE: OwnedField(1, SITE, 0, written, 0.0)}


@pytest.mark.parametrize("key, shown, owned, already, why", [
    (SITE, None, {}, (), None),  # Slurm does not show it (a running job, on 22.05): nothing to tell
    (SITE, 0, {}, (), None),  # never written by anyone
    (SITE, 880000, {}, (),
     "SiteFactor 880000 was set outside the engine, which never wrote this job's SiteFactor: left to the site "
     "(with the job's AdminComment)"),
    (SITE, 608590, owning(608590), (), None),  # what the engine wrote
    (SITE, 880000, owning(608590), (),
     "SiteFactor changed to 880000 after the engine set 608590: left to the site (with the job's AdminComment)"),
    (SITE, 0, owning(608590), (),
     "SiteFactor changed to 0 after the engine set 608590: left to the site (with the job's AdminComment)"),
    (SITE, 880000, {}, (SITE,), None),  # left alone already
    (JobField.NICE, 880000, {}, (), None),  # another strategy: SiteFactor is not the engine's field
])
def test_a_site_factor_is_the_sites_when_slurm_shows_one_the_engine_did_not_write(key, shown, owned, already, why):
    assert site_changes(key, shown, owned, already) == (None if why is None else ({SITE}, why))


def test_the_diff_leaves_the_sites_value_and_the_comment_alone_and_says_so():
    jobs = tuple(Job(job_id=i, user="u", state=JobState.PENDING, submit_time=0.0) for i in (1, 2))
    cluster = ClusterState(0.0, jobs, (), Topology(), {1: 880000, 2: 0}, {1: "", 2: ""})
    decisions = Decisions((SetPriority(1, 0, 2.0, "first"), SetPriority(2, 0, 1.0, "second")))
    inputs = reconcile.DiffInputs(snapshot=Snapshot(time=0.0, jobs=jobs, nodes=()), decisions=decisions,
                                  cluster=cluster, memory={}, owned={}, config=config_without_state(),
                                  declared_ceiling=3.0)
    plans, notes = reconcile.diff(inputs)
    kept, written = plans
    assert kept.writes == () and kept.hands_off == (SITE,) and kept.managed
    assert [k for w in written.writes for k in w.update.fields] == [SITE, JobField.ADMIN_COMMENT]
    assert notes == [f"job 1: {kept.hands_off_reason}"] and "SiteFactor 880000 was set outside" in notes[0]
    # once remembered, it is no news: no note
    remembered = {1: JobMemory(1, 0.0, hands_off=(SITE,), hands_off_reason=kept.hands_off_reason)}
    again, notes = reconcile.diff(reconcile.DiffInputs(**{**inputs.__dict__, "memory": remembered}))
    assert notes == [] and again[0].hands_off == (SITE,) and again[0].writes == ()


def config_without_state():
    from dike_slurm.config import Config

    return Config.model_validate({"engine": {"priority_span": 1_000_000}})


def cluster(*jobs) -> FakeBackend:
    return FakeBackend(jobs, nodes(), TOPOLOGY, time=NOW, admin_comments={j.job_id: "" for j in jobs})


def test_a_site_factor_set_before_the_first_cycle_is_kept_audited_once_explained_and_counted(tmp_path):
    backend = cluster(pending(21, "alice"), pending(22, "bob"))
    backend.site_factors[21] = 880000  # scontrol update job 21 SiteFactor=880000
    cfg = config(tmp_path)
    watch = MetricsWatch()
    report = engine(cfg, backend).cycle(apply=True)
    watch.cycled(report)
    assert {u.job_id for u in backend.applied} == {22}  # neither SiteFactor nor AdminComment of job 21
    assert backend.site_factors[21] == 880000 and backend.admin_comments[21] == ""
    plan = report.plan.job(21)
    assert plan.hands_off == (SITE,) and plan.value_now == 880000 and plan.writes == ()
    assert any(n.startswith("job 21: SiteFactor 880000 was set outside the engine") for n in report.plan.notes)
    store = StateStore(cfg.engine.state_db)
    rows = [(e.action, e.change, e.ok, e.command) for e in store.audit_log(21)]
    assert rows == [("left-alone", "SiteFactor 880000 kept", True, "(none)")]
    assert SITE not in store.owned().get(21, {})
    assert report.left_alone == 1 and watch.left_alone == 1
    samples = {(s.name, tuple(s.labels.items())): s.value for f in registry_of(watch).collect() for s in f.samples}
    assert samples["dike_slurm_jobs_left_alone", (("reason", "site"),)] == 1
    assert samples["dike_slurm_jobs_left_alone", (("reason", "user"),)] == 0
    assert samples["dike_slurm_left_alone_total", ()] == 1
    # the next cycles: still kept, and audited once
    again = engine(cfg, backend).cycle(apply=True)
    assert again.outcomes == () and again.left_alone == 0 and backend.site_factors[21] == 880000
    assert len(StateStore(cfg.engine.state_db).audit_log(21)) == 1
    # explain says why; revert leaves the site's value alone
    document = explain(engine(cfg, backend, read_only=True), (21, None), "21")
    job = document["job"]
    assert job["left_to_site"] == plan.hands_off_reason and job["left_to_user"] is None
    assert job["priority_planned"] is None and job["next_writes"] == []
    text = "\n".join(explain_lines(document))
    assert "SiteFactor: now 880000, planned nothing (left to the site, below)" in text
    assert f"left to the site: {plan.hands_off_reason}" in text
    assert "left alone: SiteFactor 880000 kept: SiteFactor 880000 was set outside the engine" in text
    assert "within engine.priority_tolerance" not in text
    assert all(w.job_id != 21 for w in engine(cfg, backend).revert_plan().writes)


def test_a_site_factor_changed_after_the_engine_wrote_is_kept_and_the_engine_lets_go_of_it(tmp_path):
    backend = cluster(pending(1, "alice"), pending(2, "bob"))
    cfg = config(tmp_path)
    engine(cfg, backend).cycle(apply=True)
    written = backend.site_factors[1]
    assert written > 0 and SITE in StateStore(cfg.engine.state_db).owned()[1]
    assert engine(cfg, backend).cycle(apply=True).outcomes == ()  # its own value is no one else's
    backend.site_factors[1] = 5  # an admin's scontrol update
    backend.applied.clear()
    report = engine(cfg, backend).cycle(apply=True)
    assert backend.applied == [] and backend.site_factors[1] == 5
    assert report.plan.job(1).hands_off_reason == (
        f"SiteFactor changed to 5 after the engine set {written}: left to the site (with the job's AdminComment)")
    store = StateStore(cfg.engine.state_db)
    assert SITE not in store.owned()[1] and JobField.ADMIN_COMMENT in store.owned()[1]
    assert [e.action for e in store.audit_log(1)] == ["update", "left-alone"]
    # revert puts back only what is still the engine's: job 1's AdminComment, not the site's SiteFactor
    reverted = {w.job_id: w.update.fields for w in engine(cfg, backend).revert_plan().writes}
    assert reverted[1] == (JobField.ADMIN_COMMENT,) and SITE in reverted[2]


def test_values_someone_else_set_on_every_job_are_all_kept_and_trip_no_breaker(tmp_path):
    backend = cluster(*[pending(i, "alice") for i in range(1, 31)])
    cfg = config(tmp_path, engine={"breaker_min_jobs": 20})
    engine(cfg, backend).cycle(apply=True)
    backend.site_factors = {i: 1 for i in backend.site_factors}  # an admin's script reset every value
    backend.applied.clear()
    report = engine(cfg, backend).cycle(apply=True)
    assert backend.applied == [] and report.plan.guards == () and report.left_alone == 30
    store = StateStore(cfg.engine.state_db)
    assert store.breaker() is None and not any(SITE in fields for fields in store.owned().values())
    assert sum(e.action == "left-alone" for e in store.audit_log()) == 30


@pytest.mark.parametrize("in_slurm, left_alone", [(608590, False), (880000, True)])
def test_the_engines_own_write_whose_outcome_it_never_learned_is_not_the_sites(tmp_path, in_slurm, left_alone):
    """The engine stopped between sending SiteFactor=608590 and recording Slurm's answer (its audit
    row stayed unconfirmed): Slurm holding 608590 is the engine's write; 880000 is someone else's."""
    from dike_slurm.cycle.apply import UNCONFIRMED
    from dike_slurm.store.state import AuditEntry

    backend = cluster(pending(21, "alice"))
    cfg = config(tmp_path)
    store = StateStore(cfg.engine.state_db)
    with store.transaction():
        store.audit(AuditEntry(NOW - 60, 1, 21, "update", "SiteFactor 0 -> 608590; AdminComment '' -> "
                               "'dike:level=0,attained=0.0gpuh'", "(sent)", "SiteFactor=0", False, UNCONFIRMED))
    backend.site_factors[21] = in_slurm
    report = engine(cfg, backend).cycle(apply=True)
    owned = StateStore(cfg.engine.state_db).owned().get(21, {})
    assert (report.plan.job(21).hands_off == (SITE,)) is left_alone and report.left_alone == int(left_alone)
    if left_alone:
        assert SITE not in owned and backend.site_factors[21] == 880000
        return
    assert [(f.original, f.written) for f in report.plan.adopted] == [(0, 608590)]
    assert owned[SITE].original == 0 and owned[SITE].written == backend.site_factors[21]  # then its wanted value
    assert any("SiteFactor 608590 in Slurm is the engine's own write" in n for n in report.plan.notes)
    assert engine(cfg, backend).cycle(apply=True).plan.adopted == ()  # owned now: no second look
    (undo,) = [dict(w.update.values) for w in engine(cfg, backend).revert_plan().writes if w.job_id == 21]
    assert undo[SITE] == 0  # revert puts back the value before the engine's write


COMMENT = "dike:level=0,attained=0.0gpuh"


@pytest.mark.parametrize("shown, comment_owned, comment_shown, lost", [
    (0, True, "", True),  # both of the engine's values gone: a controller that lost its state
    (0, False, "", True),  # the engine owns no AdminComment: its value back at the original is taken as lost
    (0, True, COMMENT, False),  # the engine's AdminComment still there: someone set SiteFactor 0
    (5, True, "", False),  # a value that is not the original: someone else's
    (608590, True, "", False),  # the engine's own value
    (None, True, "", False),  # not shown
])
def test_a_write_slurm_lost_is_told_from_a_value_someone_set(shown, comment_owned, comment_shown, lost):
    owned = owning(608590)
    if comment_owned:
        owned[JobField.ADMIN_COMMENT] = OwnedField(1, JobField.ADMIN_COMMENT, "", COMMENT, 0.0)
    assert reconcile.lost_write(shown, owned, comment_shown) is lost
    if lost:
        assert site_changes(SITE, shown, owned, (), lost) is None


def test_values_a_killed_controller_lost_are_written_again(tmp_path):
    backend = cluster(pending(1, "alice"), pending(2, "bob"))
    cfg = config(tmp_path)
    engine(cfg, backend).cycle(apply=True)
    written = dict(backend.site_factors)
    backend.site_factors[1], backend.admin_comments[1] = 0, ""  # slurmctld SIGKILLed before it saved them
    backend.applied.clear()
    report = engine(cfg, backend).cycle(apply=True)
    assert [u.job_id for u in backend.applied] == [1] and report.left_alone == 0
    assert backend.site_factors == written and backend.admin_comments[1].startswith("dike:level=0,")
