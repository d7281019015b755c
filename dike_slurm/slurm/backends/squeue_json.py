"""The JSON read of the command-line backend: `squeue --json` jobs and `sinfo --json` /
`scontrol show nodes --json` nodes (either format family, dike_slurm.slurm.formats) as domain objects.

The cycle reads the lean `squeue -O` (dike_slurm.slurm.backends.squeue_format) and falls back to this
when squeue refuses it; tests/unit/test_lean_read.py holds the two reads equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dike_slurm.domain.fields import SwitchRequest
from dike_slurm.errors import InputError
from dike_slurm.domain.model import NO_PLACEMENT, Job, JobState, Node, Placement
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.tres import parse_gres_gpu_types, parse_gres_gpus, parse_tres, requested_gpu_types
from dike_slurm.slurm.formats import feature_list, job_base_state, node_state

_NO_TIME_LIMIT = 0xFFFFFFFE  # Slurm's INFINITE (NO_VAL is one more)
_NO_SWITCHES = SwitchRequest(0)


def _number(value: Any) -> int | None:
    """An integer as squeue/sinfo JSON prints it (plain, or {"set", "infinite", "number"} in newer plugins)."""
    if type(value) is int:  # the common case first: called ~10 times per job
        return value
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    raise ValueError(f"not a number: {value!r}")


def _epoch(value: Any) -> float | None:
    number = _number(value)
    return float(number) if number else None


def _signed32(value: int) -> int:
    """squeue's JSON prints a negative nice as its unsigned 32-bit pattern (-500 -> 4294966796)."""
    return value - 2**32 if value >= 2**31 else value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _hosts(value: Any) -> tuple[str, ...]:
    try:
        return expand_hostlist(_text(value))
    except InputError:
        return ()


def _placement(
    switch: SwitchRequest, features: str | None, exclude_nodes: tuple[str, ...], require_nodes: tuple[str, ...] = ()
) -> Placement:
    """What a pending job carries; most carry nothing and share one object."""
    if not switch.count and features is None and not exclude_nodes and not require_nodes:
        return NO_PLACEMENT
    return Placement(
        max_switches=switch.count or None,
        switches_wait_s=switch.wait_s if switch.count else None,
        features=features,
        exclude_nodes=exclude_nodes,
        require_nodes=require_nodes,
    )


def job_from_squeue(entry: Mapping[str, Any], switches: Mapping[int, SwitchRequest]) -> Job:
    """One job of `squeue --json` (v0.0.38 or v0.0.40+) as the domain Job.

    ValueError for an entry that cannot be read, an unknown job state included.
    """
    job_id = _number(entry.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    state = JobState.parse(job_base_state(entry.get("job_state")))
    array_job_id = _number(entry.get("array_job_id")) or None
    alloc = parse_tres(_text(entry.get("tres_alloc_str")))
    requested = parse_tres(_text(entry.get("tres_req_str")))
    node_count = _number(entry.get("node_count")) or 1
    gpus = alloc.gpus if state is JobState.RUNNING and alloc.gpus else requested.gpus
    if not gpus:
        per_job = parse_gres_gpus(_text(entry.get("tres_per_job")))
        gpus = per_job or parse_gres_gpus(_text(entry.get("tres_per_node"))) * node_count
    limit_min = _number(entry.get("time_limit"))
    switch = switches.get(job_id, _NO_SWITCHES)
    # the request, never tres_alloc_str: Slurm types an untyped job's allocation (gres/gpu:a100=2)
    gpu_types = requested_gpu_types(_text(entry.get("tres_per_job")), _text(entry.get("tres_per_node")))
    return Job.build(
        job_id=job_id,
        user=_text(entry.get("user_name")) or str(_number(entry.get("user_id"))),
        state=state,
        submit_time=_epoch(entry.get("submit_time")) or 0.0,
        gpus=gpus,
        num_nodes=node_count,
        cpus=_number(entry.get("cpus")) or 1,
        account=_text(entry.get("account")),
        partition=_text(entry.get("partition")),
        qos=_text(entry.get("qos")),
        name=_text(entry.get("name")),
        comment=_text(entry.get("comment")),
        array_job_id=array_job_id,
        array_task_id=_number(entry.get("array_task_id")) if array_job_id else None,
        eligible_time=_epoch(entry.get("eligible_time")),
        start_time=_epoch(entry.get("start_time")) if state is JobState.RUNNING else None,
        time_limit_s=None if limit_min is None or limit_min >= _NO_TIME_LIMIT else limit_min * 60,
        nodes=_hosts(entry.get("nodes")) if state is JobState.RUNNING else (),
        placement=_placement(
            switch, _text(entry.get("features")) or None, _hosts(entry.get("excluded_nodes")),
            _hosts(entry.get("required_nodes")),
        ),
        priority=_number(entry.get("priority")),
        nice=_signed32(_number(entry.get("nice")) or 0),
        requeueable=bool(entry.get("requeue")),
        gpu_types=gpu_types,
        slurm_reason=pending_reason(entry) if state is JobState.PENDING else "",
    )


def pending_reason(entry: Mapping[str, Any]) -> str:
    """What squeue prints as REASON: the job's state description when slurmctld set one
    ("ReqNodeNotAvail, UnavailableNodes:n4"), else the reason's name; "" for `None`."""
    reason = _text(entry.get("state_description")) or _text(entry.get("state_reason"))
    return "" if reason == "None" else reason


def node_from_sinfo(entry: Mapping[str, Any]) -> Node:
    """One node of `sinfo --json` (v0.0.38) or `scontrol show nodes --json` (v0.0.40+) as the
    domain Node (state words joined with '+': `IDLE+DRAIN`)."""
    name = _text(entry.get("name"))
    if not name:
        raise ValueError("node without name")
    partitions = entry.get("partitions")
    return Node(
        name=name,
        gpus=parse_gres_gpus(_text(entry.get("gres"))),
        gpus_alloc=parse_gres_gpus(_text(entry.get("gres_used"))),
        cpus=_number(entry.get("cpus")) or 1,
        state=node_state(entry),
        features=feature_list(entry.get("active_features")) or feature_list(entry.get("features")),
        partitions=tuple(str(p) for p in partitions) if isinstance(partitions, list) else (),
        gpu_types=parse_gres_gpu_types(_text(entry.get("gres"))),
    )
