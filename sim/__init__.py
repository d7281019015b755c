"""The discrete-event replay simulator (installed as dike_slurm.sim): kernel/ (the simulator and
the replay), tracegen/ (synthetic clusters and workloads), eval/ (reports and evaluation over
replays), sweep/ (grids of replays), backend.py (the live engine's backend over the simulator),
forward.py (the simulator run forward from a live snapshot: the expected starts of queue and explain)."""
