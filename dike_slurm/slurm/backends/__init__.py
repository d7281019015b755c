"""Backends: how the engine reaches a cluster (Slurm commands, pyslurm, or the replay simulator)."""

from __future__ import annotations

from importlib.metadata import entry_points

from dike_slurm.config import Config
from dike_slurm.errors import ConfigError
from dike_slurm.slurm.backends.base import Backend

# Backends outside the core (the simulated cluster lives in dike_slurm.sim), by name.
ENTRY_POINT_GROUP = "dike_slurm.backends"


def open_backend(config: Config) -> Backend:
    """The backend `slurm.backend` names; pyslurm and the simulator are imported only when chosen."""
    kind = config.slurm.backend
    if kind == "pyslurm":
        from dike_slurm.slurm.backends.pyslurm import PyslurmBackend

        return PyslurmBackend.create(config.slurm)
    if kind == "cli":
        from dike_slurm.slurm.backends.cli import SlurmCliBackend

        return SlurmCliBackend(config.slurm)
    points = entry_points(group=ENTRY_POINT_GROUP, name=kind)
    if not points:
        raise ConfigError(
            f"slurm.backend = {kind!r} is not installed (no entry point {kind!r} in the group "
            f"{ENTRY_POINT_GROUP!r}; reinstall dike-slurm: pip install -e .)"
        )
    return next(iter(points)).load().from_config(config)
