"""`queue` and `explain` give a pending job's expected start (docs/engine.md, "Expected start").

Against the stand-in Slurm commands of test_engine_cli: job 53 runs on n1 (sinfo shows n1, and n3
drained), pending task 60_3 (job 63) may run only on leaf s1 without n3 and n4, so it starts when
job 53 ends. The service prior has no history there: job 53 ends at its time limit, set here to
end half an hour from now.
"""

from __future__ import annotations

import json
import math
import time

from test_backend_contract import SQUEUE_JSON
from test_cli_views import as_json
from test_engine_cli import dike, slurm_stubs  # noqa: F401 (the fixture)


def test_queue_and_explain_give_the_expected_start_and_say_why_none(slurm_stubs):  # noqa: F811
    queue = json.loads(json.dumps(SQUEUE_JSON))
    blocker = next(j for j in queue["jobs"] if j["job_id"] == 53)
    blocker["time_limit"] = math.ceil((time.time() - blocker["start_time"]) / 60) + 30  # minutes
    ends = blocker["start_time"] + 60 * blocker["time_limit"]
    (slurm_stubs.parent / "squeue.json").write_text(json.dumps(queue))

    document = as_json("queue", config=slurm_stubs)
    rows = {row["job"]: row for row in document["jobs"]}
    task = rows["60_3"]
    # it starts when job 53 ends, at the next main pass (Slurm's batch_sched_delay: 3 s at most)
    assert ends <= task["expected_start"] <= ends + 3 and task["expected_start_note"] is None
    assert task["expected_start_time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(task["expected_start"]))
    assert rows["53"]["expected_start"] is None
    assert rows["53"]["expected_start_note"] == "running: only a pending job has an expected start"
    took = document["expected_starts"]
    assert (took["seated_running"], took["simulated_pending"], took["horizon_s"]) == (1, 1, 7 * 86400.0)
    assert took["basis"] == {"service prior": 0, "time limit": 1, "unknown": 1}  # job 63 has no time limit

    explained = as_json("explain", "60_3", config=slurm_stubs)
    assert explained["job"]["expected_start"] == task["expected_start"]
    assert explained["expected_starts"]["method"] == took["method"]
    assert explained["expected_starts"]["method"].startswith("Dike's simulator run forward up to 7 days")
    assert as_json("explain", "53", config=slurm_stubs)["expected_starts"] is None  # a running job: not simulated
    text = dike("explain", "60_3", config=slurm_stubs).stdout
    clock = task["expected_start_time"].replace("T", " ").rstrip("Z")
    assert f"  expected start: {clock} UTC, in 3" in text  # in 30m or 31m

    blocker["time_limit"] = None  # UNLIMITED: job 53 never ends, so no number is invented
    (slurm_stubs.parent / "squeue.json").write_text(json.dumps(queue))
    table = dike("queue", config=slurm_stubs).stdout
    assert "expected start" in table and "beyond horizon" in table
    none = as_json("explain", "60_3", config=slurm_stubs)["job"]
    assert none["expected_start"] is None and none["expected_start_note"].startswith("not within the 7 days simulated")
