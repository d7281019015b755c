"""A small cluster behind the FakeBackend for the engine tests: 4 nodes x 8 GPUs, two leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dike_slurm.slurm.accounting import AccountingRecord
from fakes import FakeBackend
from dike_slurm.config import Config
from dike_slurm.cycle.engine import Engine
from dike_slurm.domain.model import Job, JobState, Node, Switch, Topology
from dike_slurm.store.state import StateStore

NOW = 1_000_000.0
TOPOLOGY = Topology.from_switches(
    [Switch("s1", ("n1", "n2")), Switch("s2", ("n3", "n4")), Switch("top", children=("s1", "s2"))]
)


def nodes(alloc: dict[str, int] | None = None) -> tuple[Node, ...]:
    alloc = alloc or {}
    return tuple(
        Node(f"n{i}", 8, alloc.get(f"n{i}", 0), 16, "MIXED" if alloc.get(f"n{i}") else "IDLE",
             (f"leaf_s{1 + (i > 2)}",), ("gpu",))
        for i in range(1, 5)
    )


def pending(job_id: int, user: str = "alice", gpus: int = 1, waited: float = 60.0, **extra: Any) -> Job:
    fields: dict[str, Any] = dict(
        job_id=job_id, user=user, state=JobState.PENDING, submit_time=NOW - waited, gpus=gpus,
        num_nodes=max(1, -(-gpus // 8)), partition="gpu", account="research", qos="normal",
    )
    fields.update(extra)
    return Job(**fields)


def running(job_id: int, user: str = "alice", gpus: int = 1, ran: float = 600.0, node: str = "n1",
            **extra: Any) -> Job:
    fields: dict[str, Any] = dict(
        job_id=job_id, user=user, state=JobState.RUNNING, submit_time=NOW - ran - 10, start_time=NOW - ran,
        gpus=gpus, num_nodes=1, partition="gpu", account="research", qos="normal", nodes=(node,),
    )
    fields.update(extra)
    return Job(**fields)


def finished_run(job_id: int, user: str, gpus: int, start: float, end: float,
                 state: JobState = JobState.COMPLETED) -> AccountingRecord:
    return AccountingRecord(
        job_id=job_id, display_id=str(job_id), user=user, account="research", partition="gpu",
        state=state, state_text=state.value, submit=start - 10, start=start, end=end,
        elapsed_s=int(end - start), gpus=gpus, num_nodes=max(1, gpus // 8),
    )


def config(tmp_path: Path, **sections: dict[str, Any]) -> Config:
    data: dict[str, Any] = {
        "engine": {"state_db": str(tmp_path / "state.sqlite")},
        "policies": {"dike": {"thresholds_gpuh": [1.0, 8.0], "steer_light_jobs": False}},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


def engine(cfg: Config, backend: FakeBackend, *, read_only: bool = False) -> Engine:
    return Engine(cfg, backend, StateStore(cfg.engine.state_db, read_only=read_only))
