"""The sacct dump reader on dumps written exactly as Slurm 22.05 prints them, quirks included."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dike_slurm.slurm.accounting import SKIP_FIELD_COUNT, SKIP_REPEATED_HEADER, SKIP_STEP, read_sacct_parsable2
from dike_slurm.slurm.accounting_json import read_sacct_file, read_sacct_json
from dike_slurm.errors import InputError
from dike_slurm.domain.model import JobState
from dike_slurm.parsing.durations import parse_timestamp

HEADER = (
    "JobID|JobIDRaw|JobName|User|Account|Partition|QOS|State|Submit|Eligible|Start|End|Elapsed|ElapsedRaw|"
    "Timelimit|NNodes|NCPUS|NodeList|ReqTRES|AllocTRES|Priority|Flags"
)

# Rows as `sacct --allusers --duplicates --parsable2 --format=...` printed them on the lab cluster,
# plus the shapes the lab did not produce on its own (typed GPUs, hostile names, pending arrays).
ROWS = [
    # 1. a plain finished GPU job and its steps
    "101|101|train|alice|research|gpu|normal|COMPLETED|2026-01-05T10:00:00|2026-01-05T10:00:00|2026-01-05T10:00:10|"
    "2026-01-05T11:00:10|01:00:00|3600|02:00:00|1|8|n1|billing=8,cpu=8,gres/gpu=4,mem=32G,node=1|"
    "billing=8,cpu=8,gres/gpu=4,mem=32G,node=1|10132|SchedMain,StartRecieved",
    "101.batch|101.batch|batch||research|||COMPLETED|2026-01-05T10:00:10|2026-01-05T10:00:10|2026-01-05T10:00:10|"
    "2026-01-05T11:00:10|01:00:00|3600||1|8|n1||cpu=8,gres/gpu=4,mem=32G,node=1||",
    "101.extern|101.extern|extern||research|||COMPLETED|2026-01-05T10:00:10|2026-01-05T10:00:10|2026-01-05T10:00:10|"
    "2026-01-05T11:00:10|01:00:00|3600||1|8|n1||billing=8,cpu=8,gres/gpu=4,mem=32G,node=1||",
    "101.0|101.0|python||research|||COMPLETED|2026-01-05T10:00:11|2026-01-05T10:00:11|2026-01-05T10:00:11|"
    "2026-01-05T11:00:09|00:59:58|3598||1|8|n1||cpu=8,gres/gpu=4,mem=32G,node=1||",
    # 2. cancelled before it started: Start None, node list None assigned, AllocTRES without GPUs
    "102|102|wrap|root|root|gpu|normal|CANCELLED by 0|2026-01-05T10:05:19|2026-01-05T10:05:19|None|"
    "2026-01-05T10:05:33|00:00:00|0|Partition_Limit|0|1|None assigned|billing=1,cpu=1,gres/gpu=1,mem=2000M,node=1|"
    "billing=1,cpu=1,mem=2000M|10164|StartRecieved",
    # 2b. cancelled while held: sacct prints Start = End and an Eligible of Unknown
    "7624|7624|wrap|root|root|gpu|normal|CANCELLED by 0|2026-11-30T09:50:09|Unknown|2026-11-30T09:50:09|"
    "2026-11-30T09:50:09|00:00:00|0|UNLIMITED|1|1|None assigned|billing=1,cpu=1,gres/gpu=1,mem=2000M,node=1||"
    "10164|",
    # 3. a two-node job with typed GPUs (typed and untyped counts both printed)
    "103|103|llm-pretrain|bob|nlp|gpu|normal|TIMEOUT|2026-01-05T10:06:00|2026-01-05T10:06:00|2026-01-05T10:10:00|"
    "2026-01-06T10:10:30|1-00:00:30|86430|1-00:00:00|2|128|n[3-4]|billing=128,cpu=128,gres/gpu=16,mem=1000G,node=2|"
    "billing=128,cpu=128,gres/gpu:a100=16,gres/gpu=16,mem=1000G,node=2|20001|SchedBackfill",
    # 4. array tasks: JobIDRaw differs from the JobID's base, a pending task range, a task's step
    "104_1|105|sweep lr=1e-3|carol|vision|gpu|normal|COMPLETED|2026-01-05T10:07:00|2026-01-05T10:07:00|"
    "2026-01-05T10:07:05|2026-01-05T10:17:05|00:10:00|600|UNLIMITED|1|4|n2|billing=4,cpu=4,gres/gpu:a100=1,node=1|"
    "billing=4,cpu=4,gres/gpu:a100=1,node=1|10500|SchedSubmit",
    "104_1.batch|105.batch|batch||vision|||COMPLETED|2026-01-05T10:07:05|2026-01-05T10:07:05|2026-01-05T10:07:05|"
    "2026-01-05T10:17:05|00:10:00|600||1|4|n2||cpu=4,gres/gpu=1,node=1||",
    "104_[2-9%2]|104|sweep lr=1e-3|carol|vision|gpu|normal|PENDING|2026-01-05T10:07:00|2026-01-05T10:07:00|Unknown|"
    "Unknown|00:00:00|0|UNLIMITED|1|4|None assigned|billing=4,cpu=4,gres/gpu:a100=1,node=1||10500|",
    # 5. requeued: one record per run (--duplicates); the second run is still running
    "106|106|requeue-me|dave|research|gpu|normal|REQUEUED|2026-01-05T10:08:00|2026-01-05T10:08:00|"
    "2026-01-05T10:08:02|2026-01-05T10:38:02|00:30:00|1800|04:00:00|1|8|n1|billing=8,cpu=8,gres/gpu=2,node=1|"
    "billing=8,cpu=8,gres/gpu=2,node=1|10132|",
    "106|106|requeue-me|dave|research|gpu|normal|RUNNING|2026-01-05T10:38:03|2026-01-05T10:40:03|"
    "2026-01-05T10:41:00|Unknown|00:19:00|1140|04:00:00|1|8|n2|billing=8,cpu=8,gres/gpu=2,node=1|"
    "billing=8,cpu=8,gres/gpu=2,node=1|10132|StartRecieved",
    # 6. a CPU-only job and a job name full of odd characters, one of them the separator
    "107|107|preprocess|erin|data|cpu|normal|FAILED|2026-01-05T10:09:00|2026-01-05T10:09:00|2026-01-05T10:09:00|"
    "2026-01-05T10:09:30|00:00:30|30|00:30:00|1|16|n5|billing=16,cpu=16,mem=64G,node=1|"
    "billing=16,cpu=16,mem=64G,node=1|9000|SchedSubmit",
    "108|108|<script>alert(1)</script>|x `rm -rf`; ünïcödé\ttab|mallory|research|gpu|normal|OUT_OF_MEMORY|"
    "2026-01-05T10:10:00|2026-01-05T10:10:00|2026-01-05T10:10:01|2026-01-05T10:12:01|00:02:00|120|00:10:00|1|2|n6|"
    "billing=2,cpu=2,gres/gpu=1,node=1|billing=2,cpu=2,gres/gpu=1,node=1|9500|SchedMain",
    # 7. rows that cannot be read: a broken timestamp, a truncated line, a mangled id
    "109|109|broken|frank|research|gpu|normal|COMPLETED|2026-13-45T99:00:00|2026-01-05T10:11:00|2026-01-05T10:11:00|"
    "2026-01-05T10:12:00|00:01:00|60|00:10:00|1|1|n1|billing=1,cpu=1,gres/gpu=1,node=1|"
    "billing=1,cpu=1,gres/gpu=1,node=1|100|",
    "110|110|truncated|frank|research|gpu",
    "abc|abc|weird|frank|research|gpu|normal|COMPLETED|2026-01-05T10:11:00|2026-01-05T10:11:00|"
    "2026-01-05T10:11:00|2026-01-05T10:12:00|00:01:00|60|00:10:00|1|1|n1|billing=1|billing=1|100|",
    # 8. a second dump appended to the first repeats the header
    HEADER,
]


def dump(rows=ROWS, header=HEADER, newline="\n") -> str:
    return newline.join([header, *rows]) + newline


def by_id(result):
    records = {}
    for record in result.records:
        records.setdefault(record.job_id, []).append(record)
    return records


def test_reads_every_quirk_and_counts_what_it_skips():
    result = read_sacct_parsable2(dump(), "sacct.txt")
    assert result.rows == len(ROWS)
    assert result.skipped == {
        SKIP_STEP: 4,
        SKIP_FIELD_COUNT: 1,
        SKIP_REPEATED_HEADER: 1,
        "bad JobID": 1,
        "bad Submit/Eligible timestamp": 1,
    }
    assert result.first_skipped_line[SKIP_STEP] == 3  # line 1 is the header
    records = by_id(result)
    held = records[7624][0]
    assert held.start is None and not held.ran and held.eligible is None and held.gpus == 1
    assert sorted(records) == [101, 102, 103, 104, 105, 106, 107, 108, 7624]
    assert len(result.records) == result.rows - sum(result.skipped.values())


def test_plain_job_values():
    job = by_id(read_sacct_parsable2(dump(), "sacct.txt"))[101][0]
    assert (job.display_id, job.name, job.user, job.account, job.partition, job.qos) == (
        "101", "train", "alice", "research", "gpu", "normal"
    )
    assert job.state is JobState.COMPLETED
    assert job.submit == parse_timestamp("2026-01-05T10:00:00")
    assert job.end - job.start == 3600 == job.elapsed_s
    assert (job.time_limit_s, job.num_nodes, job.cpus, job.gpus, job.nodes) == (7200, 1, 8, 4, ("n1",))
    assert job.priority == 10132 and job.flags == "SchedMain,StartRecieved"


def test_cancelled_before_start_uses_the_request():
    job = by_id(read_sacct_parsable2(dump(), "sacct.txt"))[102][0]
    assert job.state is JobState.CANCELLED and job.state_text == "CANCELLED by 0"
    assert job.start is None and not job.ran and job.end is not None
    assert job.nodes == () and job.time_limit_s is None
    assert job.gpus == 1 and job.num_nodes == 1  # ReqTRES, as AllocTRES has no GPUs and NNodes is 0


def test_typed_gpus_multi_node_and_day_durations():
    job = by_id(read_sacct_parsable2(dump(), "sacct.txt"))[103][0]
    assert job.gpus == 16 and job.num_nodes == 2 and job.nodes == ("n3", "n4")
    assert job.time_limit_s == 86400 and job.elapsed_s == 86430 and job.state is JobState.TIMEOUT


def test_array_tasks():
    records = by_id(read_sacct_parsable2(dump(), "sacct.txt"))
    task = records[105][0]
    assert (task.display_id, task.array_job_id, task.array_task_id) == ("104_1", 104, 1)
    assert task.gpus == 1 and task.time_limit_s is None  # typed-only TRES; UNLIMITED
    pending = records[104][0]
    assert (pending.display_id, pending.array_job_id, pending.array_task_id) == ("104_[2-9%2]", 104, None)
    assert pending.state is JobState.PENDING and pending.start is None and pending.end is None


def test_requeued_job_has_one_record_per_run():
    runs = by_id(read_sacct_parsable2(dump(), "sacct.txt"))[106]
    assert [r.state for r in runs] == [JobState.REQUEUED, JobState.RUNNING]
    assert runs[0].elapsed_s == 1800 and runs[1].end is None and runs[1].elapsed_s == 1140
    assert runs[1].eligible - runs[1].submit == 120  # Slurm holds a requeued job for two minutes


def test_cpu_only_and_hostile_text():
    records = by_id(read_sacct_parsable2(dump(), "sacct.txt"))
    assert records[107][0].gpus == 0 and records[107][0].state is JobState.FAILED
    hostile = records[108][0]
    assert hostile.name == "<script>alert(1)</script>|x `rm -rf`; ünïcödé\ttab"  # the `|` rejoined
    assert hostile.user == "mallory" and hostile.state is JobState.OUT_OF_MEMORY


def test_any_column_order_extra_columns_crlf_and_bom():
    columns = HEADER.split("|")
    order = list(reversed(range(len(columns))))
    header = "|".join(columns[i] for i in order) + "|WCKey"
    rows = ["|".join(row.split("|")[i] for i in order) + "|" for row in ROWS[:6]]
    result = read_sacct_parsable2("\ufeff" + dump(rows, header, newline="\r\n"), "reordered.txt")
    plain = read_sacct_parsable2(dump(ROWS[:6]), "plain.txt")
    assert result.records == plain.records and result.skipped == plain.skipped


def test_a_pipe_in_the_name_or_the_comment_is_repaired_where_the_state_column_decides():
    header = HEADER + "|Comment"
    row = ROWS[0] + "|a comment"
    in_name = ROWS[0].replace("|train|", "|tr|ain|") + "|a comment"
    in_comment = ROWS[0] + "|a|comment"
    result = read_sacct_parsable2(dump([row, in_name, in_comment], header), "comment.txt")
    assert [(r.name, r.comment) for r in result.records] == [
        ("train", "a comment"), ("tr|ain", "a comment"), ("train", "a|comment")]
    assert result.skipped == {}
    # With State before both free-text columns either rejoining leaves a state there: undecided, skipped.
    columns = header.split("|")
    order = [columns.index("State")] + [i for i in range(len(columns)) if columns[i] != "State"]
    reordered = "|".join(columns[i] for i in order)
    good = "|".join(row.split("|")[i] for i in order)
    undecided = read_sacct_parsable2(dump([good, good.replace("|train|", "|tr|ain|")], reordered), "state-first.txt")
    assert len(undecided.records) == 1 and undecided.skipped == {SKIP_FIELD_COUNT: 1}


def test_missing_required_columns_name_them():
    header = "JobID|JobName|State|Submit"
    with pytest.raises(InputError) as caught:
        read_sacct_parsable2(dump(["1|x|COMPLETED|2026-01-05T10:00:00"], header), "short.txt")
    message = str(caught.value)
    assert message.startswith("short.txt:1:")
    for column in ("User", "Start", "End (or ElapsedRaw/Elapsed)", "AllocTRES (or ReqTRES)"):
        assert column in message


def test_no_header_and_empty_dumps_are_errors():
    with pytest.raises(InputError, match="no sacct header row"):
        read_sacct_parsable2("\n".join(ROWS[:2]), "noheader.txt")
    with pytest.raises(InputError, match="empty sacct dump"):
        read_sacct_parsable2("\n\n", "empty.txt")


def test_minimal_columns_derive_what_is_missing():
    header = "JobIDRaw|User|State|Submit|Start|End|ReqTRES"
    row = "7|alice|COMPLETED|2026-01-05T10:00:00|2026-01-05T10:00:05|2026-01-05T10:01:05|cpu=2,gres/gpu=2,node=1"
    (record,) = read_sacct_parsable2(dump([row], header), "minimal.txt").records
    assert record.elapsed_s == 60 and record.gpus == 2 and record.cpus == 2 and record.num_nodes == 1
    assert record.time_limit_s is None and record.display_id == "7"


def test_array_task_without_raw_id_is_skipped():
    header = "JobID|User|State|Submit|Start|End|AllocTRES"
    rows = [
        "5_1|alice|COMPLETED|2026-01-05T10:00:00|2026-01-05T10:00:05|2026-01-05T10:01:05|gres/gpu=1",
        "6|alice|COMPLETED|2026-01-05T10:00:00|2026-01-05T10:00:05|2026-01-05T10:01:05|gres/gpu=1",
    ]
    result = read_sacct_parsable2(dump(rows, header), "noraw.txt")
    assert [r.job_id for r in result.records] == [6]
    assert result.skipped == {"array task without JobIDRaw": 1}


# ------------------------------------------------------------------------------ JSON

def json_job(job_id, **changes):
    """One entry of `sacct --json` (Slurm 22.05, openapi dbv0.0.38) as the lab printed it."""
    job = {
        "account": "root",
        "allocation_nodes": 2,
        "array": {"job_id": 0, "limits": {"max": {"running": {"tasks": 0}}}, "task": None, "task_id": None},
        "comment": {"administrator": None, "job": None, "system": None},
        "flags": ["CLEAR_SCHEDULING", "STARTED_ON_BACKFILL"],
        "job_id": job_id,
        "name": "wrap",
        "nodes": "n[1-2]",
        "partition": "gpu",
        "priority": 10765,
        "qos": "normal",
        "required": {"CPUs": 2, "memory": 2000},
        "state": {"current": "CANCELLED", "reason": "None"},
        "steps": [],
        "time": {
            "elapsed": 12, "eligible": 1796025919, "end": 1796025933, "start": 1796025921,
            "submission": 1796025919, "suspended": 0, "limit": 525600,
        },
        "tres": {
            "allocated": [
                {"type": "cpu", "name": None, "id": 1, "count": 2},
                {"type": "mem", "name": None, "id": 2, "count": 4000},
                {"type": "energy", "name": None, "id": 3, "count": None},
                {"type": "node", "name": None, "id": 4, "count": 2},
                {"type": "gres", "name": "gpu", "id": 1001, "count": 16},
            ],
            "requested": [
                {"type": "cpu", "name": None, "id": 1, "count": 2},
                {"type": "node", "name": None, "id": 4, "count": 2},
                {"type": "gres", "name": "gpu", "id": 1001, "count": 16},
            ],
        },
        "user": "root",
    }
    job.update(changes)
    return job


def json_dump(*jobs):
    return json.dumps({"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], "jobs": list(jobs)})


def test_json_shape_of_slurm_22_05():
    never_started = json_job(
        6, allocation_nodes=0, nodes="None assigned",
        time={"elapsed": 0, "eligible": 1796025919, "end": 1796025933, "start": 1796025933, "submission": 1796025919, "limit": None},
        tres={"allocated": [{"type": "cpu", "name": None, "id": 1, "count": 1}],
              "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": 1}, {"type": "node", "count": 1}]},
    )
    array_task = json_job(14, array={"job_id": 13, "task": None, "task_id": 1}, name="odd|name `x`")
    requeued = json_job(12, state={"current": "REQUEUED", "reason": "None"})
    pending_again = json_job(
        12, state={"current": "PENDING", "reason": "None"}, nodes="None assigned",
        time={"elapsed": 0, "eligible": 1796026102, "end": 0, "start": 0, "submission": 1796025981, "limit": 5},
    )
    result = read_sacct_json(json_dump(json_job(7), never_started, array_task, requeued, pending_again, "junk"), "sacct.json")
    assert result.rows == 6 and result.skipped == {"job entry is not an object": 1}
    records = by_id(result)
    first = records[7][0]
    assert (first.gpus, first.num_nodes, first.cpus, first.nodes) == (16, 2, 2, ("n1", "n2"))
    assert first.time_limit_s == 525600 * 60 and first.elapsed_s == 12 and first.end - first.start == 12
    assert first.flags == "CLEAR_SCHEDULING,STARTED_ON_BACKFILL"
    cancelled = records[6][0]
    assert cancelled.start is None and cancelled.gpus == 1 and cancelled.num_nodes == 1 and cancelled.time_limit_s is None
    task = records[14][0]
    assert (task.display_id, task.array_job_id, task.array_task_id, task.name) == ("13_1", 13, 1, "odd|name `x`")
    assert [r.state for r in records[12]] == [JobState.REQUEUED, JobState.PENDING]
    assert records[12][1].start is None and records[12][1].end is None and records[12][1].time_limit_s == 300


def test_json_errors():
    with pytest.raises(InputError, match="not valid JSON"):
        read_sacct_json("{\n  broken", "bad.json")
    with pytest.raises(InputError, match='no "jobs" list'):
        read_sacct_json('{"meta": {}}', "nojobs.json")
    no_id = json_job(2)
    no_id["job_id"] = None
    result = read_sacct_json(json_dump(json_job(1, time={"submission": "soon"}), no_id), "odd.json")
    assert result.records == () and result.skipped == {"bad time.submission": 1, "no job_id": 1}


def test_file_reader_sniffs_the_format_and_names_the_file(tmp_path: Path):
    text_dump = tmp_path / "sacct.txt"
    text_dump.write_text(dump(ROWS[:2]), encoding="utf-8")
    json_file = tmp_path / "sacct.json"
    json_file.write_text("  \n" + json_dump(json_job(7)), encoding="utf-8")
    assert [r.job_id for r in read_sacct_file(text_dump).records] == [101]
    assert read_sacct_file(text_dump).source == str(text_dump)
    assert [r.job_id for r in read_sacct_file(json_file).records] == [7]
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(dump(ROWS[:1]).replace("train", "tr\xe4in").encode("latin-1"))
    assert read_sacct_file(latin).records[0].name == "tr\ufffdin"
    with pytest.raises(InputError, match="missing.txt: no such file"):
        read_sacct_file(tmp_path / "missing.txt")


def test_sacct_json_nan_and_infinity_are_skipped_rows_not_crashes():
    for literal in ("NaN", "Infinity", "-Infinity"):
        result = read_sacct_json('{"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "jobs": [{"job_id": %s}]}'
                                 % literal, "dump.json")
        assert result.records == ()
        assert sum(result.skipped.values()) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.sampled_from(ROWS) | st.binary(max_size=60).map(lambda b: b.decode("latin-1")), max_size=12),
    newline=st.sampled_from(["\n", "\r\n"]),
    odd=st.sampled_from([b"", b"\xef\xbb\xbf", b"\n\n", b"\r"]),
    junk=st.sampled_from([b"", b"\xff", b"\xe4\n", b"a\rb"]),
)
def test_the_file_is_streamed_with_the_same_result_as_reading_its_text(tmp_path: Path, rows, newline, odd, junk):
    # BOM, blank lines, CRLF, lone CR inside a field, bytes that are not UTF-8: one record each way
    data = odd + dump(rows, newline=newline).encode("utf-8", errors="surrogateescape") + junk
    path = tmp_path / "sacct.txt"
    path.write_bytes(data)
    try:
        expected = read_sacct_parsable2(data.decode("utf-8", errors="replace"), str(path))
    except InputError as error:
        with pytest.raises(InputError, match=re.escape(str(error))):
            read_sacct_file(path)
        return
    assert read_sacct_file(path) == expected
