"""The engine cycle's input without a Slurm: synthetic command output behind the CLI backend.

The CLI backend is driven by a fake runner that hands it the synthetic text of both reads of
the same queue: the lean one (`squeue -O`, `squeue -o %A%x`, `sinfo -N -O`, every field ending
with a fixed token) and the JSON one (`squeue --json`, `squeue -O` Switches, `sinfo --json`),
plus `sprio`; the topology comes from a topology.conf file. So the backend's own parsing builds
the cluster state, and `Engine.plan` (read, accounting, enrich, decide, diff, guardrails;
nothing written) runs exactly as live. The floors: splitting the lean text on its token, and
`json.loads` of the JSON text: no cycle can be faster than reading its input. bench/run_all.py
times both (CPU seconds, best of N).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dike_slurm.slurm.backends import squeue_format  # noqa: E402
from dike_slurm.domain.fields import JobField, SwitchRequest  # noqa: E402
from dike_slurm.slurm.backends.cli import SlurmCliBackend  # noqa: E402
from dike_slurm.slurm.backends.commands import CommandResult, FedResult  # noqa: E402
from dike_slurm.config import SlurmSettings  # noqa: E402
from dike_slurm.cycle.gcpause import paused_gc  # noqa: E402
from dike_slurm.parsing.durations import format_duration  # noqa: E402
from dike_slurm.parsing.hostlists import compress_hostlist  # noqa: E402
from dike_slurm.cycle.plan import CyclePlan  # noqa: E402
from synthetic import BASE_TIME, Size, slurm_json, slurm_text, topology  # noqa: E402

POLICIES = ("fifo", "multifactor", "tiresias", "dike")
READS = ("lean", "json")
TOKEN = "^b3c4d5e6"  # the lean read's field terminator (the engine draws one per call)


def best_of(repeat: int, action: Callable[[], object]) -> float:
    """Least CPU seconds of `repeat` runs of `action`."""
    best = math.inf
    for _ in range(max(1, repeat)):
        started = time.process_time()
        action()
        best = min(best, time.process_time() - started)
    return best


def topology_conf(nodes: int) -> str:
    """The synthetic switch tree as topology.conf text (one line per switch)."""
    lines = []
    for switch in topology(nodes).switches.values():
        if switch.nodes:
            lines.append(f"SwitchName={switch.name} Nodes={','.join(switch.nodes)}")
        else:
            lines.append(f"SwitchName={switch.name} Switches={','.join(switch.children)}")
    return "\n".join(lines) + "\n"


def clock_text(seconds: int) -> str:
    """Slurm's secs2time_str: M:SS, H:MM:SS or D-HH:MM:SS."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def lean_row(entry: dict, switch: str) -> list[str]:
    """One job of the synthetic `squeue --json` as `squeue -O JOB_FIELDS` prints it (epoch times)."""
    running = entry["job_state"] == "RUNNING"
    count, wait = switch.split("|")[1:3] if switch else ("0", "0:00")
    values = {
        "JobID": str(entry["job_id"]), "ArrayJobID": str(entry["array_job_id"] or entry["job_id"]),
        "ArrayTaskID": "N/A" if entry["array_task_id"] is None else str(entry["array_task_id"]),
        "State": entry["job_state"], "UserName": entry["user_name"], "Account": entry["account"],
        "Partition": entry["partition"], "QOS": entry["qos"], "SubmitTime": str(entry["submit_time"]),
        "EligibleTime": str(entry["eligible_time"] or "N/A"), "StartTime": str(entry["start_time"] or "N/A"),
        "TimeLimit": "UNLIMITED" if entry["time_limit"] is None else clock_text(entry["time_limit"] * 60),
        "NumNodes": str(entry["node_count"]), "NumCPUs": str(entry["cpus"]),
        "tres-alloc": entry["tres_alloc_str"] if running else entry["tres_req_str"],
        "tres-per-job": entry["tres_per_job"] or "N/A", "tres-per-node": entry["tres_per_node"] or "N/A",
        "Feature": entry["features"] or "(null)", "ReqNodes": entry["required_nodes"], "NodeList": entry["nodes"],
        "ReqSwitch": count, "Wait4Switch": wait, "PriorityLong": str(entry["priority"]),
        "Nice": str(entry["nice"] or 0), "Requeue": "1" if entry["requeue"] else "0",
        "Reason": (entry.get("state_description") or entry.get("state_reason") or "None"), "Name": entry["name"],
        "Comment": entry["comment"], "admin_comment": entry["admin_comment"],
    }
    return [values[name] for name in squeue_format.JOB_FIELDS]


def lean_node_rows(node: dict) -> list[list[str]]:
    """One node of the synthetic `sinfo --json` as `sinfo -N -O NODE_FIELDS` prints it (a line per partition)."""
    state = "+".join([node["state"], *(f.lower() for f in node["state_flags"])])
    return [[node["name"], partition, str(node["cpus"]), node["gres"], node["gres_used"], state,
             node["features"] or "(null)", node["active_features"] or "(null)"] for partition in node["partitions"]]


class SlurmText:
    """Everything the CLI backend reads in a cycle, as text, for one synthetic size: the lean and
    the JSON reads of the same queue."""

    def __init__(self, size: Size, folder: Path) -> None:
        self.size = size
        self.squeue, self.sinfo = slurm_json(size)
        pending = [j for j in json.loads(self.squeue)["jobs"] if j["job_state"] == "PENDING"]
        # squeue -h -t PD -O JobID:|,ReqSwitch:|,Wait4Switch:| and sprio -h -o %i|%S|%Y, one line per pending job
        self.switches = "".join(f"{j['job_id']}|0|0:00|\n" for j in pending)
        self.sprio = "".join(f"{j['job_id']}|0|{j['priority']}\n" for j in pending)
        self.topology_path = folder / f"topology-{size.nodes}.conf"
        self.topology_path.write_text(topology_conf(size.nodes), encoding="utf-8")
        self._lean_from_json()

    def _lean_from_json(self) -> None:
        """The lean texts of the queue and nodes the JSON texts hold (with the Switches lines)."""
        switches = {int(line.split("|", 1)[0]): line for line in self.switches.splitlines()}
        jobs = json.loads(self.squeue)["jobs"]
        header = ["JOBID", *(name.upper() for name in squeue_format.JOB_FIELDS[1:])]
        rows = [lean_row(entry, switches.get(entry["job_id"], "")) for entry in jobs]
        self.lean_squeue = squeue_format.join_records([header, *rows], TOKEN)
        self.lean_excluded = squeue_format.join_records(
            [["JOBID", "EXC_NODES"], *([str(e["job_id"]), e["excluded_nodes"]] for e in jobs)], TOKEN)
        node_header = ["NODELIST", "PARTITION", "CPUS", "GRES", "GRES_USED", "STATE", "AVAIL_FEATURES", "ACTIVE_FEATURES"]
        node_rows = [row for node in json.loads(self.sinfo)["nodes"] for row in lean_node_rows(node)]
        self.lean_sinfo = squeue_format.join_records([node_header, *node_rows], TOKEN)

    @property
    def megabytes(self) -> float:
        return (len(self.squeue) + len(self.sinfo)) / 1e6

    @property
    def lean_megabytes(self) -> float:
        return (len(self.lean_squeue) + len(self.lean_excluded) + len(self.lean_sinfo)) / 1e6

    def runner(self, argv, env, timeout) -> CommandResult:
        """Stands in for subprocess: the text each Slurm command would print."""
        command, argv = Path(argv[0]).name, list(argv)
        if command == "squeue":
            if "--json" in argv:
                return CommandResult(0, self.squeue, "")
            if argv[1:4] == ["-a", "--sort=i", "-O"]:
                return CommandResult(0, self.lean_squeue, "")
            if argv[1:3] == ["-a", "-o"]:
                return CommandResult(0, self.lean_excluded, "")
            return CommandResult(0, self.switches, "")
        if command == "sinfo":
            return CommandResult(0, self.sinfo if "--json" in argv else self.lean_sinfo, "")
        if command == "sprio":
            return CommandResult(0, self.sprio, "")
        return CommandResult(0, "", "")  # sacct: no finished run in the overlap window

    @staticmethod
    def feeder(argv, env, stdin, timeout) -> FedResult:
        """Stands in for the one scontrol fed the writes' lines: every line succeeds."""
        return FedResult(0, "", "")

    def backend(self, job_read: str = "lean") -> SlurmCliBackend:
        settings = SlurmSettings(topology_conf=self.topology_path)
        return SlurmCliBackend(settings, runner=self.runner, clock=lambda: float(BASE_TIME), environ={},
                               job_read=job_read, token=lambda: TOKEN, feeder=self.feeder)

    def floor(self, job_read: str = "lean") -> None:
        """Reading the input and nothing else, under the same paused collector as Engine.plan: the
        lean texts split on their token, or json.loads of the JSON texts."""
        with paused_gc():
            if job_read == "lean":
                self.lean_squeue.split(TOKEN)
                self.lean_excluded.split(TOKEN)
                self.lean_sinfo.split(TOKEN)
            else:
                json.loads(self.squeue)
                json.loads(self.sinfo)

    def holding(self, plan: CyclePlan) -> SlurmText:
        """The same cluster after every write of `plan` (the held-back ones too) took effect:
        what the engine reads in the cycles that follow, when the queue has not moved."""
        written: dict[int, dict[JobField, object]] = {}
        for write in (*plan.writes, *plan.held_back):
            written.setdefault(write.job_id, {}).update(write.update.values)
        document = json.loads(self.squeue)
        for entry in document["jobs"]:
            values = written.get(entry["job_id"], {})
            if JobField.ADMIN_COMMENT in values:
                entry["admin_comment"] = values[JobField.ADMIN_COMMENT]
            if JobField.FEATURES in values:
                entry["features"] = values[JobField.FEATURES]
            if JobField.EXCLUDED_NODES in values:
                entry["excluded_nodes"] = compress_hostlist(values[JobField.EXCLUDED_NODES])
        after = copy.copy(self)
        after.squeue = slurm_text(document)
        lines = []
        for line in self.switches.splitlines():
            job_id = int(line.split("|", 1)[0])
            request = written.get(job_id, {}).get(JobField.SWITCHES)
            if isinstance(request, SwitchRequest) and request.count:
                line = f"{job_id}|{request.count}|{format_duration(request.wait_s or 0)}|"
            lines.append(line + "\n")
        after.switches = "".join(lines)
        lines = []
        for line in self.sprio.splitlines():
            job_id, factor, priority = line.split("|")
            factor = written.get(int(job_id), {}).get(JobField.SITE_FACTOR, factor)
            lines.append(f"{job_id}|{factor}|{priority}\n")
        after.sprio = "".join(lines)
        after._lean_from_json()
        return after
