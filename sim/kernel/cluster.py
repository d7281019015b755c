"""The simulated cluster: free GPUs and CPUs per node, and Slurm's topology-aware node choice."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dike_slurm.domain.model import Node, Placement, Topology, may_use_gpus
from dike_slurm.slurm.slurm_conf import ClusterConf


class WrongGpuType(RuntimeError):
    """A bug: the simulator started a job on a node without any GPU type the job asked for."""


class SimCluster:
    """Nodes as arrays (index = slurm.conf order) with their leaf switch, partitions and features.

    Nodes that slurm.conf marks DOWN/DRAIN are left out. Nodes outside topology.conf are each
    their own leaf, as `Topology.leaf_of` says.
    """

    def __init__(self, conf: ClusterConf, topology: Topology) -> None:
        nodes = [n for n in conf.nodes if n.available]
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.topology = topology
        self.names: tuple[str, ...] = tuple(n.name for n in nodes)
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.cpus = np.array([n.cpus for n in nodes], dtype=np.int64)
        self.free_gpus = self.gpus.copy()
        self.free_cpus = self.cpus.copy()
        # Leaves in topology.conf order, then the nodes outside the tree (their own leaf).
        leaf_order: dict[str, int] = {leaf: i for i, leaf in enumerate(topology.leaves)}
        leaf_ids = []
        for name in self.names:
            leaf = topology.leaf_of(name)
            leaf_ids.append(leaf_order.setdefault(leaf, len(leaf_order)))
        self.leaf_names: tuple[str, ...] = tuple(leaf_order)
        self.leaf_of = np.array(leaf_ids, dtype=np.int64)
        self.leaf_count = len(leaf_order)
        self.all_nodes = np.ones(len(nodes), dtype=bool)
        self.partition_masks: dict[str, np.ndarray] = {"": self.all_nodes}
        for partition in conf.partitions:
            mask = np.zeros(len(nodes), dtype=bool)
            for name in partition.nodes:
                if name in self.index:
                    mask[self.index[name]] = True
            self.partition_masks[partition.name] = mask
        self.feature_masks: dict[str, np.ndarray] = {}
        self.type_masks: dict[str, np.ndarray] = {}  # GPU type -> the nodes that have it
        for i, node in enumerate(nodes):
            for feature in node.features:
                self.feature_masks.setdefault(feature, np.zeros(len(nodes), dtype=bool))[i] = True
            for gpu_type in node.gpu_types:
                self.type_masks.setdefault(gpu_type, np.zeros(len(nodes), dtype=bool))[i] = True
        self.total_gpus = int(self.gpus.sum())
        self.free_total = self.total_gpus
        widest = int(self.gpus.max()) if nodes else 0
        # nodes_with_free[g]: how many nodes have at least g free GPUs (a quick upper bound).
        self.nodes_with_free = [int(np.count_nonzero(self.gpus >= g)) for g in range(widest + 1)]
        self.max_leaf_gpus = int(np.bincount(self.leaf_of, weights=self.gpus, minlength=self.leaf_count).max()) if nodes else 0

    def __len__(self) -> int:
        return len(self.names)

    # ---------------------------------------------------------------- allocation

    def allocate(self, nodes: Iterable[int], gpus_per_node: int, cpus_per_node: int) -> None:
        counts = self.nodes_with_free
        for n in nodes:
            free = int(self.free_gpus[n])
            for g in range(free - gpus_per_node + 1, free + 1):
                counts[g] -= 1
            self.free_gpus[n] = free - gpus_per_node
            self.free_cpus[n] -= cpus_per_node
            self.free_total -= gpus_per_node

    def release(self, nodes: Iterable[int], gpus_per_node: int, cpus_per_node: int) -> None:
        counts = self.nodes_with_free
        for n in nodes:
            free = int(self.free_gpus[n])
            for g in range(free + 1, free + gpus_per_node + 1):
                counts[g] += 1
            self.free_gpus[n] = free + gpus_per_node
            self.free_cpus[n] += cpus_per_node
            self.free_total += gpus_per_node

    def may_fit(self, gpus_per_node: int, count: int) -> bool:
        """False when fewer than `count` nodes anywhere have `gpus_per_node` free GPUs."""
        counts = self.nodes_with_free
        return gpus_per_node < len(counts) and counts[gpus_per_node] >= count

    # ---------------------------------------------------------------- constraints

    def allowed_mask(self, partition: str, placement: Placement, gpu_types: tuple[str, ...] = ()) -> np.ndarray:
        """Nodes a job may use: its partition, its GPU types (any when none), its Features=, its
        ReqNodeList= and not its ExcNodeList=.

        A feature no node has is ignored, as Slurm rejects such an update.
        """
        mask = self.partition_masks.get(partition, self.all_nodes)
        if gpu_types:
            typed = np.zeros(len(self.names), dtype=bool)
            for gpu_type in gpu_types:
                if gpu_type in self.type_masks:
                    typed |= self.type_masks[gpu_type]
            mask = mask & typed
        if placement.features:
            feature_mask = self._feature_expression(placement.features)
            if feature_mask is not None:
                mask = mask & feature_mask
        if placement.require_nodes:
            required = np.zeros(len(self.names), dtype=bool)
            for name in placement.require_nodes:
                position = self.index.get(name)
                if position is not None:
                    required[position] = True
            mask = mask & required
        if placement.exclude_nodes:
            mask = mask.copy()
            for name in placement.exclude_nodes:
                position = self.index.get(name)
                if position is not None:
                    mask[position] = False
        return mask

    def _feature_expression(self, text: str) -> np.ndarray | None:
        """`a`, `a&b`, `a|b` (Slurm constraint syntax without counts or brackets)."""
        result: np.ndarray | None = None
        for alternative in text.split("|"):
            term: np.ndarray | None = None
            for feature in alternative.split("&"):
                feature_mask = self.feature_masks.get(feature.strip())
                if feature_mask is None:
                    term = None
                    break
                term = feature_mask if term is None else term & feature_mask
            if term is not None:
                result = term if result is None else result | term
        return result

    # ---------------------------------------------------------------- choosing nodes

    def candidates(self, allowed: np.ndarray, gpus_per_node: int, cpus_per_node: int) -> np.ndarray:
        """Nodes that can take the job's per-node share now."""
        return allowed & (self.free_gpus >= gpus_per_node) & (self.free_cpus >= cpus_per_node)

    def choose(self, candidates: np.ndarray, count: int, single_leaf: bool) -> list[int] | None:
        """Slurm 22.05's topology-aware choice (cons_tres `_eval_nodes_topo`) among candidate nodes.

        Of the leaf switches with at least `count` candidate nodes, the one with the fewest (the
        tightest fit; the first in topology order on a tie) gives its first nodes. When no leaf
        holds the job (and it need not stay within one), leaves are used whole, one after the
        other: each time the tightest leaf that holds the rest, else the one with the most
        candidates. Measured on the lab: tests/integration/test_fidelity_lab.py.
        """
        picked = np.flatnonzero(candidates)
        if len(picked) < count:
            return None
        if self.leaf_count == len(self.names):  # no topology: every node its own leaf
            return picked[:count].tolist()
        leaves = self.leaf_of[picked]
        per_leaf = np.bincount(leaves, minlength=self.leaf_count)
        holding = np.flatnonzero(per_leaf >= count)
        if len(holding):
            best = int(holding[np.argmin(per_leaf[holding])])
            return picked[leaves == best][:count].tolist()
        if single_leaf:
            return None
        chosen: list[int] = []
        left = count
        while left > 0:
            holding = np.flatnonzero(per_leaf >= left)
            best = int(holding[np.argmin(per_leaf[holding])]) if len(holding) else int(per_leaf.argmax())
            taken = picked[leaves == best][:left].tolist()
            chosen += taken
            left -= len(taken)
            per_leaf[best] = 0
        return chosen

    def check_gpu_types(self, job: str, gpu_types: Sequence[str], nodes: Iterable[int]) -> None:
        """The invariant, at every start of a typed job: no job runs on a GPU type it did not ask for."""
        for node in nodes:
            template = self.nodes[node]
            if not may_use_gpus(gpu_types, template.gpu_types):
                raise WrongGpuType(
                    f"job {job} asked for GPU types {'|'.join(gpu_types)} and was "
                    f"started on {template.name} ({'|'.join(template.gpu_types) or 'untyped'})")

    def gpu_types_of(self, nodes: Iterable[int]) -> tuple[str, ...]:
        """The GPU types of these nodes, each once, in node order (what a run's AllocTRES shows)."""
        types: list[str] = []
        for node in nodes:
            for gpu_type in self.nodes[node].gpu_types:
                if gpu_type not in types:
                    types.append(gpu_type)
        return tuple(types)

    def leaves_spanned(self, nodes: Iterable[int]) -> int:
        return len({int(self.leaf_of[n]) for n in nodes})

    def fewest_leaves(self, gpus: int) -> int:
        """The fewest leaf switches that could hold this many GPUs (the consolidated span)."""
        if self.max_leaf_gpus <= 0:
            return 1
        return max(1, -(-gpus // self.max_leaf_gpus))
