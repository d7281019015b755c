"""The one policy registry: built-in and third-party policies all come from entry points."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from dike_slurm.errors import RegistryError
from dike_slurm.policies.base import Policy

ENTRY_POINT_GROUP = "dike_slurm.policies"


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point that could not be loaded; reported, never fatal."""

    name: str
    target: str
    error: str


@dataclass
class Registry:
    """Policies by name, plus the plugins that failed to load."""

    policies: dict[str, type[Policy]] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)

    def get(self, name: str) -> type[Policy]:
        try:
            return self.policies[name]
        except KeyError:
            known = ", ".join(sorted(self.policies)) or "none"
            raise RegistryError(f"unknown policy {name!r} (known: {known})") from None

    def create(self, name: str) -> Policy:
        return self.get(name)()

    def names(self) -> list[str]:
        return sorted(self.policies)


def build_registry(points: Iterable[EntryPoint]) -> Registry:
    """Load entry points into a registry; duplicates are an error, failures are recorded."""
    registry = Registry()
    origin: dict[str, str] = {}
    for point in points:
        if point.name in origin:
            if origin[point.name] == point.value:
                continue  # the same distribution seen twice on sys.path
            raise RegistryError(
                f"duplicate policy name {point.name!r}: {origin[point.name]} and {point.value}"
            )
        origin[point.name] = point.value
        try:
            loaded = point.load()
            if not (isinstance(loaded, type) and issubclass(loaded, Policy)):
                raise TypeError(f"{point.value} is not a Policy subclass")
            if loaded.name != point.name:
                raise TypeError(f"entry point {point.name!r} loads a policy named {loaded.name!r}")
        except Exception as exc:  # a broken plugin must not take the engine down
            registry.broken.append(BrokenPlugin(point.name, point.value, f"{type(exc).__name__}: {exc}"))
            continue
        registry.policies[point.name] = loaded
    return registry


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The registry of every installed policy (cached)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = build_registry(entry_points(group=ENTRY_POINT_GROUP))
        if not _DEFAULT.policies:
            raise RegistryError(
                "no policies registered: is dike-slurm installed (pip install -e .)? "
                f"the entry-point group {ENTRY_POINT_GROUP!r} is empty"
            )
    return _DEFAULT
