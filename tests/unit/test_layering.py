"""The core (dike_slurm/ minus the command line) imports nothing from the simulator (sim/)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "dike_slurm"
SIM_MODULES = ("dike_slurm.sim", "sim")


def sim_imports(source: str) -> list[str]:
    """The modules of dike_slurm.sim that `source` imports, at any depth (also inside functions)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "dike_slurm" else [f"dike_slurm.{a.name}" for a in node.names]
        else:
            continue
        found += [name for name in names if any(name == m or name.startswith(m + ".") for m in SIM_MODULES)]
    return found


def core_modules() -> list[Path]:
    return [path for path in sorted(CORE.rglob("*.py")) if "cli" not in path.relative_to(CORE).parts]


def test_the_core_imports_nothing_from_the_simulator():
    offenders = {
        str(path.relative_to(CORE.parent)): found
        for path in core_modules()
        if (found := sim_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_check_finds_every_form_of_import():
    assert len(core_modules()) > 10
    assert sim_imports("def f():\n    from dike_slurm.sim.backend import SimulatedBackend\n")
    assert sim_imports("import dike_slurm.sim.simulator as s\n")
    assert sim_imports("from dike_slurm import sim\n")
    assert sim_imports("from sim.replay import run_policy\n")
    assert not sim_imports("from dike_slurm.simple import x\nimport simplejson\n")
