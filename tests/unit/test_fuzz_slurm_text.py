"""Property-based fuzzing of what Slurm's commands print: sacct parsable2 and JSON, squeue and sinfo
JSON, `squeue -O`, `sprio` and `scontrol show topology` text. Any input gives a value or the
project's own InputError / SlurmError, never another exception.

The lean read (`squeue -O` / `sinfo -N -O` split on a per-call token) gets the same: any text,
Slurm-like lines of any width, hostile free text; a job it reads is one Slurm printed.

The budget is fixed: FUZZ_EXAMPLES examples per test (12 tests: 2,400 examples in all).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dike_slurm.slurm.accounting import read_sacct_parsable2
from dike_slurm.slurm.accounting_json import read_sacct_json
from dike_slurm.slurm.backends import squeue_format
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.slurm.backends.cli import SACCT_FORMAT, SlurmCliBackend, topology_from_scontrol
from dike_slurm.slurm.backends.commands import CommandResult
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import InputError, SlurmError
from dike_slurm.domain.model import Topology

FUZZ_EXAMPLES = 200
fuzz = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

SLURMISH = st.text(alphabet=string.ascii_letters + string.digits + "[]-,=:/._+ \t\n#|()@*", max_size=120)
ANY_TEXT = st.one_of(SLURMISH, st.text(max_size=120))
FIELD = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "4294967294", "2026-01-01T00:00:00", "Unknown", "None", "INFINITE",
                     "1-00:00:00", "cpu=4,gres/gpu=8,node=1", "gres/gpu:a100=2", "n[1-4]", "n[1-", "COMPLETED",
                     "CANCELLED by 0", "RUNNING", "PENDING", "123_4", "123_[1-3]", "123.batch", "123+0",
                     "gpu", "normal", "alice"]),
    SLURMISH,
)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64), st.floats(allow_nan=True),
                         ANY_TEXT)
# The meta blocks of the formats Slurm prints (22.05, 24.11, 26.05) and some it does not.
META = st.one_of(
    st.just({"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}),
    st.just({"plugin": {"type": "openapi/dbv0.0.38"}}),
    st.builds(lambda v: {"plugin": {"type": "", "data_parser": f"data_parser/v0.0.{v}"},
                         "slurm": {"release": "24.11.5"}}, st.integers(36, 47)),
    st.fixed_dictionaries({}, optional={"plugin": st.fixed_dictionaries({}, optional={
        "type": FIELD, "data_parser": FIELD})}),
)
STATE_WORDS = st.sampled_from(["PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "REQUEUED",
                               "COMPLETING", "CONFIGURING", "DRAIN", "IDLE", "MIXED", "idle", "NOT_A_STATE", ""])
STATES = st.one_of(STATE_WORDS, st.lists(STATE_WORDS, max_size=3))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)),
    max_leaves=12,
)
NUMBERISH = st.one_of(JSON_SCALARS, st.fixed_dictionaries(
    {}, optional={"set": st.booleans(), "infinite": st.booleans(), "number": JSON_SCALARS}))


def value_or_own_error(parse, *args):
    try:
        return parse(*args)
    except (InputError, SlurmError):
        return None


# ---------------------------------------------------------------- sacct


@st.composite
def sacct_dumps(draw) -> str:
    columns = SACCT_FORMAT.split(",")
    if draw(st.booleans()):
        columns = draw(st.permutations(columns))
    if draw(st.booleans()):
        columns = columns[: draw(st.integers(0, len(columns)))]
    rows = [
        draw(sacct_row(columns)) if draw(st.booleans())
        else "|".join(draw(FIELD) for _ in range(len(columns) + draw(st.integers(-1, 1))))
        for _ in range(draw(st.integers(0, 5)))
    ]
    return "\n".join(["|".join(columns), *rows])


# Values sacct prints in each column (invented, in sacct's formats). Job ids are far apart, so that a
# reader that takes the wrong id or shifts it reads a number the dump does not hold.
SACCT_VALUES = {
    "JobID": ["1203", "2045_4", "3301_[1-3]", "4410.batch", "5507+0", "6000"],
    "JobIDRaw": ["1203", "7102", "4410.batch", ""],
    "State": ["COMPLETED", "RUNNING", "PENDING", "CANCELLED by 0", "FAILED", "REQUEUED", "TIMEOUT"],
    "Submit": ["2026-01-01T00:00:00", "Unknown"], "Eligible": ["2026-01-01T00:00:00", "Unknown"],
    "Start": ["2026-01-01T01:00:00", "Unknown", "None"], "End": ["2026-01-01T02:00:00", "Unknown"],
    "ElapsedRaw": ["0", "3600"], "Timelimit": ["1-00:00:00", "UNLIMITED", "60"], "NNodes": ["1", "2"],
    "NCPUS": ["4", "64"], "AllocTRES": ["cpu=4,gres/gpu=8,node=1", "gres/gpu:a100=2", ""],
    "ReqTRES": ["cpu=4,gres/gpu=8,node=1", ""], "NodeList": ["n[1-4]", "n1", "None assigned"],
}


@st.composite
def sacct_row(draw, columns) -> str:
    """A row sacct could print, with at most one field replaced by fuzz."""
    fields = [draw(st.sampled_from(SACCT_VALUES[c])) if c in SACCT_VALUES else draw(FIELD) for c in columns]
    if fields and draw(st.booleans()):
        fields[draw(st.integers(0, len(fields) - 1))] = draw(FIELD)
    return "|".join(fields)


@fuzz
@given(st.one_of(sacct_dumps(), ANY_TEXT))
def test_sacct_parsable2_never_crashes(text):
    result = value_or_own_error(read_sacct_parsable2, text, "fuzz")
    if result is None:
        return
    # every row is read, skipped (and counted) or a step: no record is invented, none is counted twice
    assert len(result.records) + sum(result.skipped.values()) <= result.rows
    printed_numbers = {int(digits) for digits in re.findall(r"\d+", text)}
    for record in result.records:  # a job's ids are numbers sacct printed, its JobID is one sacct printed
        assert record.job_id in printed_numbers and record.display_id in text, record
        assert record.array_job_id is None or record.array_job_id in printed_numbers, record


def sacct_job():
    return st.fixed_dictionaries({}, optional={
        "job_id": NUMBERISH, "user": JSON_VALUES, "account": JSON_VALUES,
        "array": st.one_of(JSON_VALUES, st.fixed_dictionaries({}, optional={
            "job_id": NUMBERISH, "task_id": NUMBERISH,
            "task": st.one_of(FIELD, st.builds(hex, st.integers(0, 2**70)))})),
        "partition": JSON_VALUES, "state": st.one_of(JSON_VALUES, st.fixed_dictionaries(
            {}, optional={"current": st.one_of(FIELD, STATES), "reason": FIELD})),
        "time": st.one_of(JSON_VALUES, st.fixed_dictionaries({}, optional={
            k: NUMBERISH for k in ("submission", "eligible", "start", "end", "elapsed", "limit")})),
        "tres": st.one_of(JSON_VALUES, st.fixed_dictionaries({}, optional={
            "allocated": st.lists(st.fixed_dictionaries({}, optional={
                "type": FIELD, "name": FIELD, "count": NUMBERISH}), max_size=3),
            "requested": JSON_VALUES})),
        "nodes": JSON_VALUES, "allocation_nodes": NUMBERISH, "qos": JSON_VALUES,
    })


@fuzz
@given(st.one_of(
    st.builds(lambda jobs: json.dumps({"jobs": jobs}), st.lists(sacct_job(), max_size=4)),
    st.builds(lambda jobs, meta: json.dumps({"meta": meta, "jobs": jobs}), st.lists(sacct_job(), max_size=4), META),
    st.builds(json.dumps, JSON_VALUES),
    ANY_TEXT,
))
def test_sacct_json_never_crashes(text):
    value_or_own_error(read_sacct_json, text, "fuzz")


# ---------------------------------------------------------------- squeue / sinfo / sprio through the backend


def plausible_squeue_job():
    """A job squeue --json could print (invented: ids far apart, v0.0.38 and v0.0.40+ number forms)."""
    return st.fixed_dictionaries({
        "job_id": st.sampled_from([1203, 6000, {"set": True, "infinite": False, "number": 3301}]),
        "job_state": st.sampled_from(["PENDING", "RUNNING", ["PENDING"], ["RUNNING"], "COMPLETED"]),
        "submit_time": st.sampled_from([1_700_000_000, {"set": True, "infinite": False, "number": 1_700_000_000}]),
        "user_name": st.just("alice"), "partition": st.just("gpu"),
    })


def squeue_job():
    keys = ("job_id", "job_state", "user_name", "user_id", "account", "partition", "qos", "name", "comment",
            "admin_comment", "array_job_id", "array_task_id", "submit_time", "eligible_time", "start_time",
            "time_limit", "node_count", "cpus", "tres_alloc_str", "tres_req_str", "tres_per_job", "tres_per_node",
            "nodes", "features", "excluded_nodes", "priority", "nice", "requeue")
    return st.fixed_dictionaries({}, optional={
        k: st.one_of(NUMBERISH, FIELD, JSON_VALUES, *([STATES] if k == "job_state" else [])) for k in keys})


def sinfo_node():
    keys = ("name", "state", "state_flags", "gres", "gres_used", "cpus", "features", "active_features", "partitions")
    return st.fixed_dictionaries({}, optional={k: st.one_of(FIELD, JSON_VALUES, st.lists(FIELD, max_size=3),
                                                            *([STATES] if k == "state" else []))
                                              for k in keys})


def document(items, key):
    return st.one_of(
        st.builds(lambda xs, errors: json.dumps({key: xs, "errors": errors}), st.lists(items, max_size=4),
                  st.one_of(st.just([]), JSON_VALUES)),
        st.builds(lambda xs, meta: json.dumps({"meta": meta, key: xs, "errors": []}), st.lists(items, max_size=4),
                  META),
        st.builds(json.dumps, JSON_VALUES),
        ANY_TEXT,
    )


def backend(outputs: Mapping[str, str]) -> SlurmCliBackend:
    def runner(argv: Sequence[str], env, timeout) -> CommandResult:
        name = argv[0]
        if name == "squeue":
            name = "squeue-json" if "--json" in argv else "squeue-O"
        if argv[:3] == ["scontrol", "show", "nodes"]:
            name = "sinfo"  # the node list of v0.0.40+
        return CommandResult(0, outputs.get(name, ""), "")

    return SlurmCliBackend(SlurmSettings(), runner=runner, clock=lambda: 1_000_000.0, job_read="json")


def read(outputs) -> ClusterState | None:
    return value_or_own_error(backend(outputs).read_cluster)


LEGACY_META = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}
MODERN_META = {"plugin": {"type": "", "data_parser": "data_parser/v0.0.42"}, "slurm": {"release": "24.11.5"}}
ONE_NODE = {"name": "n1", "state": "idle", "gres": "gpu:8", "cpus": 16}


def nodes_for(squeue_text: str) -> str:
    """A valid node list in the format of the squeue document (so that the jobs are what is tested)."""
    try:
        meta = json.loads(squeue_text).get("meta")
    except (ValueError, AttributeError):
        meta = None
    return json.dumps({"meta": meta if isinstance(meta, dict) else LEGACY_META, "nodes": [ONE_NODE]})


def numbers_in(value) -> set[int]:
    """The whole numbers a JSON value could stand for as an id: itself, its digits, or its "number"."""
    if isinstance(value, bool):
        return {int(value)}
    if isinstance(value, int):
        return {value}
    if isinstance(value, float):
        return {int(value)} if value.is_integer() else set()
    if isinstance(value, str):
        return {int(digits) for digits in re.findall(r"\d+", value)}
    if isinstance(value, Mapping):
        return numbers_in(value.get("number"))
    return set()


def active(state) -> bool:
    """Whether a job_state names an active job: its first base-state word (as Slurm prints it)."""
    words = state.replace("+", " ").split() if isinstance(state, str) else [w for w in state if isinstance(w, str)]
    for word in words:
        if word in ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"):
            return word in ("PENDING", "RUNNING", "SUSPENDED")
    return False


@fuzz
@given(st.one_of(document(squeue_job(), "jobs"), document(plausible_squeue_job(), "jobs")))
def test_squeue_json_never_crashes_and_never_drops_a_job_silently(text):
    cluster = read({"squeue-json": text, "sinfo": nodes_for(text)})
    if cluster is not None:  # read: every active job Slurm printed is there, whatever the format
        printed = [j for j in json.loads(text)["jobs"] if active(j.get("job_state", ""))]
        assert len(cluster.jobs) == len(printed)
        # and each under an id Slurm printed for an active job (a plain number, or a {"number": N} object)
        printed_ids = {n for j in printed for n in numbers_in(j.get("job_id"))}
        assert all(type(j.job_id) is int and j.job_id in printed_ids for j in cluster.jobs), (
            [j.job_id for j in cluster.jobs], printed_ids)


@fuzz
@given(document(sinfo_node(), "nodes"))
def test_sinfo_json_never_crashes_and_reads_every_node(text):
    cluster = read({"squeue-json": json.dumps({"meta": LEGACY_META, "jobs": []}), "sinfo": text})
    if cluster is not None:
        printed = json.loads(text)["nodes"]
        assert len(cluster.nodes) == len({n["name"] for n in printed}) > 0


SWITCH_LINES = st.lists(st.builds("|".join, st.lists(FIELD, min_size=0, max_size=4)), max_size=5).map("\n".join)


@fuzz
@given(st.one_of(SWITCH_LINES, ANY_TEXT), st.one_of(SWITCH_LINES, ANY_TEXT))
def test_squeue_o_and_sprio_text_never_crash(switches, sprio):
    queue = json.dumps({"meta": LEGACY_META, "jobs": [{"job_id": 5, "job_state": "PENDING", "submit_time": 1}]})
    cluster = read({"squeue-json": queue, "squeue-O": switches, "sprio": sprio, "sinfo": nodes_for(queue)})
    assert cluster is not None and [j.job_id for j in cluster.jobs] == [5]


TOPOLOGY_LINES = st.lists(
    st.builds(lambda name, key, value, level: f"SwitchName={name} Level={level} LinkSpeed=1 {key}={value}",
              FIELD, st.sampled_from(["Nodes", "Switches", "Other"]), FIELD, FIELD),
    max_size=6,
).map("\n".join)


@fuzz
@given(st.one_of(TOPOLOGY_LINES, ANY_TEXT))
def test_scontrol_show_topology_never_crashes(text):
    result = value_or_own_error(topology_from_scontrol, text)
    assert result is None or isinstance(result, Topology)


@fuzz
@given(st.one_of(TOPOLOGY_LINES, ANY_TEXT))
def test_scontrol_topology_through_the_backend_never_crashes(text):
    queue = json.dumps({"meta": MODERN_META, "jobs": []})
    read({"squeue-json": queue, "sinfo": nodes_for(queue), "scontrol": text})


@fuzz
@given(st.one_of(sacct_dumps(), ANY_TEXT))
def test_sacct_through_the_backend_never_crashes(text):
    def runner(argv, env, timeout):
        return CommandResult(0, text, "")

    value_or_own_error(SlurmCliBackend(SlurmSettings(), runner=runner).accounting, 0.0, 86400.0)


@fuzz
@given(st.integers(-255, 255), ANY_TEXT, ANY_TEXT)
def test_failed_commands_become_slurm_errors(code, stdout, stderr):
    def runner(argv, env, timeout):
        return CommandResult(code, stdout, stderr)

    value_or_own_error(SlurmCliBackend(SlurmSettings(), runner=runner).read_cluster)


# ---------------------------------------------------------------- the lean read

TOKEN = "^5eed5eed"
LEAN_FIELD = st.one_of(FIELD, ANY_TEXT, st.sampled_from(["N/A", "(null)", "UNLIMITED", "0:00", "5:00", "-500",
                                                         "1796025904", TOKEN[:-1], "^", "\n", "\n7"]))


def lean_lines(names: tuple[str, ...], first_title: str):
    """Header-led token-terminated text, mostly well-formed: rows of about the right width."""
    header = [first_title, *(n.upper() for n in names[1:])]
    row = st.lists(LEAN_FIELD, min_size=len(names) - 1, max_size=len(names) + 1)
    return st.lists(row, max_size=4).map(lambda rows: squeue_format.join_records([header, *rows], TOKEN))


@fuzz
@given(st.one_of(lean_lines(squeue_format.JOB_FIELDS, "JOBID"), ANY_TEXT),
       st.one_of(lean_lines(squeue_format.EXCLUDED_FIELDS, "JOBID"), ANY_TEXT))
def test_squeue_lean_text_never_crashes_and_reads_only_printed_jobs(queue, excluded):
    read = value_or_own_error(squeue_format.read_jobs, queue, TOKEN, "squeue -O", excluded, TOKEN, "squeue -o")
    if read is not None:
        printed = {line.split(TOKEN, 1)[0] for line in queue.split(TOKEN + "\n")}
        assert all(str(job.job_id) in printed for job in read.jobs)
        assert read.count.read + read.count.left_out == read.count.printed


@fuzz
@given(st.one_of(lean_lines(squeue_format.NODE_FIELDS, "NODELIST"), ANY_TEXT))
def test_sinfo_lean_text_never_crashes_and_reads_every_node(text):
    read = value_or_own_error(squeue_format.read_nodes, text, TOKEN, "sinfo -N -O")
    if read is not None:
        nodes, count = read
        assert len(nodes) == count.read > 0


@fuzz
@given(st.one_of(lean_lines(squeue_format.JOB_FIELDS, "JOBID"), ANY_TEXT), ANY_TEXT, st.integers(-1, 1))
def test_the_lean_read_through_the_backend_never_crashes(queue, stderr, code):
    def runner(argv, env, timeout):
        if argv[0] == "squeue" and "-o" in argv:
            return CommandResult(0, squeue_format.join_records([["JOBID", "EXC_NODES"]], TOKEN), "")
        if argv[0] == "squeue":
            return CommandResult(code, queue, stderr)
        if argv[0] == "sinfo":
            return CommandResult(0, squeue_format.join_records([["NODELIST", *"ABCDEFG"], ["n1", "gpu", "16", "gpu:8",
                                                                "gpu:0", "idle", "", ""]], TOKEN), "")
        return CommandResult(0, "", "")

    backend = SlurmCliBackend(SlurmSettings(), runner=runner, clock=lambda: 1_000_000.0, token=lambda: TOKEN)
    value_or_own_error(backend.read_cluster)
