"""The site's priority model as Slurm's commands print it, read when the engine starts and on a
reload: `scontrol show config` (PriorityType, PriorityWeight*, ...), `scontrol show partition -o`
(PriorityJobFactor, PriorityTier, TRES) and, with slurmdbd, `sacctmgr -nP show qos
format=Name,Priority` (dike_slurm.domain.slurm_priority builds the model from them)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from dike_slurm.domain.slurm_priority import (
    PartitionPriority,
    SlurmPriorityModel,
    build_model,
    parse_qos_dump,
    partition_priorities,
)
from dike_slurm.errors import InputError, SlurmError
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.slurm_options import option_int, parse_show_config

_T = TypeVar("_T")

# The site's priority settings (read at start and on reload): argv after the command's name
SHOW_CONFIG_ARGV = ("show", "config")
SHOW_PARTITIONS_ARGV = ("show", "partition", "-o")
SHOW_QOS_ARGV = ("-nP", "show", "qos", "format=Name,Priority")


def _partition_fields(line: str) -> dict[str, str]:
    """One line of `scontrol show partition -o`: `Key=Value` words, keys lower-case (a word
    without `=` belongs to the value before it)."""
    fields: dict[str, str] = {}
    last = None
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key:
            last = key.lower()
            fields[last] = value
        elif last is not None:
            fields[last] += " " + word
    return fields


def partitions_from_scontrol(
    text: str, source: str = "scontrol show partition -o",
) -> tuple[list[tuple[str, PartitionPriority, dict[str, int]]], int, int]:
    """`scontrol show partition -o`: each partition's priorities and TRES totals (cpu, node,
    gres/gpu), with the cluster's node and CPU counts.

    The counts are those of the nodes in some partition (each node counted once, its CPUs as the
    first partition listing it has per node on average): Slurm's job size factor divides by
    every node of slurm.conf, which no partition line tells.
    """
    partitions: list[tuple[str, PartitionPriority, dict[str, int]]] = []
    cpus_of: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = _partition_fields(line)
        name = fields.get("partitionname")
        if not name:
            raise InputError("a line without PartitionName=", source=source, line=number)
        priority = partition_priorities(fields, source, number)
        total_cpus = option_int(fields.get("totalcpus", "0"), "TotalCPUs", source, number)
        total_nodes = option_int(fields.get("totalnodes", "0"), "TotalNodes", source, number)
        totals = {"cpu": total_cpus, "node": total_nodes, "gres/gpu": 0}
        tres = fields.get("tres", "")
        for item in ("" if tres == "(null)" else tres).split(","):
            tres_name, sep, value = item.strip().partition("=")
            if sep and tres_name.lower() in totals:
                totals[tres_name.lower()] = option_int(value, f"TRES {tres_name}", source, number)
        try:
            members = expand_hostlist(fields.get("nodes", ""))
        except InputError as exc:
            raise InputError(f"Nodes: {exc}", source=source, line=number) from None
        for node in members:
            cpus_of.setdefault(node, total_cpus / total_nodes if total_nodes else 0.0)
        partitions.append((name, priority, totals))
    return partitions, len(cpus_of), int(round(sum(cpus_of.values())))


def qos_from_sacctmgr(text: str, source: str = "sacctmgr -nP show qos format=Name,Priority") -> dict[str, int]:
    """`sacctmgr -nP show qos format=Name,Priority` (no header): QOS name -> Priority."""
    return parse_qos_dump("Name|Priority\n" + text, source)


def uses_slurmdbd(options: Mapping[str, str]) -> bool:
    """Whether the cluster keeps accounting in slurmdbd, where QOS are defined (without it there
    is no QOS table: every job's QOS factor is 0)."""
    return "slurmdbd" in options.get("accountingstoragetype", "")


def read_priority_model(read: Callable[[Sequence[str]], str], command: Callable[[str], str],
                        config_text: str | None = None) -> SlurmPriorityModel:
    """The site's priority from `scontrol show config` (unless its text is given), `scontrol show
    partition -o` and, where the cluster has slurmdbd, `sacctmgr -nP show qos format=Name,Priority`.

    `read(argv)` returns a command's stdout or raises SlurmError naming it; `command(name)` is the
    path of a Slurm command. A text that cannot be read is a SlurmError naming its command.
    """
    def run(name: str, argv: Sequence[str]) -> tuple[str, str]:
        return shlex.join((name, *argv)), read((command(name), *argv))

    def parsed(what: str, parse: Callable[[], _T]) -> _T:
        try:
            return parse()
        except InputError as exc:
            raise SlurmError(f"{what}: cannot read its output: {exc}") from None

    config_name = shlex.join(("scontrol", *SHOW_CONFIG_ARGV))
    if config_text is None:
        config_name, config_text = run("scontrol", SHOW_CONFIG_ARGV)
    options = parse_show_config(config_text)
    partitions_name, partitions_text = run("scontrol", SHOW_PARTITIONS_ARGV)
    partitions, node_count, cluster_cpus = parsed(
        partitions_name, lambda: partitions_from_scontrol(partitions_text, partitions_name))
    qos: dict[str, int] = {}
    sources = [config_name, partitions_name]
    if uses_slurmdbd(options):
        qos_name, qos_text = run("sacctmgr", SHOW_QOS_ARGV)
        qos = parsed(qos_name, lambda: qos_from_sacctmgr(qos_text, qos_name))
        sources.append(qos_name)
    return parsed(config_name, lambda: build_model(options, partitions, node_count, cluster_cpus, qos,
                                                   ", ".join(sources)))
