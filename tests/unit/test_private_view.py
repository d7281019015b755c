"""Issue 30: what a user PrivateData=jobs restricts sees (cli/visibility.py, views.published_rows,
explain_published), from recorded `scontrol show config` and `sacctmgr show user` output. The
end-to-end test as a real user is tests/integration/test_private_data_lab.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dike_slurm.domain.admin_comment import Published, admin_comment_text, published
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.domain.fields import JobField
from dike_slurm.parsing.slurm_options import parse_show_config
from dike_slurm.cli.visibility import private_data, read_viewer, slurm_user, viewer_from
from dike_slurm.config import Config
from dike_slurm.errors import DikeError
from dike_slurm.domain.model import Job, JobState, Topology

FIXTURES = Path(__file__).parents[1] / "fixtures"
VERSIONS = ("22.05", "24.11")


def options(version: str, private: bool) -> dict[str, str]:
    name = "scontrol-show-config-privatedata-jobs.txt" if private else "scontrol-show-config.txt"
    return parse_show_config((FIXTURES / f"slurm-{version}" / name).read_text())


def test_published_reads_back_what_the_engine_writes_and_nothing_else():
    assert published(admin_comment_text(2, 3.26 * 3600, False)) == Published(2, 3.3, False)
    assert published(admin_comment_text(0, 0.0, True)) == Published(0, 0.0, True)
    assert published("dike:level=1 attained=3.2gpuh") == Published(1, 3.2, False)  # the older form
    for foreign in ("", "maintenance window", "dike:level=x,attained=1gpuh", "dike:level=1,attained=1gpuh,extra",
                    "xdike:level=1,attained=1.0gpuh"):
        assert published(foreign) is None, foreign


@pytest.mark.parametrize("version", VERSIONS)
def test_the_recorded_configuration_names_private_data_and_the_slurm_user(version):
    assert private_data(options(version, private=False)) == set()
    assert private_data(options(version, private=True)) == {"jobs"}
    assert slurm_user(options(version, private=True)) == "root"  # `SlurmUser = root(0)` on the lab


@pytest.mark.parametrize("version", VERSIONS)
def test_who_slurm_restricts(version):
    def never() -> str | None:
        raise AssertionError("AdminLevel asked where it decides nothing")

    assert not viewer_from("dikeuser2", options(version, private=False), never).restricted
    private = options(version, private=True)
    assert not viewer_from("root", private, never).restricted  # root and SlurmUser (root on the lab)
    recorded = (FIXTURES / f"slurm-{version}" / "sacctmgr-show-user-dikeuser2.txt").read_text()
    level = recorded.strip().split("|")[1]
    restricted = viewer_from("dikeuser2", private, lambda: level)
    assert level == "None" and restricted.restricted and "only their own jobs" in restricted.why
    for admin in ("Operator", "Administrator"):
        assert not viewer_from("dikeuser2", private, lambda: admin).restricted  # noqa: B023
    assert viewer_from("dikeuser2", private, lambda: None).restricted  # slurmdbd down: the narrower view


def test_read_viewer_asks_slurm_only_what_it_needs_and_root_nothing():
    config = Config()
    asked: list[list[str]] = []
    show = (FIXTURES / "slurm-22.05" / "scontrol-show-config-privatedata-jobs.txt").read_text()

    def run(argv: list[str]) -> str:
        asked.append(argv)
        if argv[0] == "scontrol":
            return show
        raise DikeError("sacctmgr: slurmdbd not answering")

    assert not read_viewer(config, run, "root").restricted and asked == []
    assert read_viewer(config, run, "dikeuser2").restricted
    assert asked == [["scontrol", "show", "config"],
                     ["sacctmgr", "-n", "-P", "show", "user", "dikeuser2", "format=user,adminlevel"]]

    def down(argv: list[str]) -> str:
        raise DikeError("scontrol show config failed: Unable to contact slurm controller")

    viewer = read_viewer(config, down, "dikeuser2")
    assert viewer.restricted and "Unable to contact slurm controller" in viewer.why


def job(job_id: int, user: str, partition: str = "gpu") -> Job:
    return Job.build(job_id=job_id, user=user, state=JobState.PENDING, submit_time=0.0, gpus=8, num_nodes=1,
                     account="research", partition=partition, name=f"n{job_id}", slurm_reason="Priority")


def test_published_rows_carry_the_engines_numbers_and_nothing_it_alone_knows():
    from dike_slurm.cli.explain import explain_lines, explain_published
    from dike_slurm.cli.views import published_rows

    cluster = ClusterState(
        time=0.0, jobs=(job(7, "dikeuser2"), job(8, "dikeuser2"), job(9, "dikeuser2", partition="cpu")),
        nodes=(), topology=Topology.from_switches([]), site_factors={7: 766197, 8: 0},
        admin_comments={7: admin_comment_text(1, 0.72 * 3600, False), 8: "an admin's note"})
    rows = {r["job_id"]: r for r in published_rows(cluster, JobField.SITE_FACTOR, lambda j: j.partition == "gpu")}
    assert (rows[7]["level"], rows[7]["attained_gpu_hours"], rows[7]["priority_now"]) == (1, 0.7, 766197)
    assert rows[7]["managed"] and rows[7]["priority_planned"] is None and rows[7]["reason"] == ""
    assert rows[7]["expected_gpu_hours"] is None and rows[7]["note"] == "published by the engine (AdminComment)"
    assert rows[8]["level"] is None and rows[8]["note"] == "no level published yet"
    assert not rows[9]["managed"] and rows[9]["note"] == "outside the engine's scope"

    class Engine:
        class policy:
            name = "dike"

        class params:
            @staticmethod
            def model_dump(mode: str) -> dict:
                return {"thresholds_gpuh": [0.5, 5.0]}

    listed = list(rows.values())
    active = explain_published(Engine, cluster, listed, (7, None), "7")
    assert active["status"] == "active" and active["job"]["level"] == 1 and active["audit"] == []
    text = "\n".join(explain_lines(active))
    assert "level 1, attained service 0.7 GPU-hours" in text and "SiteFactor: 766197" in text
    assert "where it stands: not shown" in text and "thresholds_gpuh" not in text
    assert "thresholds_gpuh=[0.5, 5.0]" in "\n".join(explain_lines(active, verbose=True))
    assert explain_published(Engine, cluster, listed, (9, None), "9")["status"] == "outside-scope"
    hidden = explain_published(Engine, cluster, listed, (6, None), "6")
    assert hidden["status"] == "unknown" and hidden["job"] is None
    assert explain_lines(hidden)[0].startswith("job 6: not in the queue as Slurm shows it to you")


def test_the_audit_of_one_user_holds_their_jobs_rows_only(tmp_path):
    from dike_slurm.store.state import AuditEntry, StateStore

    store = StateStore(tmp_path / "state.sqlite")
    for at, job_id, user in ((1.0, 5, "alice"), (2.0, 6, "bob"), (3.0, 0, ""), (4.0, 7, "alice"), (5.0, 8, "bob")):
        store.audit(AuditEntry(at, 1, job_id, "update", "x", "cmd", "undo", True, user=user))
    store._db.commit()
    reader = StateStore(tmp_path / "state.sqlite", read_only=True)
    assert [e.job_id for e in reader.audit_log(user="alice")] == [5, 7]  # not the engine's own row (job 0)
    assert [e.job_id for e in reader.audit_log(limit=1, user="alice")] == [7]  # the limit counts alice's rows
    assert [e.job_id for e in reader.iter_audit(since=2.0, user="bob")] == [6, 8]
    assert [e.job_id for e in reader.audit_log(6, user="alice")] == []
    assert len(reader.audit_log()) == 5


def test_a_user_who_cannot_read_the_store_is_not_told_a_job_is_unknown_to_the_engine():
    from dike_slurm.cli.explain import explain_lines

    gone = {"status": "unknown", "job": None, "query": "5", "view": "engine", "owned": [], "audit": []}
    assert "not in the engine's state store" in explain_lines(gone | {"note": None})[0]
    unread = explain_lines(gone | {"note": "state file not read (unable to open database file)"})
    assert unread == ["job 5: not in the queue; the engine's records of finished jobs are in its state store, "
                      "which you cannot read"]


def test_doctor_warns_when_users_restricted_by_private_data_would_see_no_levels():
    from dike_slurm.ops.doctor_checks import OK, WARN, Check, diagnose

    def checks(version: str, private: bool, admin_comment: bool) -> dict:
        name = "scontrol-show-config-privatedata-jobs.txt" if private else "scontrol-show-config.txt"
        text = (FIXTURES / f"slurm-{version}" / name).read_text()
        return {c.name: c for c in diagnose(
            version="slurm", json_format=Check("JSON format", "v", OK), config=parse_show_config(text),
            admin_level="Administrator", is_root=True, strategy="site_factor", max_consolidation_wait_s=None,
            preemption=False, user="root", admin_comment=admin_comment)}

    for version in VERSIONS:
        warned = checks(version, private=True, admin_comment=False)["users' levels"]
        assert warned.verdict == WARN and "engine.admin_comment = true" in warned.advice
        assert "users' levels" not in checks(version, private=True, admin_comment=True)
        assert "users' levels" not in checks(version, private=False, admin_comment=False)
