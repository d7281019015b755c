"""Synthetic clusters and queues for the benchmarks, as Slurm 22.05 JSON text.

Sizes are (pending jobs, running jobs, nodes); nodes have 8 GPUs and sit under a switch tree of
up to 4 levels (leaf: 16 nodes, spine: 8 leaves, pod: 4 spines, one top switch).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from dike_slurm.model import Switch, Topology

GPUS_PER_NODE = 8
NODES_PER_LEAF = 16
LEAVES_PER_SPINE = 8
SPINES_PER_POD = 4
BASE_TIME = 1_790_000_000  # epoch seconds, an arbitrary fixed instant
USERS = 40


@dataclass(frozen=True)
class Size:
    pending: int
    running: int
    nodes: int

    @property
    def label(self) -> str:
        return f"{self.pending // 1000}k x {self.running} x {self.nodes}"


SIZES = (Size(1_000, 500, 100), Size(10_000, 2_000, 500), Size(50_000, 5_000, 2_000))


def node_name(index: int) -> str:
    return f"n{index:05d}"


def topology(nodes: int) -> Topology:
    """Leaf, spine, pod and top switches over `nodes` nodes (fewer levels for small clusters)."""
    names = [node_name(i) for i in range(nodes)]
    leaves = [Switch(f"leaf{i:04d}", tuple(names[s : s + NODES_PER_LEAF])) for i, s in enumerate(range(0, nodes, NODES_PER_LEAF))]
    switches = list(leaves)
    level = [s.name for s in leaves]
    for prefix, fanout in (("spine", LEAVES_PER_SPINE), ("pod", SPINES_PER_POD)):
        if len(level) <= 1:
            break
        upper = [Switch(f"{prefix}{i:04d}", children=tuple(level[s : s + fanout])) for i, s in enumerate(range(0, len(level), fanout))]
        switches.extend(upper)
        level = [s.name for s in upper]
    if len(level) > 1:
        switches.append(Switch("top", children=tuple(level)))
    return Topology.from_switches(switches)


def _jobs(size: Size, rng: random.Random) -> list[dict]:
    """Plain job records shared by the JSON and the Snapshot forms."""
    records = []
    node_cursor = 0
    gpu_choices = (1, 1, 1, 1, 2, 2, 4, 8, 16, 32)
    for index in range(size.running + size.pending):
        running = index < size.running
        gpus = rng.choice(gpu_choices)
        nodes = max(1, -(-gpus // GPUS_PER_NODE))
        submit = BASE_TIME - rng.randint(60, 7 * 86400)
        start = submit + rng.randint(0, 3600) if running else None
        allocated = ()
        if running:
            allocated = tuple(node_name((node_cursor + k) % size.nodes) for k in range(nodes))
            node_cursor += nodes
        records.append(
            dict(
                job_id=1_000_000 + index,
                user=f"user{rng.randrange(USERS):02d}",
                account=f"acct{rng.randrange(8)}",
                gpus=gpus,
                nodes=nodes,
                submit=submit,
                start=start,
                running=running,
                allocated=allocated,
                limit_min=rng.choice((60, 240, 1440, 4320)),
                name=rng.choice(("train_resnet50", "bert-large-ft", "gpt-pretrain-1b", "eval")),
            )
        )
    return records


def slurm_json(size: Size, seed: int = 0) -> tuple[str, str]:
    """(`squeue --json`, `sinfo --json`) text shaped like Slurm 22.05's openapi v0.0.38 output."""
    rng = random.Random(seed)
    jobs = []
    alloc_by_node: dict[str, int] = {}
    for r in _jobs(size, rng):
        per_node = -(-r["gpus"] // r["nodes"])
        for node in r["allocated"]:
            alloc_by_node[node] = min(GPUS_PER_NODE, alloc_by_node.get(node, 0) + per_node)
        tres = f"cpu={r['gpus'] * 4},mem={r['gpus'] * 16000}M,node={r['nodes']},billing={r['gpus'] * 4},gres/gpu={r['gpus']}"
        jobs.append(
            {
                "account": r["account"], "accrue_time": r["submit"], "admin_comment": "", "array_job_id": 0,
                "array_task_id": None, "batch_flag": True, "batch_host": r["allocated"][0] if r["allocated"] else "",
                "cluster": "bench", "comment": "", "cpus": r["gpus"] * 4, "eligible_time": r["submit"],
                "end_time": (r["start"] or 0) + r["limit_min"] * 60 if r["running"] else 0, "excluded_nodes": "",
                "features": "", "flags": [], "group_id": 1000, "group_name": "users", "job_id": r["job_id"],
                "job_state": "RUNNING" if r["running"] else "PENDING", "name": r["name"],
                "nodes": ",".join(r["allocated"]), "nice": None, "node_count": r["nodes"], "partition": "gpu",
                "priority": rng.randint(1000, 20000), "qos": "normal", "required_nodes": "", "requeue": True,
                "restart_cnt": 0, "start_time": r["start"] or 0, "state_reason": "None" if r["running"] else "Priority",
                "submit_time": r["submit"], "time_limit": r["limit_min"], "tres_per_job": "",
                "tres_per_node": f"gres:gpu:{-(-r['gpus'] // r['nodes'])}", "tres_req_str": tres,
                "tres_alloc_str": tres if r["running"] else "", "user_id": 1000 + int(r["user"][4:]),
                "user_name": r["user"], "wckey": "", "current_working_directory": "/home",
            }
        )
    nodes = []
    for i in range(size.nodes):
        name = node_name(i)
        used = alloc_by_node.get(name, 0)
        nodes.append(
            {
                "architecture": "x86_64", "boards": 1, "cores": 32, "cpus": 64, "features": "", "active_features": "",
                "gres": f"gpu:a100:{GPUS_PER_NODE}", "gres_drained": "N/A", "gres_used": f"gpu:a100:{used}(IDX:0-{max(used - 1, 0)})",
                "name": name, "hostname": name, "state": "mixed" if used else "idle", "state_flags": [],
                "partitions": ["gpu"], "port": 6818, "real_memory": 512000, "reason": "", "sockets": 2, "threads": 1,
                "tres": f"cpu=64,mem=500G,billing=64,gres/gpu={GPUS_PER_NODE}", "slurmd_version": "22.05.8",
                "alloc_memory": used * 16000, "alloc_cpus": used * 4, "idle_cpus": 64 - used * 4,
            }
        )
    meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}, "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}}
    return json.dumps({"meta": meta, "errors": [], "jobs": jobs}), json.dumps({"meta": meta, "errors": [], "nodes": nodes})
