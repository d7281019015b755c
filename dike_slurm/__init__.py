"""dike-slurm: the Dike scheduling policy for Slurm GPU clusters."""

__version__ = "0.1.0"
