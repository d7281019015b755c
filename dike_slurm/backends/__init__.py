"""Backends: how the engine reaches a cluster (Slurm commands, pyslurm, or the replay simulator)."""

from __future__ import annotations

from dike_slurm.backends.base import Backend
from dike_slurm.config import Config


def open_backend(config: Config) -> Backend:
    """The backend `slurm.backend` names; pyslurm and the simulator are imported only when chosen."""
    kind = config.slurm.backend
    if kind == "pyslurm":
        from dike_slurm.backends.pyslurm import PyslurmBackend

        return PyslurmBackend.create(config.slurm)
    if kind == "simulated":
        from dike_slurm.backends.simulated import SimulatedBackend

        return SimulatedBackend.from_config(config)
    from dike_slurm.backends.cli import SlurmCliBackend

    return SlurmCliBackend(config.slurm)
