"""The synthetic cluster: its shape and switch tree, and its slurm.conf and topology.conf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from dike_slurm.parsing.hostlists import compress_hostlist
from dike_slurm.domain.slurm_priority import TYPICAL_WEIGHTS


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous GPU cluster and its switch tree.

    Attributes:
        nodes: number of compute nodes.
        gpus_per_node: GPUs in each node (``Gres=gpu:<gpu_type>:<n>``).
        cpus_per_node: ``CPUs=`` of each node.
        real_memory_mb: ``RealMemory=`` of each node, in MB (Slurm's unit).
        gpu_type: GPU type name used in ``Gres`` and typed TRES (``gres/gpu:a100``).
        nodes_per_leaf: nodes under each leaf switch (the last leaf may be partial).
        switch_fanout: children per switch above the leaves.
        switch_levels: total number of switch levels, leaves and top included.
            ``None`` groups by ``switch_fanout`` until a single top switch is
            left.  When given, intermediate levels group by ``switch_fanout``
            and the last level is one top switch over whatever remains.
        node_prefix: node names are ``<prefix><zero-padded index>`` from 1.
        cluster_name: ``ClusterName=``.
        partition: the single partition holding every node.
    """

    nodes: int = 16
    gpus_per_node: int = 8
    cpus_per_node: int = 64
    real_memory_mb: int = 512000
    gpu_type: str = "a100"
    nodes_per_leaf: int = 4
    switch_fanout: int = 4
    switch_levels: int | None = None
    node_prefix: str = "n"
    cluster_name: str = "dike"
    partition: str = "gpu"

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "cpus_per_node", "real_memory_mb",
                     "nodes_per_leaf"):
            if getattr(self, name) < 1:
                raise ValueError(f"ClusterSpec.{name} must be >= 1")
        if self.switch_fanout < 2:
            raise ValueError("ClusterSpec.switch_fanout must be >= 2")
        if self.switch_levels is not None and self.switch_levels < 1:
            raise ValueError("ClusterSpec.switch_levels must be >= 1")
        self.switch_tree()  # validates switch_levels against the fan-out

    # -- convenience constructors -------------------------------------------------
    @classmethod
    def sample(cls) -> "ClusterSpec":
        """The bundled demo cluster: 16 nodes x 8 A100, 4 leaves of 4 nodes."""
        return cls()

    @classmethod
    def benchmark(cls) -> "ClusterSpec":
        """The benchmark cluster: 2,000 nodes x 8 GPUs under 4 switch levels
        (100 leaves of 20 nodes, fan-out 5: 100 -> 20 -> 4 -> 1)."""
        return cls(nodes=2000, nodes_per_leaf=20, switch_fanout=5, switch_levels=4)

    # -- derived quantities ----------------------------------------------------------
    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def n_leaves(self) -> int:
        return -(-self.nodes // self.nodes_per_leaf)

    @property
    def _node_width(self) -> int:
        return max(3, len(str(self.nodes)))

    def node_name(self, index: int) -> str:
        """Name of node ``index`` (0-based)."""
        return f"{self.node_prefix}{index + 1:0{self._node_width}d}"

    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(self.nodes)]

    def node_hostlist(self) -> str:
        """All nodes as one compressed Slurm hostlist (``n[001-016]``)."""
        return compress_hostlist([self.node_name(i) for i in range(self.nodes)])

    def leaf_of(self, node_index: int) -> int:
        return node_index // self.nodes_per_leaf

    def switch_tree(self) -> list[list[tuple[str, list[str]]]]:
        """The switch levels, leaves first: ``[[(switch, children), ...], ...]``.

        Children of a leaf are node names; children of any other switch are
        switch names of the level below.  The last level holds one top switch.
        """
        leaves: list[list[str]] = []
        for first in range(0, self.nodes, self.nodes_per_leaf):
            last = min(first + self.nodes_per_leaf, self.nodes)
            leaves.append([self.node_name(i) for i in range(first, last)])
        groups: list[list[list[str]]] = [leaves]  # children per switch, per level
        counts = [len(leaves)]
        target = self.switch_levels
        while True:
            below = counts[-1]
            level_no = len(counts) + 1  # the level about to be built (1 = leaves)
            if target is None:
                if below == 1:
                    break
            else:
                if len(counts) == target:
                    break
                if below == 1:
                    raise ValueError(
                        f"switch_levels={target} is more than this tree needs: a "
                        f"single switch is reached after {len(counts)} level(s) with "
                        f"fan-out {self.switch_fanout}")
            if target is not None and level_no == target:
                sizes = [below]  # the top switch takes everything left
            else:
                sizes = [min(self.switch_fanout, below - i)
                         for i in range(0, below, self.switch_fanout)]
            counts.append(len(sizes))
            groups.append([[str(j) for j in range(s)] for s in sizes])
        # name the switches level by level
        levels: list[list[tuple[str, list[str]]]] = []
        below_names: list[str] = []
        for lvl, children_per_switch in enumerate(groups):
            prefix = _LEVEL_PREFIXES[lvl] if lvl < len(_LEVEL_PREFIXES) else f"l{lvl + 1}sw"
            width = max(2, len(str(len(children_per_switch))))
            names = [f"{prefix}{k + 1:0{width}d}" for k in range(len(children_per_switch))]
            if lvl == 0:
                level = list(zip(names, children_per_switch))
            else:
                level = []
                pos = 0
                for name, kids in zip(names, children_per_switch):
                    level.append((name, below_names[pos:pos + len(kids)]))
                    pos += len(kids)
            levels.append(level)
            below_names = names
        return levels


_LEVEL_PREFIXES = ("leaf", "spine", "core", "super")


# --------------------------------------------------------------------------- writers


def write_slurm_conf(cluster: ClusterSpec, fh: TextIO) -> None:
    """Write the ``slurm.conf`` fragment describing ``cluster``."""
    c = cluster
    lines = [
        "# slurm.conf fragment for the synthetic cluster "
        f"({c.nodes} nodes x {c.gpus_per_node} {c.gpu_type} GPUs)",
        "# written by dike_slurm.sim.tracegen",
        f"ClusterName={c.cluster_name}",
        "GresTypes=gpu",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "# Slurm's priority: weights ASSUMED typical (dike_slurm.domain.slurm_priority.TYPICAL_WEIGHTS)",
        *TYPICAL_WEIGHTS,
        "TopologyPlugin=topology/tree",
        f"AccountingStorageTRES=gres/gpu,gres/gpu:{c.gpu_type}",
        "JobRequeue=1",
        f"NodeName={c.node_hostlist()} Gres=gpu:{c.gpu_type}:{c.gpus_per_node} "
        f"CPUs={c.cpus_per_node} RealMemory={c.real_memory_mb} State=UNKNOWN",
        f"PartitionName={c.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    fh.write("\n".join(lines) + "\n")


def write_topology_conf(cluster: ClusterSpec, fh: TextIO) -> None:
    """Write ``topology.conf`` (topology/tree) for ``cluster``'s switch tree."""
    levels = cluster.switch_tree()
    fh.write(f"# topology.conf for {cluster.cluster_name}: {len(levels)} switch level(s), "
             f"{cluster.n_leaves} leaf switch(es)\n")
    fh.write("# written by dike_slurm.sim.tracegen\n")
    for lvl, level in enumerate(levels):
        key = "Nodes" if lvl == 0 else "Switches"
        for name, children in level:
            fh.write(f"SwitchName={name} {key}={compress_hostlist(children)}\n")
