"""Synthetic clusters and queues for the benchmarks, as Slurm 22.05 JSON text.

Sizes are (pending jobs, running jobs, nodes); nodes have 8 GPUs and sit under a switch tree of
up to 4 levels (leaf: 16 nodes, spine: 8 leaves, pod: 4 spines, one top switch).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from dike_slurm.domain.model import Switch, Topology

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


# Every key Slurm 22.05's `squeue --json` prints for a job (110) and `sinfo --json` for a node (45),
# with the values the lab printed (scripts/slurm-lab, a held 1-GPU job and an idle node); the
# synthetic values below are laid over them. Slurm prints the JSON indented by two spaces with
# "/" escaped: about 3.2 KB per job, which is what the engine parses every cycle.
_SQUEUE_JOB = {
    "account": "",
    "accrue_time": 0,
    "admin_comment": "",
    "array_job_id": 0,
    "array_task_id": None,
    "array_max_tasks": 0,
    "array_task_string": "",
    "association_id": 2,
    "batch_features": "",
    "batch_flag": True,
    "batch_host": "",
    "flags": [],
    "burst_buffer": "",
    "burst_buffer_state": "",
    "cluster": "bench",
    "cluster_features": "",
    "command": "",
    "comment": "",
    "container": "",
    "contiguous": False,
    "core_spec": None,
    "thread_spec": None,
    "cores_per_socket": None,
    "billable_tres": None,
    "cpus_per_task": None,
    "cpu_frequency_minimum": None,
    "cpu_frequency_maximum": None,
    "cpu_frequency_governor": None,
    "cpus_per_tres": "",
    "deadline": 0,
    "delay_boot": 0,
    "dependency": "",
    "derived_exit_code": 0,
    "eligible_time": 0,
    "end_time": 0,
    "excluded_nodes": "",
    "exit_code": 0,
    "features": "",
    "federation_origin": "",
    "federation_siblings_active": "",
    "federation_siblings_viable": "",
    "gres_detail": [],
    "group_id": 0,
    "group_name": "users",
    "job_id": 0,
    "job_state": "PENDING",
    "last_sched_evaluation": 0,
    "licenses": "",
    "max_cpus": 0,
    "max_nodes": 0,
    "mcs_label": "",
    "memory_per_tres": "",
    "name": "",
    "nodes": "",
    "nice": None,
    "tasks_per_core": None,
    "tasks_per_node": 0,
    "tasks_per_socket": None,
    "tasks_per_board": 0,
    "cpus": 1,
    "node_count": 1,
    "tasks": 1,
    "het_job_id": 0,
    "het_job_id_set": "",
    "het_job_offset": 0,
    "partition": "gpu",
    "prefer": "",
    "memory_per_node": None,
    "memory_per_cpu": 2000,
    "minimum_cpus_per_node": 1,
    "minimum_tmp_disk_per_node": 0,
    "preempt_time": 0,
    "pre_sus_time": 0,
    "priority": 0,
    "profile": None,
    "qos": "normal",
    "reboot": False,
    "required_nodes": "",
    "requeue": True,
    "resize_time": 0,
    "restart_cnt": 0,
    "resv_name": "",
    "shared": None,
    "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
    "sockets_per_board": 0,
    "sockets_per_node": None,
    "start_time": 0,
    "state_description": "",
    "state_reason": "Priority",
    "standard_error": "",
    "standard_input": "/dev/null",
    "standard_output": "",
    "submit_time": 0,
    "suspend_time": 0,
    "system_comment": "",
    "time_limit": None,
    "time_minimum": 0,
    "threads_per_core": None,
    "tres_bind": "",
    "tres_freq": "",
    "tres_per_job": "",
    "tres_per_node": "gres:gpu:1",
    "tres_per_socket": "",
    "tres_per_task": "",
    "tres_req_str": "cpu=1,mem=2000M,node=1,billing=1,gres/gpu=1",
    "tres_alloc_str": "",
    "user_id": 0,
    "user_name": "",
    "wckey": "",
    "current_working_directory": "/home",
}
_SINFO_NODE = {
    "architecture": "x86_64",
    "burstbuffer_network_address": "",
    "boards": 1,
    "boot_time": 0,
    "comment": "",
    "cores": 8,
    "cpu_binding": 0,
    "cpu_load": 133,
    "extra": "",
    "free_memory": 16380,
    "cpus": 16,
    "last_busy": 0,
    "features": "leaf_s1",
    "active_features": "leaf_s1",
    "gres": "gpu:8",
    "gres_drained": "N/A",
    "gres_used": "gpu:0",
    "mcs_label": "",
    "name": "",
    "next_state_after_reboot": "invalid",
    "address": "",
    "hostname": "",
    "state": "idle",
    "state_flags": [],
    "next_state_after_reboot_flags": [],
    "operating_system": "Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC",
    "owner": None,
    "partitions": ["gpu"],
    "port": 6818,
    "real_memory": 64000,
    "reason": "",
    "reason_changed_at": 0,
    "reason_set_by_user": None,
    "slurmd_start_time": 0,
    "sockets": 2,
    "threads": 1,
    "temporary_disk": 0,
    "weight": 1,
    "tres": "cpu=16,mem=62.50G,billing=16,gres/gpu=8",
    "slurmd_version": "22.05.8",
    "alloc_memory": 0,
    "alloc_cpus": 0,
    "idle_cpus": 16,
    "tres_used": None,
    "tres_weighted": 0.0,
}


def slurm_text(document: dict) -> str:
    """JSON laid out as Slurm 22.05 prints it (indent 2, `\\/` for `/`)."""
    return json.dumps(document, indent=2).replace("/", "\\/")


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
    """(`squeue --json`, `sinfo --json`) text as Slurm 22.05 (openapi v0.0.38) prints it."""
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
                **_SQUEUE_JOB,
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
                **_SINFO_NODE,
                "architecture": "x86_64", "boards": 1, "cores": 32, "cpus": 64, "features": "", "active_features": "",
                "gres": f"gpu:a100:{GPUS_PER_NODE}", "gres_drained": "N/A", "gres_used": f"gpu:a100:{used}(IDX:0-{max(used - 1, 0)})",
                "name": name, "hostname": name, "state": "mixed" if used else "idle", "state_flags": [],
                "partitions": ["gpu"], "port": 6818, "real_memory": 512000, "reason": "", "sockets": 2, "threads": 1,
                "tres": f"cpu=64,mem=500G,billing=64,gres/gpu={GPUS_PER_NODE}", "slurmd_version": "22.05.8",
                "alloc_memory": used * 16000, "alloc_cpus": used * 4, "idle_cpus": 64 - used * 4,
            }
        )
    meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}, "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}}
    return slurm_text({"meta": meta, "errors": [], "jobs": jobs}), slurm_text({"meta": meta, "errors": [], "nodes": nodes})
