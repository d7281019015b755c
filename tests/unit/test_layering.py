"""The core (dike_slurm/ minus the command line) imports nothing from the simulator (sim/); the
policies import nothing from one another, only the shared stages and building blocks."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "dike_slurm"
SIM_MODULES = ("dike_slurm.sim", "sim")
POLICIES = CORE.parent / "policies"
# what a policy may import of policies/: the policy base, the stages and the shared building blocks
SHARED = {"base", "stages", "common", "levels", "preemption", "node_hold"}


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


def policy_imports(source: str) -> set[str]:
    """The modules of dike_slurm.policies that `source` imports (their last name), at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "dike_slurm.policies"
                     else [node.module])
        else:
            continue
        found |= {name.rsplit(".", 1)[1] for name in names if name.startswith("dike_slurm.policies.")}
    return found


def test_the_policies_import_nothing_from_one_another():
    """Dike, Tiresias, the SRTF oracle and FIFO share the preemption stage and the building blocks
    (policies/stages.py, preemption.py, ...), never one another's module; none checks the class of
    its parameters at run time (Policy[P] types them)."""
    policies = [path for path in sorted(POLICIES.glob("*.py")) if path.stem not in SHARED | {"__init__"}]
    assert {path.stem for path in policies} >= {"dike", "tiresias", "srtf_oracle", "fifo", "multifactor"}
    offenders = {path.stem: found for path in policies
                 if (found := policy_imports(path.read_text(encoding="utf-8")) - SHARED)}
    assert offenders == {}
    checks = [path.name for path in sorted(POLICIES.glob("*.py"))
              if "isinstance(params" in path.read_text(encoding="utf-8")
              or "getattr(params" in path.read_text(encoding="utf-8")]
    assert checks == []


def test_the_policy_import_check_finds_every_form():
    assert policy_imports("from dike_slurm.policies.dike import levels_with_promotion\n") == {"dike"}
    assert policy_imports("def f():\n    import dike_slurm.policies.fifo as f\n") == {"fifo"}
    assert policy_imports("from dike_slurm.policies import tiresias\n") == {"tiresias"}
    assert policy_imports("from dike_slurm.policy_util import x\nimport policies\n") == set()
