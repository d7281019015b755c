"""The engine cycle's input without a Slurm: synthetic command output behind the CLI backend.

The CLI backend is driven by a fake runner that hands it the synthetic `squeue --json`,
`squeue -O` (Switches), `sprio` and `sinfo --json` text, and the topology comes from a
topology.conf file, so the backend's own parsing builds the cluster state, and `Engine.plan`
(read, accounting, enrich, decide, diff, guardrails; nothing written) runs exactly as live.
The floor is `json.loads` of the same squeue and sinfo text: no cycle can be faster than
reading its input. bench/run_all.py times it (CPU seconds, best of N).
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

from dike_slurm.backends.base import JobField, SwitchRequest  # noqa: E402
from dike_slurm.backends.cli import CommandResult, SlurmCliBackend  # noqa: E402
from dike_slurm.config import SlurmSettings  # noqa: E402
from dike_slurm.gcpause import paused_gc  # noqa: E402
from dike_slurm.parsing.durations import format_duration  # noqa: E402
from dike_slurm.parsing.hostlists import compress_hostlist  # noqa: E402
from dike_slurm.reconcile import CyclePlan  # noqa: E402
from synthetic import BASE_TIME, Size, slurm_json, slurm_text, topology  # noqa: E402

POLICIES = ("fifo", "multifactor", "tiresias", "dike")


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


class SlurmText:
    """Everything the CLI backend reads in a cycle, as text, for one synthetic size."""

    def __init__(self, size: Size, folder: Path) -> None:
        self.size = size
        self.squeue, self.sinfo = slurm_json(size)
        pending = [j for j in json.loads(self.squeue)["jobs"] if j["job_state"] == "PENDING"]
        # squeue -h -t PD -O JobID:|,ReqSwitch:|,Wait4Switch:| and sprio -h -o %i|%S|%Y, one line per pending job
        self.switches = "".join(f"{j['job_id']}|0|00:00:00|\n" for j in pending)
        self.sprio = "".join(f"{j['job_id']}|0|{j['priority']}\n" for j in pending)
        self.topology_path = folder / f"topology-{size.nodes}.conf"
        self.topology_path.write_text(topology_conf(size.nodes), encoding="utf-8")

    @property
    def megabytes(self) -> float:
        return (len(self.squeue) + len(self.sinfo)) / 1e6

    def runner(self, argv, env, timeout) -> CommandResult:
        """Stands in for subprocess: the text each Slurm command would print."""
        command = Path(argv[0]).name
        if command == "squeue":
            return CommandResult(0, self.squeue if "--json" in argv else self.switches, "")
        if command == "sinfo":
            return CommandResult(0, self.sinfo, "")
        if command == "sprio":
            return CommandResult(0, self.sprio, "")
        return CommandResult(0, "", "")  # sacct: no finished run in the overlap window

    def backend(self) -> SlurmCliBackend:
        settings = SlurmSettings(topology_conf=self.topology_path)
        return SlurmCliBackend(settings, runner=self.runner, clock=lambda: float(BASE_TIME), environ={})

    def floor(self) -> None:
        """json.loads of squeue and sinfo, under the same paused collector as Engine.plan."""
        with paused_gc():
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
        return after
