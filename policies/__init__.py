"""The policy plugins shipped with dike-slurm (installed as dike_slurm.policies)."""
