"""The package's imports as a graph, read from the source: circles and imports up a layer.

Every import counts, at any depth: inside functions and under TYPE_CHECKING too. The package maps
dike_slurm.policies to policies/ and dike_slurm.sim to sim/ (setup.cfg). Run it to print what it
finds: `python tests/unit/import_graph.py`.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"dike_slurm": ROOT / "dike_slurm", "dike_slurm.policies": ROOT / "policies", "dike_slurm.sim": ROOT / "sim"}
LAYERS_FILE = Path(__file__).with_name("layers.toml")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def package_modules(folders: dict[str, Path] = FOLDERS) -> dict[str, Path]:
    """Every module of the package by its import name (a package by its own name)."""
    modules = {}
    for prefix, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((prefix, *parts))] = path
    return modules


def imports_of(name: str, source: str, modules: dict[str, Path] | set[str], package: bool = False) -> list[Import]:
    """The package modules `source` (module `name`) imports: a name imported from a package is
    the module of that name where there is one, else the package."""
    base = name.split(".") if package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join([*base[:len(base) - node.level + 1], *([module] if module else [])])
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and Import(name, target, node.lineno) not in found:
                found.append(Import(name, target, node.lineno))
    return found


def import_graph(modules: dict[str, Path] | None = None) -> list[Import]:
    modules = package_modules() if modules is None else modules
    return [found for name, path in modules.items()
            for found in imports_of(name, path.read_text(encoding="utf-8"), modules, path.name == "__init__.py")]


def circles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, []).append(edge.imported)
        graph.setdefault(edge.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(graph[successor])))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def load_layers(path: Path = LAYERS_FILE) -> list[tuple[str, tuple[str, ...]]]:
    """(layer name, its entries), lowest first."""
    document = tomllib.loads(path.read_text(encoding="utf-8"))
    return [(layer["name"], tuple(layer["modules"])) for layer in document["layer"]]


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """The index of the layer whose longest entry names `module` (None: no entry does)."""
    matches = [(len(entry), index) for index, (_, entries) in enumerate(layers) for entry in entries
               if module == entry or module.startswith(entry + ".")]
    return max(matches)[1] if matches else None


def upward_imports(edges: list[Import], layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Each import of a module of a higher layer, as 'importer (layer) -> imported (layer), line N'."""
    found = []
    for edge in edges:
        low, high = layer_of(edge.importer, layers), layer_of(edge.imported, layers)
        if low is not None and high is not None and high > low:
            found.append(f"{edge.importer} ({layers[low][0]}) -> {edge.imported} ({layers[high][0]}), "
                         f"line {edge.line}")
    return found


def main() -> int:
    modules = package_modules()
    edges = import_graph(modules)
    layers = load_layers()
    found = circles(edges)
    upward = upward_imports(edges, layers)
    unplaced = sorted(m for m in modules if m != "dike_slurm" and layer_of(m, layers) is None)
    print(f"{len(modules)} modules, {len({(e.importer, e.imported) for e in edges})} imports")
    print(f"{len(found)} circles, {sum(map(len, found))} modules in them")
    for component in found:
        print("  circle: " + " ".join(component))
    print(f"{len(upward)} imports up a layer")
    for line in upward:
        print("  " + line)
    for module in unplaced:
        print(f"  no layer: {module}")
    return 1 if found or upward or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
