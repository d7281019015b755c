"""The parts of `slurm.conf` and `topology.conf` the engine and the replay need."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from dike_slurm.domain.model import Node, Switch, Topology
from dike_slurm.domain.slurm_priority import (
    PartitionPriority,
    SlurmPriorityModel,
    build_model,
    parse_qos_dump,
    partition_priorities,
)
from dike_slurm.errors import InputError
from dike_slurm.parsing.durations import parse_duration
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.slurm_options import option_int
from dike_slurm.parsing.tres import parse_gres_gpu_types, parse_gres_gpus


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    max_time_s: int | None = None
    priority: PartitionPriority = PartitionPriority()


@dataclass(frozen=True)
class ClusterConf:
    """Nodes, partitions and global options read from a slurm.conf."""

    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    options: dict[str, str]  # global Key=Value lines, keys lower-case
    qos_priority: dict[str, int] | None = None  # from a qos.txt beside slurm.conf (load_cluster), if any

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.partitions if p.name == name), None)

    def priority_model(self, qos_priority: dict[str, int] | None, source: str) -> SlurmPriorityModel:
        """Slurm's priority on this cluster: the PriorityWeight* options, the partitions' priorities
        and TRES totals, and the QOS priorities given (sacctmgr has them, not slurm.conf)."""
        by_name = {n.name: n for n in self.nodes}
        partitions = []
        for partition in self.partitions:
            members = [by_name[name] for name in partition.nodes]
            totals = {"cpu": sum(n.cpus for n in members), "node": len(members), "gres/gpu": sum(n.gpus for n in members)}
            partitions.append((partition.name, partition.priority, totals))
        return build_model(self.options, partitions, len(self.nodes), sum(n.cpus for n in self.nodes), qos_priority, source)


def _logical_lines(text: str, source: str) -> Iterator[tuple[int, str]]:
    """Lines without comments, continuation lines joined, with their first line number."""
    pending = ""
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            yield start, line
    if pending.strip():
        yield start, pending.strip()


def _pairs(line: str, source: str, number: int) -> list[tuple[str, str]]:
    try:
        words = shlex.split(line, posix=True)
    except ValueError as exc:
        raise InputError(f"cannot split line: {exc}", source=source, line=number) from None
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise InputError(f"expected Key=Value, got {word!r}", source=source, line=number)
        pairs.append((key.strip().lower(), value.strip()))
    return pairs


def parse_slurm_conf(text: str, source: str = "slurm.conf") -> ClusterConf:
    """NodeName / PartitionName lines and global options. `include` lines are not followed."""
    node_defaults: dict[str, str] = {}
    nodes: dict[str, Node] = {}
    partitions: list[Partition] = []
    options: dict[str, str] = {}
    partition_lines: list[tuple[int, dict[str, str]]] = []
    for number, line in _logical_lines(text, source):
        if line.lower().startswith("include "):
            continue
        pairs = _pairs(line, source, number)
        head_key, head_value = pairs[0]
        fields = dict(pairs[1:])
        if head_key == "nodename":
            if head_value.upper() == "DEFAULT":
                node_defaults.update(fields)
                continue
            merged = {**node_defaults, **fields}
            try:
                names = expand_hostlist(head_value)
            except InputError as exc:
                raise InputError(str(exc), source=source, line=number) from None
            gpus = parse_gres_gpus(merged.get("gres", ""))
            gpu_types = parse_gres_gpu_types(merged.get("gres", ""))
            cpus = option_int(merged.get("cpus", merged.get("procs", "1")), "CPUs", source, number)
            features = tuple(
                f for f in (merged.get("feature", "") or merged.get("features", "")).split(",") if f
            )
            state = merged.get("state", "UNKNOWN").upper()
            for name in names:
                if name in nodes:
                    raise InputError(f"node {name!r} defined twice", source=source, line=number)
                nodes[name] = Node(name=name, gpus=gpus, cpus=cpus, state="IDLE" if state in ("UNKNOWN", "IDLE", "CLOUD") else state, features=features,
                                   gpu_types=gpu_types)
        elif head_key == "partitionname":
            if head_value.upper() == "DEFAULT":
                continue
            partition_lines.append((number, {"name": head_value, **fields}))
        else:
            options[head_key] = head_value
            for key, value in pairs[1:]:
                options[key] = value
    for number, fields in partition_lines:
        spec = fields.get("nodes", "")
        if spec.upper() == "ALL":
            members = tuple(nodes)
        else:
            try:
                members = expand_hostlist(spec)
            except InputError as exc:
                raise InputError(str(exc), source=source, line=number) from None
        unknown = [n for n in members if n not in nodes]
        if unknown:
            raise InputError(
                f"partition {fields['name']!r} names undefined nodes {unknown[:3]}", source=source, line=number
            )
        max_time = fields.get("maxtime", "UNLIMITED")
        try:
            max_time_s = parse_duration(max_time)
        except InputError:
            raise InputError(f"MaxTime={max_time!r} is not a Slurm duration", source=source, line=number) from None
        partitions.append(
            Partition(fields["name"], members, fields.get("default", "NO").upper() == "YES", max_time_s,
                      partition_priorities(fields, source, number))
        )
    partition_of: dict[str, list[str]] = {}
    for partition in partitions:
        for node in partition.nodes:
            partition_of.setdefault(node, []).append(partition.name)
    final_nodes = tuple(
        replace(n, partitions=tuple(partition_of.get(n.name, ()))) for n in nodes.values()
    )
    if not final_nodes:
        raise InputError("no NodeName lines", source=source)
    return ClusterConf(final_nodes, tuple(partitions), options)


def parse_topology_conf(text: str, source: str = "topology.conf") -> Topology:
    """`SwitchName=s1 Nodes=n[1-2]` / `SwitchName=top Switches=s[1-2]` lines.

    Also reads `scontrol show topology`, which adds `Level=` and `LinkSpeed=` and lists on an
    upper switch every node below it (`Nodes=n[1-4] Switches=s[1-2]`): there only the child
    switches count.
    """
    switches: list[Switch] = []
    seen_switch: dict[str, int] = {}
    seen_node: dict[str, str] = {}
    for number, line in _logical_lines(text, source):
        pairs = _pairs(line, source, number)
        head_key, head_value = pairs[0]
        if head_key != "switchname":
            raise InputError(f"expected SwitchName=, got {pairs[0][0]!r}", source=source, line=number)
        fields = dict(pairs[1:])
        if fields.get("switches") and fields.get("level", "0") not in ("", "0"):
            fields.pop("nodes", None)
        try:
            node_names = expand_hostlist(fields.get("nodes", ""))
            children = expand_hostlist(fields.get("switches", ""))
        except InputError as exc:
            raise InputError(str(exc), source=source, line=number) from None
        if not node_names and not children:
            raise InputError(f"switch {head_value!r} has neither Nodes= nor Switches=", source=source, line=number)
        if head_value in seen_switch:
            raise InputError(f"switch {head_value!r} already defined on line {seen_switch[head_value]}", source=source, line=number)
        seen_switch[head_value] = number
        for node in node_names:
            if node in seen_node:
                raise InputError(f"node {node!r} is already under switch {seen_node[node]!r}", source=source, line=number)
            seen_node[node] = head_value
        switches.append(Switch(head_value, node_names, children))
    return Topology.from_switches(switches, source=source)


QOS_FILE = "qos.txt"  # `sacctmgr show qos -P` output, read beside slurm.conf


def load_cluster(slurm_conf: Path, topology_conf: Path | None = None) -> tuple[ClusterConf, Topology]:
    """Read slurm.conf, (if given, else topology.conf beside it when present) the switch tree,
    and the QOS priorities of a qos.txt beside slurm.conf when there is one."""
    conf = parse_slurm_conf(_read(slurm_conf), source=str(slurm_conf))
    if topology_conf is None:
        beside = slurm_conf.parent / "topology.conf"
        topology_conf = beside if beside.is_file() else None
    topology = (
        parse_topology_conf(_read(topology_conf), source=str(topology_conf))
        if topology_conf is not None
        else Topology()
    )
    qos_file = slurm_conf.parent / QOS_FILE
    if qos_file.is_file():
        conf = replace(conf, qos_priority=parse_qos_dump(_read(qos_file), source=str(qos_file)))
    return conf, topology


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=str(path)) from None
