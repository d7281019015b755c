"""The simulator kernel: the cluster, jobs, Slurm's scheduler, the event loop, and the replay over it."""
