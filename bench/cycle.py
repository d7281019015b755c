"""The live engine's cycle without Slurm I/O, at the synthetic queue sizes, against its floor.

    .venv/bin/python bench/cycle.py [--sizes 0,1,2] [--policies fifo,multifactor,tiresias,dike] [--repeat 3]

The CLI backend is driven by a fake runner that hands it the synthetic `squeue --json`,
`squeue -O` (Switches), `sprio` and `sinfo --json` text, and the topology comes from a
topology.conf file, so the backend's own parsing builds the cluster state, and `Engine.plan`
(read, accounting, enrich, decide, diff, guardrails; nothing written) runs exactly as live.
The floor is `json.loads` of the same squeue and sinfo text: no cycle can be faster than
reading its input.

Figures (CPU seconds of this process, best of --repeat; CPU time rather than wall time because
the machine is shared):
- floor: json.loads(squeue) + json.loads(sinfo)
- read: backend.read_cluster() (JSON, job/node conversion, Switches and sprio text, topology)
- decide: the policy's decide() on the snapshot the engine built
- diff: Engine._diff + Engine._guardrails on that snapshot and those decisions
- cycle: the whole Engine.plan(); ratio = cycle / floor
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dike_slurm.backends.base import JobField, SwitchRequest  # noqa: E402
from dike_slurm.backends.cli import CommandResult, SlurmCliBackend  # noqa: E402
from dike_slurm.config import Config, SlurmSettings  # noqa: E402
from dike_slurm.engine import CyclePlan, Engine  # noqa: E402
from dike_slurm.gcpause import paused_gc  # noqa: E402
from dike_slurm.parsing.durations import format_duration  # noqa: E402
from dike_slurm.parsing.hostlists import compress_hostlist  # noqa: E402
from dike_slurm.state import StateStore  # noqa: E402
from synthetic import BASE_TIME, SIZES, Size, slurm_json, topology  # noqa: E402

POLICIES = ("fifo", "multifactor", "tiresias", "dike")
RESULTS = Path(__file__).resolve().parent / "results"


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
        after.squeue = json.dumps(document)
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


def measure_size(size: Size, policies: tuple[str, ...], repeat: int, folder: Path, log=print) -> dict:
    """Every figure of one size (see the module docstring)."""
    text = SlurmText(size, folder)
    row: dict = {
        "size": size.label, "pending": size.pending, "running": size.running, "nodes": size.nodes,
        "input_mb": round(text.megabytes, 1),
    }
    backend = text.backend()
    row["floor_s"] = best_of(repeat, text.floor)
    row["read_s"] = best_of(repeat, backend.read_cluster)
    row["policies"] = {}
    for name in policies:
        config = Config.model_validate({"engine": {"policy": name}})
        engine = Engine(config, backend, StateStore(None))
        seen: dict = {}
        decide = engine.policy.decide

        def capture(snapshot, params, rng, _decide=decide, _seen=seen):
            _seen["snapshot"] = snapshot
            _seen["decisions"] = _decide(snapshot, params, rng)
            return _seen["decisions"]

        engine.policy.decide = capture  # instance attribute: the class is untouched
        plan = engine.plan()
        engine.policy.decide = decide
        cycle = best_of(repeat, engine.plan)
        snapshot, decisions = seen["snapshot"], seen["decisions"]
        decide_s = best_of(repeat, lambda: decide(snapshot, engine.params, random.Random(0)))
        cluster = backend.read_cluster()
        memory, owned = engine.store.jobs(), engine.store.owned()

        def diff() -> None:
            plans, _ = engine._diff(snapshot, decisions, cluster, memory, owned)
            engine._guardrails(plans, owned)

        try:
            diff_s: float | None = best_of(repeat, diff)
        except (AttributeError, TypeError):  # the engine's private methods changed: only the total remains
            diff_s = None
        figures = {
            "cycle_s": cycle,
            "decide_s": decide_s,
            "diff_s": diff_s,
            "other_s": max(0.0, cycle - row["read_s"] - decide_s - (diff_s or 0.0)),
            "ratio_to_floor": cycle / row["floor_s"],
            "jobs": len(plan.jobs),
            "writes": len(plan.writes),
        }
        row["policies"][name] = figures
        log(f"  {size.label} {name}: cycle {cycle:.3f} s (read {row['read_s']:.3f}, decide {decide_s:.3f}, "
            f"diff {diff_s if diff_s is None else round(diff_s, 3)}), floor {row['floor_s']:.3f} s, "
            f"{figures['ratio_to_floor']:.1f}x")
    return row


def measure(sizes: list[Size], policies: tuple[str, ...], repeat: int, log=print) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="dike-bench-") as folder:
        return [measure_size(size, policies, repeat, Path(folder), log) for size in sizes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,1,2", help="indexes into synthetic.SIZES")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "cycle.json")
    args = parser.parse_args(argv)
    rows = measure([SIZES[int(i)] for i in args.sizes.split(",")], tuple(args.policies.split(",")), args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeat": args.repeat, "sizes": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
