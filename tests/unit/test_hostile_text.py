"""Hostile job names, comments, users and accounts through the engine, the CLI backend, the logs,
the AdminComment, the audit and the terminal output: data only, never commands or markup."""

from __future__ import annotations

import json
import logging
import re
import stat
from pathlib import Path

import pytest
from rich.console import Console

from dike_slurm.slurm.backends import squeue_format
from fakes import FakeBackend
from dike_slurm.domain.fields import JobField, JobUpdate
from dike_slurm.slurm.backends.cli import SlurmCliBackend
from dike_slurm.slurm.backends.commands import CommandResult, run_command
from dike_slurm.cli.engine_cmd import _plan_table, _safe
from dike_slurm.config import SlurmSettings
from engine_fixtures import NOW, config, engine, nodes, pending, running

HOSTILE = [
    "$(touch /tmp/dike-pwned); `id` && rm -rf / ; echo x|y",
    "line one\nline two\r\nAdminComment=dike:level=0",
    "|".join(["a"] * 20),
    "x" * 10_000,
    "<script>alert('x')</script>&amp;[bold red]markup[/]",
    "tab\tnul\x00bell\x07esc\x1b[31mred",
    "caf\udcc3\udca9 \ufffd non-UTF-8",
    "dike:level=9,attained=999.0gpuh,promoted",
    "' OR 1=1; DROP TABLE audit; --",
]
ADMIN_COMMENT = re.compile(r"^dike:level=\d+,attained=\d+\.\dgpuh(,promoted)?$")


def hostile_jobs():
    jobs = []
    for i, text in enumerate(HOSTILE):
        safe = text.replace("\x00", "")
        jobs.append(pending(100 + i, user=f"u{i}", name=safe, comment=safe, account="research"))
    jobs.append(running(200, user=HOSTILE[0], name=HOSTILE[1], comment=HOSTILE[4], account="research"))
    return jobs


def test_hostile_fields_never_reach_a_command_the_admin_comment_or_the_audit(tmp_path: Path, caplog) -> None:
    backend = FakeBackend(hostile_jobs(), nodes({"n1": 1}), time=NOW)
    eng = engine(config(tmp_path), backend)
    with caplog.at_level(logging.INFO, logger="dike_slurm"):
        report = eng.cycle(apply=True)
    assert report.errors == 0 and report.outcomes
    assert any(JobField.ADMIN_COMMENT in dict(u.values) for u in backend.applied)
    for update in backend.applied:
        values = dict(update.values)
        comment = values.get(JobField.ADMIN_COMMENT)
        if comment is not None:
            assert ADMIN_COMMENT.match(comment), comment  # built from our own numbers only
        cli = SlurmCliBackend(SlurmSettings())
        for argv in cli.update_commands(update):
            for arg in argv:
                assert not any(h[:20] in arg for h in HOSTILE), arg
    texts = [f"{e.change} {e.command} {e.undo} {e.message} {e.reason}" for e in eng.store.audit_log()]
    assert texts
    for text in texts:
        assert not any(h[:20] in text for h in HOSTILE), text
    for record in caplog.records:  # log lines: one line each, without the hostile strings
        message = record.getMessage()
        assert "\n" not in message and not any(h[:20] in message for h in HOSTILE), message
    assert eng.store.audit_log()  # the store still works (no SQL injection)
    assert not Path("/tmp/dike-pwned").exists()


def test_hostile_text_in_the_terminal_is_plain_one_line_text(tmp_path: Path) -> None:
    backend = FakeBackend(hostile_jobs(), nodes(), time=NOW)
    eng = engine(config(tmp_path), backend)
    plan = eng.plan()
    console = Console(record=True, width=200, force_terminal=True)
    console.print(_plan_table(plan))
    for text in HOSTILE:
        rendered = _safe(text).plain
        assert "\n" not in rendered and "\x1b" not in rendered and "\x00" not in rendered
        assert "[bold red]" in _safe(HOSTILE[4]).plain  # markup printed literally, not interpreted


META = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}
NODES = {"meta": META, "errors": [], "nodes": [{"name": "n1", "state": "idle", "gres": "gpu:8", "cpus": 16}]}


def squeue_document(text: str) -> dict:
    entry = {
        "job_id": 7, "job_state": "PENDING", "user_name": text, "account": text, "partition": "gpu",
        "qos": "normal", "name": text, "comment": text, "admin_comment": text, "submit_time": 1,
        "tres_req_str": "cpu=1,gres/gpu=1", "features": "", "excluded_nodes": text, "nodes": text,
        "time_limit": 60, "priority": 1, "nice": 0,
    }
    return {"meta": META, "jobs": [entry], "errors": []}


@pytest.mark.parametrize("text", HOSTILE)
def test_cli_backend_reads_hostile_squeue_json_as_data(text: str) -> None:
    def runner(argv, env, timeout):
        if argv[0] == "squeue" and "--json" in argv:
            return CommandResult(0, json.dumps(squeue_document(text)), "")
        if argv[0] == "sinfo":
            return CommandResult(0, json.dumps(NODES), "")
        return CommandResult(0, "", "")

    cluster = SlurmCliBackend(SlurmSettings(), runner=runner, job_read="json").read_cluster()
    assert len(cluster.jobs) <= 1
    for job in cluster.jobs:
        assert job.name == text and job.comment == text  # kept verbatim as data
        update = JobUpdate.of(job.job_id, {JobField.SITE_FACTOR: 5})
        assert SlurmCliBackend(SlurmSettings()).update_commands(update) == [
            ["scontrol", "update", "JobId=7", "SiteFactor=5"]
        ]


LEAN_TOKEN = "^a1b2c3d4"


def lean_squeue(text: str) -> str:
    """One pending job with `text` as user, account, name, comment and admin comment, as `squeue -O`
    prints it (dike_slurm.slurm.backends.squeue_format: every field ends with the call's token)."""
    values = {"JobID": "7", "ArrayJobID": "7", "ArrayTaskID": "N/A", "State": "PENDING", "UserName": text,
              "Account": text, "Partition": "gpu", "QOS": "normal", "SubmitTime": "1", "EligibleTime": "1",
              "StartTime": "N/A", "TimeLimit": "1:00:00", "NumNodes": "1", "NumCPUs": "1",
              "tres-alloc": "cpu=1,gres/gpu=1", "tres-per-job": "N/A", "tres-per-node": "N/A", "Feature": text,
              "ReqNodes": "", "NodeList": "", "ReqSwitch": "0", "Wait4Switch": "0:00", "PriorityLong": "1",
              "Nice": "0", "Requeue": "1", "Reason": "Priority", "Name": text, "Comment": text, "admin_comment": text}
    header = ["JOBID", *(f.upper() for f in squeue_format.JOB_FIELDS[1:])]
    return squeue_format.join_records([header, [values[f] for f in squeue_format.JOB_FIELDS]], LEAN_TOKEN)


@pytest.mark.parametrize("text", HOSTILE)
def test_cli_backend_reads_hostile_squeue_o_text_as_data_in_its_own_fields(text: str) -> None:
    def runner(argv, env, timeout):
        if argv[:2] == ["squeue", "-a"] and "-O" in argv:
            return CommandResult(0, lean_squeue(text), "")
        if argv[:3] == ["squeue", "-a", "-o"]:
            return CommandResult(0, squeue_format.join_records([["JOBID", "EXC_NODES"], ["7", "n1"]], LEAN_TOKEN), "")
        if argv[0] == "sinfo":
            return CommandResult(0, squeue_format.join_records(
                [["NODELIST", *"PCGUSFA"], ["n1", "gpu", "16", "gpu:8", "gpu:0", "idle", "", ""]], LEAN_TOKEN), "")
        return CommandResult(0, "", "")

    backend = SlurmCliBackend(SlurmSettings(), runner=lambda a, e, t: runner(list(a), e, t), job_read="lean",
                              token=lambda: LEAN_TOKEN)
    cluster = backend.read_cluster()
    (job,) = cluster.jobs
    assert (job.job_id, job.user, job.account, job.name, job.comment) == (7, text, text, text, text)
    assert (job.gpus, job.time_limit_s, job.placement.exclude_nodes) == (1, 3600, ("n1",))  # no field shifted
    assert job.placement.features == text and cluster.admin_comments == {7: text}
    assert SlurmCliBackend(SlurmSettings()).update_commands(JobUpdate.of(7, {JobField.SITE_FACTOR: 5})) == [
        ["scontrol", "update", "JobId=7", "SiteFactor=5"]
    ]


def test_non_utf8_output_of_a_slurm_command_is_decoded_not_fatal(tmp_path: Path) -> None:
    script = tmp_path / "squeue"
    document = json.dumps(squeue_document("NAME")).encode().replace(b"NAME", b"caf\xc3\xa9 \xff\xfe bad")
    (tmp_path / "out.json").write_bytes(document)
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.json'}\nprintf 'warn \\377\\n' >&2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    result = run_command([str(script)], {"PATH": "/usr/bin:/bin"}, 10)
    assert result.returncode == 0 and "\ufffd" in result.stdout and "\ufffd" in result.stderr
    job = json.loads(result.stdout)["jobs"][0]
    assert job["name"].startswith("café")
