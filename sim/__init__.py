"""The discrete-event replay simulator (installed as dike_slurm.sim)."""
