"""The lean read (`squeue -O`, `squeue -o %A%x`, `sinfo -N -O`: dike_slurm.slurm.backends.squeue_format)
builds the same jobs as the JSON read: on generated queues (hypothesis, both texts made from the
same jobs) and on what real Slurm printed at the same moment (tests/fixtures/lean-VERSION,
recorded by tests/fixtures/record-slurm-lean). Hostile text never shifts a field; an empty, cut
or malformed output is one error naming the command; squeue refusing -O falls back to the JSON.
"""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dike_slurm.slurm.backends import squeue_format
from dike_slurm.slurm.backends.cli import SlurmCliBackend
from dike_slurm.slurm.backends.commands import CommandResult
from dike_slurm.slurm.backends.squeue_format import JOB_FIELDS, join_records, read_jobs, read_nodes
from dike_slurm.slurm.backends.squeue_json import job_from_squeue, node_from_sinfo
from dike_slurm.domain.fields import SwitchRequest
from dike_slurm.config import SlurmSettings
from dike_slurm.parsing.durations import parse_duration
from dike_slurm.errors import SlurmError
from dike_slurm.slurm.formats import FormatError

TOKEN = "^deadbeef"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTILE = [
    "$(touch /tmp/dike-pwned); `id` && rm -rf / ; echo x|y",
    "line one\nline two\r\nAdminComment=dike:level=0",
    "|".join(["a"] * 20),
    "x" * 10_000,
    "tab\tnul\x00bell\x07esc\x1b[31mred",
    "caf\udcc3\udca9 \ufffd non-UTF-8",
    "^deadbee ^ ^^ ^f00dcafe",
    "forged\n999" + TOKEN.replace("deadbeef", "00000000") + "PENDING|root",
]
SETTLED = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- the same job, printed both ways


def limit_text(minutes: int | None) -> str:
    """squeue's TimeLimit: UNLIMITED, M:SS, H:MM:SS or D-HH:MM:SS (Slurm's mins2time_str)."""
    return "UNLIMITED" if minutes is None else clock_text(minutes * 60)


def clock_text(seconds: int) -> str:
    """Slurm's secs2time_str: M:SS, H:MM:SS or D-HH:MM:SS (Wait4Switch `5:00`)."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{mins:02d}:{secs:02d}"
    return f"{hours}:{mins:02d}:{secs:02d}" if hours else f"{mins}:{secs:02d}"


# `(null)` is what squeue prints for an unset comment: typed as a comment, it reads as empty
FREE_TEXT = st.one_of(st.sampled_from([*HOSTILE, "N/A", ""]),
                      st.text(max_size=30).filter(lambda t: TOKEN not in t and t != "(null)"))
WORD = st.text(alphabet=string.ascii_lowercase + string.digits + "_-", min_size=1, max_size=8)


# (state_reason, state_description): squeue's REASON prints the description when slurmctld set one
REASONS = st.sampled_from([("None", ""), ("Priority", ""), ("Resources", ""), ("JobHeldUser", ""),
                           ("ReqNodeNotAvail", "ReqNodeNotAvail, UnavailableNodes:n4"),
                           ("Resources", "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions")])


# job_specs' strategies, built once rather than in every example's draws (hypothesis caches no
# strategy whose arguments hold a list): the same strategies, so the same examples
JOB_IDS = st.lists(st.integers(1, 10**7), unique=True, max_size=8)
STATES = st.sampled_from(["PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED"])
ARRAYS = st.one_of(st.none(), st.tuples(st.integers(1, 10**7), st.one_of(st.integers(0, 999), st.just("0-2"))))
ELIGIBLE = st.one_of(st.just(0), st.integers(1, 2**31))
LIMITS = st.one_of(st.none(), st.integers(1, 10**6))
FEATURES = st.one_of(st.none(), st.sampled_from(["leaf_s1", "leaf_s1|leaf_s2", "a&b", "[x*2]"]))
EXCLUDED = st.sampled_from(["", "n3", "n[1-4]", "n[01-02],m7"])
REQUIRED = st.sampled_from(["", "n1", "n[1-2]"])
ALLOCATED = st.sampled_from(["n1", "n[1-2]", "gpu[001-128]"])
SWITCHES = st.tuples(st.integers(0, 4), st.integers(0, 86400))


@st.composite
def job_specs(draw) -> list[dict]:
    ids = draw(JOB_IDS)
    specs = []
    for job_id in ids:
        state = draw(STATES)
        array = draw(ARRAYS)
        specs.append(dict(
            job_id=job_id, state=state, user=draw(WORD), account=draw(WORD), partition=draw(WORD), qos=draw(WORD),
            name=draw(FREE_TEXT), comment=draw(FREE_TEXT), admin_comment=draw(FREE_TEXT),
            submit=draw(st.integers(1, 2**31)), eligible=draw(ELIGIBLE),
            start=draw(st.integers(1, 2**31)), limit=draw(LIMITS),
            nodes=draw(st.integers(1, 64)), cpus=draw(st.integers(1, 4096)), gpus=draw(st.integers(0, 512)),
            features=draw(FEATURES),
            excluded=draw(EXCLUDED),
            required=draw(REQUIRED),
            allocated=draw(ALLOCATED),
            switches=draw(SWITCHES),
            priority=draw(st.integers(0, 2**32 - 2)), nice=draw(st.integers(-10000, 10000)),
            requeue=draw(st.booleans()), array=array, reason=draw(REASONS),
        ))
    return specs


def json_entry(spec: dict) -> dict:
    """The job as squeue --json (openapi v0.0.38, Slurm 22.05) prints it."""
    running = spec["state"] == "RUNNING"
    tres = f"cpu={spec['cpus']},node={spec['nodes']}" + (f",gres/gpu={spec['gpus']}" if spec["gpus"] else "")
    array_job, task = spec["array"] or (0, None)
    return {
        "job_id": spec["job_id"], "job_state": spec["state"], "user_name": spec["user"], "account": spec["account"],
        "partition": spec["partition"], "qos": spec["qos"], "name": spec["name"], "comment": spec["comment"],
        "admin_comment": spec["admin_comment"], "submit_time": spec["submit"], "eligible_time": spec["eligible"],
        "start_time": spec["start"], "time_limit": spec["limit"], "node_count": spec["nodes"], "cpus": spec["cpus"],
        "tres_req_str": tres, "tres_alloc_str": tres if running or spec["state"] == "SUSPENDED" else "",
        "tres_per_job": "", "tres_per_node": "", "features": spec["features"] or "",
        "excluded_nodes": spec["excluded"], "required_nodes": spec["required"],
        "nodes": spec["allocated"] if running else "", "priority": spec["priority"],
        "nice": spec["nice"] + 2**32 if spec["nice"] < 0 else spec["nice"] or None, "requeue": spec["requeue"],
        "array_job_id": array_job, "array_task_id": task if isinstance(task, int) else None,
        "state_reason": spec.get("reason", ("None", ""))[0], "state_description": spec.get("reason", ("None", ""))[1],
    }


def lean_row(spec: dict) -> list[str]:
    """The job as `squeue -O JOB_FIELDS` prints it (SLURM_TIME_FORMAT=%s)."""
    running = spec["state"] == "RUNNING"
    tres = f"cpu={spec['cpus']},node={spec['nodes']}" + (f",gres/gpu={spec['gpus']}" if spec["gpus"] else "")
    array_job, task = spec["array"] or (spec["job_id"], "N/A")
    count, wait = spec["switches"]
    values = {
        "JobID": str(spec["job_id"]), "ArrayJobID": str(array_job), "ArrayTaskID": str(task),
        "State": spec["state"], "UserName": spec["user"], "Account": spec["account"],
        "Partition": spec["partition"], "QOS": spec["qos"], "SubmitTime": str(spec["submit"]),
        "EligibleTime": str(spec["eligible"]) if spec["eligible"] else "N/A", "StartTime": str(spec["start"]),
        "TimeLimit": limit_text(spec["limit"]), "NumNodes": str(spec["nodes"]), "NumCPUs": str(spec["cpus"]),
        "tres-alloc": tres, "tres-per-job": "N/A", "tres-per-node": "N/A", "Feature": spec["features"] or "(null)",
        "ReqNodes": spec["required"], "NodeList": spec["allocated"] if running else "",
        "ReqSwitch": str(count), "Wait4Switch": clock_text(wait),
        "PriorityLong": str(spec["priority"]), "Nice": str(spec["nice"]), "Requeue": "1" if spec["requeue"] else "0",
        "Reason": spec.get("reason", ("None", ""))[1] or spec.get("reason", ("None", ""))[0],
        "Name": spec["name"], "Comment": spec["comment"], "admin_comment": spec["admin_comment"],
    }
    return [values[name] for name in JOB_FIELDS]


def header() -> list[str]:
    return ["JOBID", *(name.upper() for name in JOB_FIELDS[1:])]


def lean_text(specs: list[dict]) -> tuple[str, str]:
    """(squeue -O, squeue -o %A%x) text for these jobs."""
    queue = join_records([header(), *(lean_row(s) for s in specs)], TOKEN)
    excluded = join_records([["JOBID", "EXC_NODES"], *([str(s["job_id"]), s["excluded"]] for s in specs)], TOKEN)
    return queue, excluded


def json_read(specs: list[dict]):
    """What the JSON read builds: active jobs, each with its AdminComment."""
    switches = {s["job_id"]: SwitchRequest(s["switches"][0], parse_duration(clock_text(s["switches"][1])))
                for s in specs if s["state"] == "PENDING"}
    jobs = [job_from_squeue(json_entry(s), switches) for s in specs]
    active = [j for j in jobs if j.state.is_active]
    return active, {s["job_id"]: s["admin_comment"] for s in specs if s["state"] in ("PENDING", "RUNNING", "SUSPENDED")}


@SETTLED
@given(job_specs())
def test_the_lean_read_builds_the_jobs_the_json_read_builds(specs):
    queue, excluded = lean_text(specs)
    lean = read_jobs(queue, TOKEN, "squeue -O", excluded, TOKEN, "squeue -o")
    jobs, comments = json_read(specs)
    assert list(lean.jobs) == jobs
    assert lean.admin_comments == comments
    assert lean.count.printed == len(specs) and lean.count.read == len(jobs)


@SETTLED
@given(job_specs(), st.data())
def test_a_read_that_reuses_the_last_reads_jobs_builds_what_a_fresh_read_builds(specs, data):
    """read_jobs(known=...) takes the previous read's Job for a record printed exactly as then:
    the next cycle's queue, with some jobs changed (ExcNodeList too, printed by another command),
    reads as it would without it, hostile text and NULs included."""
    changes = st.fixed_dictionaries({}, optional={
        "excluded": st.sampled_from(["", "n3", "n[1-4]"]), "name": FREE_TEXT,
        "state": st.sampled_from(["PENDING", "RUNNING", "COMPLETED"]), "features": st.sampled_from([None, "leaf_s2"]),
    })
    later = [{**spec, **data.draw(changes)} for spec in specs]
    first = read_jobs(*_texts(specs))
    fresh = read_jobs(*_texts(later))
    again = read_jobs(*_texts(later), known=first.by_record)
    assert (again.jobs, again.admin_comments, vars(again.count)) == (fresh.jobs, fresh.admin_comments, vars(fresh.count))
    assert again.by_record == fresh.by_record
    reused = [j for j in again.jobs if any(j is k for k in first.jobs)]
    assert len(reused) == sum(1 for before, after in zip(specs, later)
                              if before == after and after["state"] in ("PENDING", "RUNNING", "SUSPENDED")
                              and "\x00" not in before["name"] + before["comment"] + before["admin_comment"])


def _texts(specs: list[dict]) -> tuple[str, str, str, str, str, str]:
    queue, excluded = lean_text(specs)
    return queue, TOKEN, "squeue -O", excluded, TOKEN, "squeue -o"

FIELD_TEXT = st.lists(st.sampled_from(["a", "7", " ", "\n", "\x00", "^", "|", TOKEN, TOKEN + "\n", "(null)"]),
                      max_size=4).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(FIELD_TEXT, min_size=2, max_size=4), max_size=5), st.sampled_from(["", "x", "\n", TOKEN]),
       st.booleans())
@example([["7\x00a", "b"]], "", False)  # a NUL where a field is missing: the record split says the text is wrong
def test_the_quick_split_reads_what_the_record_split_reads_or_leaves_the_text_to_it(rows, tail, plain):
    """joined_records (one replace and one split over the whole text) against records (one list
    per record): the same fields wherever it answers, and it answers for every ordinary read.
    Fields with newlines, NULs, the token, too few or too many fields per line, cut texts."""
    names = ("JobID", "X", "Y")
    if plain:  # what Slurm prints: no NUL, no field that begins with a newline, 3 fields a line
        rows = [[f.replace("\x00", "").replace(TOKEN, "").lstrip("\n") for f in (row * 3)[:3]] for row in rows]
        tail = ""
    text = join_records([["JOBID", "X", "Y"], *rows], TOKEN) + tail
    joined = squeue_format.joined_records(text, TOKEN, names, "JOBID")
    if joined is not None:
        assert joined == ["\x00".join(row) for row in squeue_format.records(text, TOKEN, names, "squeue -O", "JOBID")]
    assert joined is not None or not plain

@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_free_text_is_read_verbatim_and_shifts_no_field(text):
    spec = dict(job_id=7, state="PENDING", user="u", account="a", partition="gpu", qos="normal", name=text,
                comment=text, admin_comment=text, submit=100, eligible=100, start=0, limit=60, nodes=1, cpus=1,
                gpus=1, features="leaf_s1|leaf_s2", excluded="n3", required="", allocated="", switches=(1, 300),
                priority=5, nice=0, requeue=True, array=None)
    other = {**spec, "job_id": 8, "name": "plain", "comment": "", "admin_comment": ""}
    queue, excluded = lean_text([spec, other])
    lean = read_jobs(queue, TOKEN, "squeue -O", excluded, TOKEN, "squeue -o")
    assert [j.job_id for j in lean.jobs] == [7, 8]
    job = lean.jobs[0]
    assert (job.name, job.comment, lean.admin_comments[7]) == (text, text, text)
    assert (job.gpus, job.placement.features, job.placement.exclude_nodes, job.placement.max_switches) == (
        1, "leaf_s1|leaf_s2", ("n3",), 1)
    assert lean.jobs[1].name == "plain"


# ---------------------------------------------------------------- errors, never "no jobs"


def one_job() -> tuple[str, str]:
    spec = dict(job_id=7, state="RUNNING", user="u", account="a", partition="gpu", qos="normal", name="n",
                comment="", admin_comment="", submit=100, eligible=100, start=200, limit=None, nodes=1, cpus=1,
                gpus=1, features=None, excluded="", required="", allocated="n1", switches=(0, 0), priority=5,
                nice=0, requeue=False, array=None)
    return lean_text([spec])


@pytest.mark.parametrize("printed, message", [
    ("", "printed nothing"),
    ("\n", "printed nothing"),
    ("JOBID|STATE|\n7|RUNNING|\n", "not 29 fields per line"),
    (one_job()[0][:-30], "not 29 fields per line"),  # cut short
    (one_job()[0].replace("JOBID", "ARRAY"), "'JOBID' header"),
    (one_job()[0] + one_job()[0].split("\n", 1)[1].replace("RUNNING", "WEIRD_STATE"), "unknown job state"),
    (one_job()[0] + one_job()[0].split("\n", 1)[1], "job id listed twice"),
    (one_job()[0].replace(f"\n7{TOKEN}", f"\nx7{TOKEN}"), "invalid literal"),
])
def test_an_empty_cut_or_malformed_read_is_an_error_naming_the_command(printed, message):
    with pytest.raises(FormatError, match=message) as caught:
        read_jobs(printed, TOKEN, "squeue -O", one_job()[1], TOKEN, "squeue -o")
    assert str(caught.value).startswith("squeue -O: ")


@pytest.mark.parametrize("text", [TOKEN, f"x{TOKEN}\n8{TOKEN}" + TOKEN.join(["PENDING"] * 27)])
def test_a_name_that_holds_the_calls_token_is_an_error_not_a_misread(text):
    queue, excluded = one_job()
    with pytest.raises(FormatError, match="squeue -O: "):
        read_jobs(queue.replace(f"n{TOKEN}", f"{text}{TOKEN}"), TOKEN, "squeue -O", excluded, TOKEN, "squeue -o")


def test_an_empty_queue_is_its_header_alone():
    lean = read_jobs(join_records([header()], TOKEN), TOKEN, "squeue -O", join_records([["JOBID", "EXC_NODES"]], TOKEN),
                     TOKEN, "squeue -o")
    assert lean.jobs == () and lean.count.printed == 0


def test_records_that_do_not_line_up_are_an_error():
    shifted = f"JOBID{TOKEN}X{TOKEN}\n1{TOKEN}a{TOKEN}2{TOKEN}\n{TOKEN}\n"  # one line a field short, the next one long
    with pytest.raises(FormatError, match="squeue -O: a line of its output does not start where"):
        squeue_format.records(shifted, TOKEN, ("JobID", "X"), "squeue -O", "JOBID")


def test_a_field_this_slurm_does_not_know_is_an_error_naming_it():
    printed = f"JOBID{TOKEN}{TOKEN}\n7{TOKEN}{TOKEN}\n"  # what squeue prints for JobID,bogus (and exits 0)
    with pytest.raises(FormatError, match="squeue -O: this Slurm does not print the field.s. bogus"):
        squeue_format.records(printed, TOKEN, ("JobID", "bogus"), "squeue -O", "JOBID")


def test_a_failing_squeue_reads_the_json_whose_error_stands_without_a_warning(caplog):
    calls = []

    def down(argv, env, timeout):
        calls.append(list(argv[:3]))
        return CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")

    backend = SlurmCliBackend(SlurmSettings(), runner=down, job_read="lean")
    with caplog.at_level(logging.WARNING, logger="dike_slurm"):
        with pytest.raises(SlurmError, match=r"^squeue --json failed \(exit 1\): slurm_load_jobs error: Unable"):
            backend.read_cluster()
    assert calls == [["squeue", "-a", "--sort=i"], ["squeue", "--json"]]
    assert backend.lean_refused is None and "refused" not in caplog.text


# ---------------------------------------------------------------- nodes


def test_sinfo_nodes_merge_their_partitions_and_spell_states_as_the_json_does():
    rows = [["NODELIST", "PARTITION", "CPUS", "GRES", "GRES_USED", "STATE", "AVAIL_FEATURES", "ACTIVE_FEATURES"],
            ["n1", "gpu", "16", "gpu:8", "gpu:3", "mixed", "leaf_s1", "leaf_s1"],
            ["n1", "debug", "16", "gpu:8", "gpu:3", "mixed", "leaf_s1", "leaf_s1"],
            ["n3", "gpu", "16", "gpu:a100:8(S:0-1)", "gpu:a100:0(IDX:N/A)", "idle+drain", "leaf_s2", "leaf_s2"],
            ["n4", "gpu", "16", "(null)", "gpu:0", "down*", "(null)", "(null)"]]
    nodes, count = read_nodes(join_records(rows, TOKEN), TOKEN, "sinfo -N -O")
    assert (count.printed, count.read, count.left_out) == (4, 3, 1)
    reference = [node_from_sinfo(e) for e in [
        {"name": "n1", "state": "mixed", "state_flags": [], "gres": "gpu:8", "gres_used": "gpu:3", "cpus": 16,
         "active_features": "leaf_s1", "features": "leaf_s1", "partitions": ["gpu", "debug"]},
        {"name": "n3", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:a100:8(S:0-1)",
         "gres_used": "gpu:a100:0(IDX:N/A)", "cpus": 16, "active_features": "leaf_s2", "features": "leaf_s2",
         "partitions": ["gpu"]},
        {"name": "n4", "state": "down", "state_flags": ["NOT_RESPONDING"], "gres": "", "gres_used": "gpu:0",
         "cpus": 16, "active_features": "", "features": "", "partitions": ["gpu"]},
    ]]
    assert list(nodes.values()) == reference


def test_no_nodes_is_an_error():
    with pytest.raises(FormatError, match="sinfo -N -O: Slurm printed no nodes"):
        read_nodes(join_records([["NODELIST", "PARTITION", "CPUS", "GRES", "GRES_USED", "STATE", "F", "A"]], TOKEN),
                   TOKEN, "sinfo -N -O")


# ---------------------------------------------------------------- through the backend


class LeanSlurm:
    """Answers the lean reads from text (and the JSON reads when squeue refuses -O)."""

    def __init__(self, queue: str, excluded: str, nodes: str, *, refuse: bool = False, json_queue: str = "",
                 code: int = 0) -> None:
        self.queue, self.excluded, self.nodes, self.refuse, self.json_queue = queue, excluded, nodes, refuse, json_queue
        self.code = code  # squeue 22.05 exits 0 on a field it does not know; an older one may not
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv, env, timeout) -> CommandResult:
        argv = list(argv)
        self.calls.append((argv, dict(env)))
        if argv[:4] == ["squeue", "-a", "--sort=i", "-O"]:  # squeue 22.05 on a field it does not know: exit 0
            return CommandResult(self.code, self.queue, "squeue: error: Invalid job format specification: tres-alloc\n") \
                if self.refuse else CommandResult(0, self.queue, "")
        if argv[:3] == ["squeue", "-a", "-o"]:
            return CommandResult(0, self.excluded, "")
        if argv[:3] == ["sinfo", "-N", "-O"]:
            return CommandResult(0, self.nodes, "")
        if argv == ["squeue", "--json"]:
            return CommandResult(0, self.json_queue, "")
        if argv == ["sinfo", "--json"]:
            return CommandResult(0, json.dumps({"meta": json.loads(self.json_queue)["meta"], "nodes": [
                {"name": "n1", "state": "idle", "gres": "gpu:8", "cpus": 16}]}), "")
        return CommandResult(0, "", "")


NODES = join_records([["NODELIST", "PARTITION", "CPUS", "GRES", "GRES_USED", "STATE", "F", "A"],
                      ["n1", "gpu", "16", "gpu:8", "gpu:0", "idle", "(null)", "(null)"]], TOKEN)


def test_the_backend_reads_lean_with_a_fresh_token_epoch_times_and_no_squeue_defaults():
    queue, excluded = one_job()
    slurm = LeanSlurm(queue, excluded, NODES)
    backend = SlurmCliBackend(SlurmSettings(), runner=slurm, job_read="lean", token=lambda: TOKEN,
                              environ={"PATH": "/usr/bin", "SQUEUE_ARRAY": "1", "SQUEUE_FORMAT2": "JobID"})
    cluster = backend.read_cluster()
    assert [j.job_id for j in cluster.jobs] == [7] and [n.name for n in cluster.nodes] == ["n1"]
    assert [argv for argv, _ in slurm.calls] == [
        ["squeue", "-a", "--sort=i", "-O", squeue_format.job_format(TOKEN)],
        ["squeue", "-a", "-o", f"%A{TOKEN}%x{TOKEN}"],
        ["sprio", "-h", "-o", "%i|%S|%Y"],
        ["sinfo", "-N", "-O", squeue_format.node_format(TOKEN)],
        ["scontrol", "show", "topology"],
    ]
    lean_env = {"PATH": "/usr/bin", "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    for argv, env in slurm.calls:
        if argv[0] in ("squeue", "sinfo"):
            assert env == lean_env
        else:
            assert env == {"PATH": "/usr/bin", "TZ": "UTC", "SQUEUE_ARRAY": "1", "SQUEUE_FORMAT2": "JobID"}
    assert squeue_format.job_format(TOKEN).startswith(f"JobID:{TOKEN},ArrayJobID:{TOKEN},")


def test_every_read_draws_a_new_token():
    tokens = {squeue_format.new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(t[0] == "^" and "," not in t and ":" not in t and len(t) == 9 for t in tokens)


@pytest.mark.parametrize("code", [0, 1])
def test_squeue_refusing_the_format_reads_the_json_and_warns_once(caplog, code):
    queue = {"meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}, "errors": [],
             "jobs": [json_entry(dict(job_id=7, state="PENDING", user="u", account="a", partition="gpu", qos="q",
                                      name="n", comment="", admin_comment="", submit=1, eligible=1, start=0,
                                      limit=None, nodes=1, cpus=1, gpus=1, features=None, excluded="", required="",
                                      allocated="", switches=(0, 0), priority=1, nice=0, requeue=False, array=None))]}
    slurm = LeanSlurm("", "", "", refuse=True, json_queue=json.dumps(queue), code=code)
    backend = SlurmCliBackend(SlurmSettings(), runner=slurm, job_read="lean", token=lambda: TOKEN)
    with caplog.at_level(logging.WARNING, logger="dike_slurm"):
        for _ in range(3):
            assert [j.job_id for j in backend.read_cluster().jobs] == [7]
    assert caplog.text.count("squeue -O refused") == 1 and "Invalid job format specification" in caplog.text
    assert backend.lean_refused and "squeue --json" in [" ".join(argv) for argv, _ in slurm.calls]


def test_an_empty_lean_read_does_not_fall_back_it_is_an_error():
    slurm = LeanSlurm("", "", NODES)
    with pytest.raises(FormatError, match="squeue -O: Slurm printed nothing"):
        SlurmCliBackend(SlurmSettings(), runner=slurm, job_read="lean", token=lambda: TOKEN).read_cluster()
    assert not any(argv == ["squeue", "--json"] for argv, _ in slurm.calls)


def test_job_read_json_keeps_the_json_read():
    with pytest.raises(ValueError, match="job_read"):
        SlurmCliBackend(SlurmSettings(), job_read="xml")


# ---------------------------------------------------------------- what real Slurm printed

LEAN_VERSIONS = tuple(sorted(p.name.removeprefix("lean-") for p in FIXTURES.glob("lean-*")))
RECORDED_TOKEN = "^f00dcafe"  # tests/fixtures/record-slurm-lean


class RecordedSlurm:
    """Answers both reads with what one Slurm printed at the same moment (tests/fixtures/lean-VERSION)."""

    def __init__(self, version: str) -> None:
        self.folder = FIXTURES / f"lean-{version}"

    def text(self, name: str) -> str:
        return (self.folder / name).read_text(encoding="utf-8")

    def __call__(self, argv, env, timeout) -> CommandResult:
        argv = list(argv)
        answers = {
            ("squeue", "-a", "--sort=i", "-O"): "squeue-O.txt", ("squeue", "-a", "-o"): "squeue-o-excluded.txt",
            ("sinfo", "-N", "-O"): "sinfo-N-O.txt", ("squeue", "--json"): "squeue.json",
            ("squeue", "-h", "-a"): "squeue-switches.txt", ("sinfo", "--json"): "nodes.json",
            ("scontrol", "show", "nodes"): "nodes.json", ("sprio", "-h", "-o"): "sprio.txt",
        }
        name = answers.get(tuple(argv[:3])) or answers.get(tuple(argv[:4]))
        return CommandResult(0, self.text(name) if name else "", "")


def recorded_reads(version: str):
    reads = {}
    for job_read in ("lean", "json"):
        backend = SlurmCliBackend(SlurmSettings(), runner=RecordedSlurm(version), clock=lambda: 1796080000.0,
                                  job_read=job_read, token=lambda: RECORDED_TOKEN)
        reads[job_read] = backend.read_cluster()
    return reads["lean"], reads["json"]


def test_every_recorded_version_is_there():
    assert {"22.05", "24.11"} <= set(LEAN_VERSIONS)


@pytest.mark.parametrize("version", LEAN_VERSIONS)
def test_the_lean_and_json_reads_of_real_slurm_build_the_same_cluster_job_for_job(version):
    lean, json_read = recorded_reads(version)
    assert len(lean.jobs) >= 8
    theirs = {j.job_id: j for j in json_read.jobs}
    assert [j.job_id for j in lean.jobs] == sorted(theirs)  # squeue --sort=i; the JSON: slurmctld's list order
    for mine in lean.jobs:
        other = theirs[mine.job_id]
        assert mine == other, {k: (v, other.__dict__[k]) for k, v in mine.__dict__.items() if v != other.__dict__[k]}
    assert lean.admin_comments == json_read.admin_comments
    assert lean.site_factors == json_read.site_factors
    assert lean.nodes == json_read.nodes


@pytest.mark.parametrize("version", LEAN_VERSIONS)
def test_hostile_names_of_real_slurm_are_read_verbatim(version):
    lean, _ = recorded_reads(version)
    names = {j.name: j for j in lean.jobs}
    hostile = next(j for name, j in names.items() if name.startswith("run|1^x"))
    assert hostile.name == "run|1^x $(touch /tmp/pwned) `id`"
    assert hostile.comment == "a|b|c^f00dcaf ;dike:level=9 | ^deadbeefx"
    placed = names["placed"]
    assert placed.placement.features == "leaf_s1|leaf_s2" and placed.placement.exclude_nodes == ("n3",)
    assert (placed.placement.max_switches, placed.placement.switches_wait_s) == (1, 300)
    assert lean.admin_comments[placed.job_id] == "dike:level=1 attained=0.0gpuh"
    if "two\nlines|99999|root" in names:  # sbatch took the newline
        assert names["two\nlines|99999|root"].comment == "two\nlines|99999|root"
    assert names["favoured"].nice == -50 and names["favoured"].time_limit_s == 90 * 60
