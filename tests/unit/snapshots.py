"""Hand-built snapshots for policy tests: 4 nodes x 8 GPUs under two leaf switches."""

from __future__ import annotations

from dike_slurm.domain.model import Job, JobState, Node, Snapshot, Switch, Topology

NOW = 1_000_000.0
TOPOLOGY = Topology.from_switches(
    [Switch("s1", ("n1", "n2")), Switch("s2", ("n3", "n4")), Switch("top", children=("s1", "s2"))]
)


def nodes(alloc: dict[str, int] | None = None) -> tuple[Node, ...]:
    alloc = alloc or {}
    return tuple(Node(f"n{i}", 8, alloc.get(f"n{i}", 0), 16, "MIXED" if alloc.get(f"n{i}") else "IDLE", (f"leaf_s{1 + (i > 2)}",), ("gpu",)) for i in range(1, 5))


def pending(job_id: int, user: str = "alice", gpus: int = 1, waited: float = 60.0, **extra) -> Job:
    fields = dict(
        job_id=job_id, user=user, state=JobState.PENDING, submit_time=NOW - waited, gpus=gpus,
        num_nodes=max(1, -(-gpus // 8)), partition="gpu", account="research",
    )
    fields.update(extra)
    return Job(**fields)


def running(job_id: int, user: str = "alice", gpus: int = 1, ran: float = 600.0, node: str = "n1", **extra) -> Job:
    fields = dict(
        job_id=job_id, user=user, state=JobState.RUNNING, submit_time=NOW - ran - 10, start_time=NOW - ran,
        gpus=gpus, num_nodes=1, partition="gpu", nodes=(node,), attained_gpu_s=gpus * ran, run_count=1,
        last_run_s=ran,
    )
    fields.update(extra)
    return Job(**fields)


def snapshot(jobs, alloc=None, usage=None, history=()) -> Snapshot:
    return Snapshot(
        time=NOW, jobs=tuple(jobs), nodes=nodes(alloc), topology=TOPOLOGY,
        user_usage_gpu_s=usage or {}, completed_service_gpu_s=tuple(sorted(history)),
    )
