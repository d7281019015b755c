"""The commands an admin and a user read and script: queue, status, explain, audit, --json on
every command, pause/resume, revert JOBID, and the mistakes that must stop with one clear line.

Against the stand-in Slurm commands of test_engine_cli (no cluster): job 53 runs (dikeuser1),
array task 60_3 (job id 63, dikeuser2) is pending.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path

from test_backend_contract import SQUEUE_JSON
from test_engine_cli import REPO, calls, dike, slurm_stubs  # noqa: F401 (the fixture)


def as_json(*args: str, config: Path) -> dict:
    result = dike(*args, "--json", config=config)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_queue_shows_every_active_job_with_filters_and_json(slurm_stubs):  # noqa: F811
    table = dike("queue", config=slurm_stubs)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0] == f"configuration: {slurm_stubs} ($DIKE_CONFIG)"
    for text in ("60_3", "dikeuser2", "teaching", "PENDING", "53", "dikeuser1", "RUNNING", "level=2", "Slurm's reason",
                 "Priority"):
        assert text in table.stdout
    document = as_json("queue", "--user", "dikeuser2", config=slurm_stubs)
    assert document["command"] == "queue" and document["config"]["kind"] == "env"
    (row,) = document["jobs"]
    assert row["job"] == "60_3" and row["job_id"] == 63 and row["state"] == "PENDING" and row["level"] == 0
    assert row["placement_now"].startswith("Switches=1@300s") and row["reason"].startswith("level=0")
    assert row["slurm_reason"] == "Priority"  # what squeue's REASON says: Slurm's side of why it waits
    running = as_json("queue", "-t", "running", "-A", "research,teaching", config=slurm_stubs)["jobs"]
    assert [(r["job"], r["slurm_reason"]) for r in running] == [("53", "")]
    assert as_json("queue", "--partition", "cpu", config=slurm_stubs)["jobs"] == []
    bad = dike("queue", "--state", "finished", config=slurm_stubs)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --state 'finished'")


def test_status_names_its_state_file_plans_nothing_for_running_jobs_and_survives_slurm_down(slurm_stubs):  # noqa: F811
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    state = slurm_stubs.parent / "state" / "state.sqlite"
    text = dike("status", config=slurm_stubs)
    assert text.returncode == 0 and f"state file: {state}" in text.stdout
    document = as_json("status", config=slurm_stubs)
    rows = {r["job"]: r for r in document["jobs"]}
    assert document["state_file"] == str(state) and document["last_cycle"]["applied"] is True
    assert document["service_prior"]["text"] in text.stdout and document["service_prior"]["weight"] == 0.0
    assert rows["53"]["state"] == "RUNNING" and rows["53"]["priority_planned"] is None
    assert rows["60_3"]["priority_planned"] is not None and rows["60_3"]["name"] == "x`reboot`"
    assert [r["job"] for r in as_json("status", "-u", "dikeuser1", config=slurm_stubs)["jobs"]] == ["53"]
    (slurm_stubs.parent / "squeue.json").write_text("{not json")  # slurmctld gone: the store still speaks
    down = dike("status", config=slurm_stubs)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert "last cycle:" in down.stdout and "applied, 2 write(s)" in down.stdout
    assert down.stderr.strip().splitlines()[-1].startswith("error: Slurm not readable, the queue is not shown:")


def test_explain_finds_exactly_the_job_asked_for(slurm_stubs):  # noqa: F811
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    unknown = dike("explain", "99999", config=slurm_stubs)
    assert unknown.returncode == 1 and "job 99999: not in the queue" in unknown.stdout
    not_an_array = dike("explain", "53_1", config=slurm_stubs)  # job 53 is no array: never its records
    assert not_an_array.returncode == 1 and "dikeuser1" not in not_an_array.stdout and "53 " not in not_an_array.stdout
    task = as_json("explain", "60_3", config=slurm_stubs)
    assert task["status"] == "active" and task["job_id"] == 63 and task["job"]["user"] == "dikeuser2"
    assert task["policy_parameters"]["thresholds_gpuh"] == [0.02, 0.2]  # "thresholds configured": these
    assert task["job"]["slurm_reason"] == "Priority"
    # the service prior as the cycle used it: too few finished jobs (min_history_jobs), so it moved nothing
    prior = task["service_prior"]
    assert prior["weight"] == 0.0 and prior["trust"] == 0.0 and prior["finished_jobs"] < 50 and prior["power"] == 0.0
    text = dike("explain", "60_3", config=slurm_stubs).stdout
    assert f"  service prior: power 0.00 from {prior['finished_jobs']} finished jobs, run times trusted x0.00, weight 0" \
        in text
    assert "Slurm keeps it waiting: Priority (squeue's REASON)" in text
    assert "thresholds_gpuh=" not in text  # the parameters only with --verbose
    assert "thresholds_gpuh=[0.02, 0.2]" in dike("explain", "--verbose", "60_3", config=slurm_stubs).stdout
    # why it waits, in a user's words: where it stands, and what would change it
    assert task["standing"] == {"partition": "gpu", "place": 1, "pending": 1, "ahead": 0,
                                "ahead_at_a_better_level": 0, "ahead_at_its_level": 0}
    assert "where it stands: first of 1 pending in partition gpu in the engine's order: no job ahead of it" in text
    assert task["would_change"][0].startswith("a running job ending: it needs 2 GPU(s) on 1 node(s), and 1 job(s) run")
    # job 53 runs at level 2 and opted in (the stubs' engine.preemptible_partitions): it may be preempted
    assert "what would change it:" in text and ("    - a preemption: 1 running job(s) of a worse level in its "
                                                "partition may be requeued for it") in text
    queue = json.loads(json.dumps(SQUEUE_JSON))
    queue["jobs"] = [j for j in queue["jobs"] if j["job_id"] != 53]  # job 53 finished
    (slurm_stubs.parent / "squeue.json").write_text(json.dumps(queue))
    finished = dike("explain", "53", config=slurm_stubs)
    assert finished.returncode == 0, finished.stderr
    assert "job 53: finished (no longer in the queue)" in finished.stdout and "audit (newest last):" in finished.stdout
    assert as_json("explain", "53", config=slurm_stubs)["status"] == "finished"


def test_audit_from_values_are_what_slurm_held_and_audit_lists_them(slurm_stubs):  # noqa: F811
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    (slurm_stubs.parent / "sprio.txt").write_text("63|395805|11165\n")  # someone else set SiteFactor meanwhile
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    entries = as_json("audit", "--job", "63", config=slurm_stubs)["entries"]
    updates = [e["change"] for e in entries if e["action"] == "update"]
    # the engine's write from what Slurm held; then the site's value is kept, and the audit says so
    assert len(updates) == 1 and updates[0].startswith("SiteFactor 0 -> ")
    kept = [e for e in entries if e["action"] == "left-alone"]
    assert [(e["change"], e["ok"], e["command"]) for e in kept] == [("SiteFactor 395805 kept", True, "(none)")]
    assert kept[0]["message"].startswith("SiteFactor changed to 395805 after the engine set ")
    assert all(e["job_id"] == 63 for e in entries)
    assert as_json("audit", "--since", "2000-01-01", config=slurm_stubs)["entries"]
    assert as_json("audit", "--since", "1d", config=slurm_stubs)["entries"]  # an age
    bad = dike("audit", "--since", "yesterday", config=slurm_stubs)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --since 'yesterday'")


def test_pause_stops_the_writes_until_resume_and_both_are_audited(slurm_stubs):  # noqa: F811
    assert as_json("pause", "--reason", "maintenance", config=slurm_stubs)["paused"] is True
    paused = dike("run", "--once", "--apply", config=slurm_stubs)
    assert paused.returncode == 0, paused.stderr
    assert "paused (maintenance)" in paused.stderr
    assert not any(c.startswith("scontrol update") for c in calls(slurm_stubs))
    assert "PAUSED" in dike("status", config=slurm_stubs).stdout
    assert as_json("resume", config=slurm_stubs)["paused"] is False
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    assert any(c.startswith("scontrol update") for c in calls(slurm_stubs))
    entries = as_json("audit", config=slurm_stubs)["entries"]
    actions = [e["action"] for e in entries]
    assert actions.index("pause") < actions.index("skipped") < actions.index("resume") < actions.index("update")
    # the paused cycle is one row for all it planned, not a row per write
    (skipped,) = [e for e in entries if e["action"] == "skipped"]
    planned = sum(1 for e in entries if e["action"] == "update")  # the same plan, written after resume
    assert skipped["job_id"] == 0 and skipped["change"] == f"{planned} planned write(s) and 0 requeue(s) not made"
    assert skipped["message"].startswith("paused (maintenance)") and skipped["reason"] == "jobs 53, 63"
    assert skipped["user"] == getpass.getuser()  # an engine-wide row: who ran the cycle
    assert {e["job_id"]: e["user"] for e in entries if e["action"] == "update"}[63] == "dikeuser2"  # the job's owner
    table = dike("audit", config=slurm_stubs).stdout
    header = next(line for line in table.splitlines() if "cycle" in line and "job" in line)
    assert [word for word in ("user", "reason") if word in header] == ["user", "reason"]


def test_revert_jobid_restores_that_job_only(slurm_stubs):  # noqa: F811
    assert dike("run", "--once", "--apply", config=slurm_stubs).returncode == 0
    plan = as_json("revert", "63", config=slurm_stubs)
    assert [w["job_id"] for w in plan["writes"]] == [63] and plan["applied"] is False
    done = as_json("revert", "63", "--apply", config=slurm_stubs)
    assert done["writes"][0]["result"] == "ok"
    reverts = [c for c in calls(slurm_stubs) if c.startswith("scontrol update") and "SiteFactor=0" in c]
    assert len(reverts) == 1 and "JobId=63" in reverts[0]
    entries = as_json("audit", config=slurm_stubs)["entries"]
    assert [e["job_id"] for e in entries if e["action"] == "revert"] == [63]
    assert [w["job_id"] for w in as_json("revert", config=slurm_stubs)["writes"]] == [53]


def test_every_command_speaks_json(slurm_stubs):  # noqa: F811
    run = as_json("run", "--once", config=slurm_stubs)
    assert run["applied"] is False and {w["job_id"] for w in run["writes"]} == {53, 63}
    assert run["writes"][0]["changes"][0].keys() == {"field", "old", "new"}
    assert {p["name"] for p in as_json("policies", config=slurm_stubs)["policies"]} >= {"dike", "fifo"}
    assert as_json("breaker", "status", config=slurm_stubs)["tripped"] is False
    checked = as_json("config", "check", str(slurm_stubs), config=slurm_stubs)
    assert checked["ok"] is True and checked["config"]["kind"] == "file"
    refused = dike("run", "--json", config=slurm_stubs)
    assert refused.returncode == 2 and "--json needs --once" in refused.stderr


def test_piped_tables_are_not_cut(slurm_stubs):  # noqa: F811
    queue = json.loads(json.dumps(SQUEUE_JSON))
    long_name = "a-very-long-job-name-" * 8
    for job in queue["jobs"]:
        job["name"] = long_name
    (slurm_stubs.parent / "squeue.json").write_text(json.dumps(queue))
    # a new process: its stdout is a pipe when dike_slurm.cli picks the consoles' width (in process
    # it is whatever pytest's was when the module was imported)
    result = subprocess.run([sys.executable, "-m", "dike_slurm", "queue"], capture_output=True, text=True,
                            cwd=REPO, timeout=120, env={"PATH": "/usr/bin:/bin", "DIKE_CONFIG": str(slurm_stubs)})
    assert result.returncode == 0, result.stderr
    assert long_name in result.stdout and "…" not in result.stdout


def test_apply_without_a_configuration_file_is_refused_unless_defaults(tmp_path):
    result = dike("run", "--once", "--apply")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --apply with no configuration file (neither --config nor $DIKE_CONFIG): give one, or --defaults "
        "to write with the built-in defaults"
    ]


def test_missing_privileges_are_one_line_that_says_what_to_grant(slurm_stubs):  # noqa: F811
    scontrol = Path(str(slurm_stubs.parent / "bin" / "scontrol"))
    scontrol.write_text(scontrol.read_text().replace(
        '"scontrol update") exit 0 ;;',
        '"scontrol update") echo "Access/permission denied for job ${2#JobId=}" >&2; exit 1 ;;'))
    # a breaker of one error: the first batch of writes is one write (apply.py, FIRST_BATCH)
    slurm_stubs.write_text(slurm_stubs.read_text().replace("[engine]\n", "[engine]\nbreaker_max_errors = 1\n"))
    result = dike("run", "--once", "--apply", config=slurm_stubs)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Slurm refused the write for lack of rights") and "AdminLevel=Admin" in last
    assert "docs/deployment.md" in last
    assert f"sacctmgr -i modify user {getpass.getuser()} set adminlevel=Admin" in last  # the user, not USER
    updates = [c for c in calls(slurm_stubs) if c.startswith("scontrol update")]
    assert len(updates) == 1  # the other writes would fail alike: not tried


def test_json_logs_carry_the_job_and_each_fields_old_and_new_value(slurm_stubs):  # noqa: F811
    slurm_stubs.write_text(slurm_stubs.read_text().replace("[engine]\n", '[engine]\nlog_format = "json"\n'))
    result = dike("run", "--once", "--apply", "-v", config=slurm_stubs)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    writes = [r for r in records if "changes" in r]
    job63 = next(r for r in writes if r["job"] == 63)
    assert job63["ok"] is True and job63["changes"][0] == {"field": "SiteFactor", "old": "0",
                                                           "new": job63["changes"][0]["new"]}


def test_version_help_and_render_from_dike_config(slurm_stubs):  # noqa: F811
    assert dike("--version").stdout.startswith("dike-slurm ")
    assert "Usage: dike-slurm queue" in dike("queue", "-h").stdout
    for command in ("replay", "tune", "queue", "status", "revert"):
        help_text = dike(command, "--help").stdout
        assert "<list[" not in help_text and "<bool>" not in help_text, command
    unit = dike("render", "systemd", config=slurm_stubs)
    assert unit.returncode == 0, unit.stderr
    assert f"--config {slurm_stubs}" in unit.stdout and "ExecReload=/bin/kill -HUP $MAINPID" in unit.stdout
    assert dike("render", "systemd").returncode == 2
