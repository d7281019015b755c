"""The package's layers (tests/unit/layers.toml) hold: no import circle, no import up a layer;
the core (dike_slurm/ minus the command line) imports nothing from the simulator (sim/); the
policies import nothing from one another, only the shared stages and building blocks."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import circles, import_graph, imports_of, layer_of, load_layers, package_modules, upward_imports

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
    assert sim_imports("import dike_slurm.sim.kernel.simulator as s\n")
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


def test_the_package_has_no_import_circle():
    """No module imports, at any depth (in a function, under TYPE_CHECKING), one that imports it
    back through any chain."""
    assert circles(import_graph()) == []


def test_no_import_runs_up_a_layer():
    """The layers of tests/unit/layers.toml, lowest first: an import names the importer's layer or
    a lower one."""
    assert upward_imports(import_graph(), load_layers()) == []


def test_every_module_has_a_layer():
    layers = load_layers()
    assert [name for name, _ in layers][:2] == ["base", "domain"]
    assert {"domain", "slurm", "store", "cycle", "ops", "cli", "sim", "sim.eval"} <= {name for name, _ in layers}
    unplaced = [module for module in package_modules() if module != "dike_slurm" and layer_of(module, layers) is None]
    assert unplaced == []


def test_the_graph_checks_find_a_circle_and_an_upward_import():
    modules = {"dike_slurm.domain.model", "dike_slurm.cycle.engine", "dike_slurm.cli", "dike_slurm.cli.group"}
    sources = {
        "dike_slurm.domain.model": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dike_slurm.cycle.engine import Engine\n",
        "dike_slurm.cycle.engine": "def f():\n    from dike_slurm.domain import model\n",
        "dike_slurm.cli": "from . import group\n",
        "dike_slurm.cli.group": "import dike_slurm.cli\n",
    }
    edges = [edge for name, source in sources.items()
             for edge in imports_of(name, source, modules, package=name == "dike_slurm.cli")]
    assert {(e.importer, e.imported) for e in edges} == {
        ("dike_slurm.domain.model", "dike_slurm.cycle.engine"), ("dike_slurm.cycle.engine", "dike_slurm.domain.model"),
        ("dike_slurm.cli", "dike_slurm.cli.group"), ("dike_slurm.cli.group", "dike_slurm.cli")}
    assert circles(edges) == [["dike_slurm.cli", "dike_slurm.cli.group"], ["dike_slurm.cycle.engine", "dike_slurm.domain.model"]]
    layers = [("domain", ("dike_slurm.domain.model",)), ("cycle", ("dike_slurm.cycle.engine",)), ("cli", ("dike_slurm.cli",))]
    assert layer_of("dike_slurm.cli.group", layers) == 2
    assert upward_imports(edges, layers) == ["dike_slurm.domain.model (domain) -> dike_slurm.cycle.engine (cycle), line 3"]


def test_the_core_keeps_few_modules_at_its_top():
    """dike_slurm/ is grouped by concept: one sub-package per layer (domain, slurm, store, cycle,
    ops, cli), with only what every layer shares and the policy layer's configuration and registry
    left at its top (docs/architecture.md, "Layers")."""
    top = sorted(path.name for path in CORE.glob("*.py"))
    assert len(top) <= 8, top
    assert {path.name for path in CORE.iterdir() if (path / "__init__.py").is_file()} >= {
        "domain", "slurm", "store", "cycle", "ops", "cli"}


LONGEST_FUNCTION = 80  # lines, decorators and signature included


def long_functions(source: str) -> list[tuple[str, int]]:
    """The functions of `source` longer than LONGEST_FUNCTION lines, with their lengths."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]


def test_no_function_in_the_core_the_policies_or_the_simulator_is_over_80_lines():
    too_long = [(str(path.relative_to(CORE.parent)), name, lines)
                for folder in (CORE, POLICIES, CORE.parent / "sim") for path in sorted(folder.rglob("*.py"))
                for name, lines in long_functions(path.read_text(encoding="utf-8"))]
    assert too_long == []
    assert long_functions("def f():\n" + "    x = 1\n" * LONGEST_FUNCTION) == [("f", LONGEST_FUNCTION + 1)]
