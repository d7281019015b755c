"""Reading and writing Slurm: accounting dumps, usage, slurm.conf, the JSON formats, the backends."""
