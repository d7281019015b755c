"""Sweeps: a grid of replays (inputs x policy variants x penalties x seeds), one cell per replay.

`dike-slurm sweep` (dike_slurm/cli/sweep_cmd.py) is a thin layer over this package, one module per
concept:

- `spec`: `load_spec` reads a SPEC.toml, `expand` turns it into cells (deterministic order and keys);
- `plan`: `write_plan` writes a sweep folder: plan.json, cells/NNNN.json, the sbatch array script;
- `cell`: `run_cell` runs one cell (what each array task calls) and writes results/NNNN.json by
  write-then-rename, so a partial result is never taken for a finished one; a cell with a result
  of status ok is skipped, so running a cell again is harmless;
- `status`: the cells' states, read from their files (never from Slurm);
- `run`: `run_local` runs the unfinished cells in N local processes, `submit` as a Slurm job array;
- `merge`: combines the finished cells into one JSON, one CSV table and one report, listing failed
  and missing cells with their logs.
"""
