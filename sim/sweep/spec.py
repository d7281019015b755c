"""A sweep's SPEC.toml: read and checked (every error names the file and the key), then expanded
into its cells in a fixed order with a key each (the same key means the same numbers)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dike_slurm.errors import InputError, RegistryError
from dike_slurm.parsing.toml_file import read_toml_file
from dike_slurm.sim.kernel.trace import case_name

if TYPE_CHECKING:
    from dike_slurm.registry import Registry

DEFAULT_MAX_PARALLEL = 32

# Text that goes into #SBATCH lines: sbatch parses those itself, so only plain words are allowed.
_SLURM_WORD = re.compile(r"^[A-Za-z0-9._,:+-]+$")

TOP_KEYS = {"name", "config", "dump", "corpus", "policies", "grid", "variant", "penalties", "seeds",
            "preemptible", "replay", "slurm"}
SLURM_KEYS = {"partition", "account", "qos", "max_parallel", "mem_mb", "time_min", "cpus_per_task", "job_name"}
DUMP_KEYS = {"path", "slurm_conf", "topology", "name", "history"}
VARIANT_KEYS = {"label", "policy", "params"}


@dataclass(frozen=True)
class SweepInput:
    """A dump and the cluster it replays on (absolute paths)."""

    name: str
    dump: str
    slurm_conf: str
    topology: str | None = None
    history: str | None = None  # the earlier dump of a warm start (sim/kernel/warm.py)

    def as_dict(self) -> dict:
        """Its fields; `history` only for a warm start, so that a cold input's cells keep their keys."""
        fields = asdict(self)
        if fields["history"] is None:
            del fields["history"]
        return fields


@dataclass(frozen=True)
class SweepVariant:
    """A policy as the sweep runs it: a label, the registry name, parameter overrides."""

    label: str
    policy: str
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SlurmOptions:
    """How the array is submitted; None: estimated (mem, time) or the cluster's default."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_parallel: int = DEFAULT_MAX_PARALLEL
    mem_mb: int | None = None
    time_min: int | None = None
    cpus_per_task: int = 1
    job_name: str | None = None


@dataclass(frozen=True)
class Spec:
    """A validated SPEC: what the grid holds. `config` is the whole configuration, as data."""

    name: str
    inputs: tuple[SweepInput, ...]
    variants: tuple[SweepVariant, ...]
    penalties: tuple[float, ...]
    seeds: tuple[int, ...]
    preemptible: tuple[float | str, ...]  # shares, or "live" (the engine's opt-in rule)
    config: dict
    slurm: SlurmOptions = SlurmOptions()
    source: str = ""
    preset: dict | None = None  # e.g. {"kind": "tune", ...}: what `merge` adds for it


def share_text(share: float | str) -> str:
    """A cell's preemptible setting as text: a share ("0.5"), or "live" (the engine's opt-in rule)."""
    return share if isinstance(share, str) else f"{share:g}"


@dataclass(frozen=True)
class Cell:
    """One replay of the grid."""

    id: int
    input: SweepInput
    variant: SweepVariant
    comm_penalty: float
    seed: int
    preemptible: float | str

    def description(self) -> dict:
        return {
            "input": self.input.as_dict(),
            "label": self.variant.label,
            "policy": self.variant.policy,
            "params": self.variant.params,
            "comm_penalty": self.comm_penalty,
            "seed": self.seed,
            "preemptible": self.preemptible,
        }

    def key(self, config_sha: str) -> str:
        """What the cell computes, hashed: the same key means the same numbers."""
        return content_sha({"cell": self.description(), "config": config_sha})[:16]


def content_sha(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def load_spec(path: Path) -> Spec:
    """Read and check a SPEC.toml; every error names the file and the key."""
    return spec_from_data(read_toml_file(path), base=path.resolve().parent, source=str(path))


def _fail(source: str, key: str, message: str) -> InputError:
    return InputError(f"{key}: {message}", source=source)


def _str_list(data: dict, key: str, source: str) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, key, "expected a list of names or paths")
    return value


def _number_list(data: dict, key: str, source: str, *, integer: bool = False) -> list | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    kinds = (int,) if integer else (int, float)
    if not value or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in value):
        raise _fail(source, key, f"expected a non-empty list of {'integers' if integer else 'numbers'}")
    if not integer and any(not math.isfinite(v) or v < 0 for v in value):
        raise _fail(source, key, "values must be finite and >= 0")
    return list(dict.fromkeys(int(v) if integer else float(v) for v in value))


def _path(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def spec_from_data(data: dict, *, base: Path, source: str) -> Spec:
    """The checks of load_spec on already parsed TOML (paths relative to `base`)."""
    from dike_slurm.config import ReplaySettings, load_config
    from dike_slurm.errors import ConfigError
    from dike_slurm.registry import default_registry
    from pydantic import ValidationError

    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0], f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = data.get("name", Path(source).stem or "sweep")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise _fail(source, "name", "letters, digits, '.', '_' or '-' (at most 64)")

    # The configuration: the named file (never $DIKE_CONFIG nor DIKE_* variables: the SPEC alone
    # decides), with the SPEC's [replay] table on top.
    config_path = None
    if "config" in data:
        if not isinstance(data["config"], str):
            raise _fail(source, "config", "expected a path")
        config_path = _path(base, data["config"])
    replay = data.get("replay", {})
    if not isinstance(replay, dict):
        raise _fail(source, "replay", "expected a table")
    try:
        ReplaySettings.model_validate(replay)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(["replay", *(str(p) for p in error["loc"])])
        raise _fail(source, key, "unknown key" if error["type"] == "extra_forbidden" else error["msg"]) from None
    try:
        config = load_config(config_path, environ={}, overrides={"replay": replay})
    except ConfigError as exc:
        raise _fail(source, "config", str(exc)) from None

    inputs = _inputs(data, base, source)
    registry = default_registry()
    policies = _str_list(data, "policies", source)
    variants = _variants(data, policies, registry, source)

    penalties = _number_list(data, "penalties", source) or [config.replay.comm_penalty]
    seeds = _number_list(data, "seeds", source, integer=True) or [config.replay.seed]
    preemptible: list = _number_list(data, "preemptible", source) or [config.replay.preemptible]  # or "live"
    if any(p != "live" and p > 1 for p in preemptible):
        raise _fail(source, "preemptible", "shares must be between 0 and 1")
    return Spec(
        name=name, inputs=tuple(inputs), variants=tuple(variants), penalties=tuple(penalties),
        seeds=tuple(seeds), preemptible=tuple(preemptible), config=config.model_dump(mode="json"),
        slurm=_slurm_options(data.get("slurm", {}), source), source=source,
    )


def _variants(data: dict, policies: list[str], registry: Registry, source: str) -> list[SweepVariant]:
    """The policies' variants (a [grid.POLICY]'s product, else the policy as configured), then each
    [[variant]]; at least one, each label once."""
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise _fail(source, "grid", "expected a table of policies, e.g. [grid.dike]")
    variants: list[SweepVariant] = []
    for policy in dict.fromkeys(policies):
        try:
            params_model = registry.get(policy).Params
        except RegistryError as exc:
            raise _fail(source, "policies", str(exc)) from None
        if policy in grid:
            variants.extend(_grid_variants(policy, grid[policy], params_model, source))
        else:
            variants.append(SweepVariant(policy, policy, {}))
    for policy in grid:
        if policy not in policies:
            raise _fail(source, f"grid.{policy}", f"{policy!r} is not in policies")
    for where, raw in _tables(data, "variant", VARIANT_KEYS, source, "expected [[variant]] tables"):
        variants.append(_listed_variant(where, raw, registry, source))
    if not variants:
        raise _fail(source, "policies", "give at least one policy (or a [[variant]])")
    seen: set[str] = set()
    for variant in variants:
        if variant.label in seen:
            raise _fail(source, "variant", f"two variants are labelled {variant.label!r}")
        seen.add(variant.label)
    return variants


def _listed_variant(where: str, raw: dict, registry: Registry, source: str) -> SweepVariant:
    """One [[variant]]: a known policy, its parameters among the policy's, a label."""
    policy, params = raw.get("policy"), raw.get("params", {})
    if not isinstance(policy, str):
        raise _fail(source, f"{where}.policy", "expected a policy name")
    try:
        params_model = registry.get(policy).Params
    except RegistryError as exc:
        raise _fail(source, f"{where}.policy", str(exc)) from None
    if not isinstance(params, dict):
        raise _fail(source, f"{where}.params", "expected a table of parameters")
    for key in params:
        if key not in params_model.model_fields:
            raise _fail(source, f"{where}.params.{key}", f"policy {policy} has no parameter {key!r}")
    label = raw.get("label", policy)
    if not isinstance(label, str) or not label.strip():
        raise _fail(source, f"{where}.label", "expected a non-empty text")
    return SweepVariant(label, policy, dict(params))


def _tables(data: dict, name: str, keys: set[str], source: str, expected: str) -> Iterator[tuple[str, dict]]:
    """The SPEC's [[name]] tables as (`name[i]`, table); a non-list, a non-table or an unknown key
    is an error naming the key."""
    tables = data.get(name, [])
    if not isinstance(tables, list):
        raise _fail(source, name, expected)
    for index, raw in enumerate(tables):
        where = f"{name}[{index}]"
        if not isinstance(raw, dict):
            raise _fail(source, where, "expected a table")
        extra = sorted(set(raw) - keys)
        if extra:
            raise _fail(source, f"{where}.{extra[0]}", f"unknown key (known: {', '.join(sorted(keys))})")
        yield where, raw


def _inputs(data: dict, base: Path, source: str) -> list[SweepInput]:
    from dike_slurm.sim.eval.evaluate import case_history, find_cases

    inputs: list[SweepInput] = []
    for where, raw in _tables(data, "dump", DUMP_KEYS, source,
                              "expected [[dump]] tables (path, slurm_conf, topology, history, name)"):
        paths = {}
        for key in ("path", "slurm_conf", "topology", "history"):
            if key not in raw:
                if key in ("topology", "history"):
                    continue
                raise _fail(source, f"{where}.{key}", "missing")
            if not isinstance(raw[key], str):
                raise _fail(source, f"{where}.{key}", "expected a path")
            paths[key] = _path(base, raw[key])
            if not paths[key].is_file():
                raise _fail(source, f"{where}.{key}", f"no such file: {paths[key]}")
        name = raw.get("name", case_name(paths["path"]))
        if not isinstance(name, str) or not name:
            raise _fail(source, f"{where}.name", "expected a non-empty text")
        topology, history = paths.get("topology"), paths.get("history")
        inputs.append(SweepInput(name, str(paths["path"]), str(paths["slurm_conf"]), str(topology) if topology else None,
                                 str(history) if history else None))
    folders = _str_list(data, "corpus", source)
    if folders:
        try:
            cases = find_cases([_path(base, folder) for folder in folders])
        except InputError as exc:
            raise _fail(source, "corpus", str(exc)) from None
        for case in cases:
            folder = case.folder.resolve()
            history = case_history(folder)
            inputs.append(SweepInput(case.name, str(folder / "sacct.txt"), str(folder / "slurm.conf"),
                                     str(folder / "topology.conf"), str(history) if history else None))
    if not inputs:
        raise _fail(source, "dump", "give at least one [[dump]] or a corpus folder")
    names = [i.name for i in inputs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _fail(source, "dump", f"two inputs are named {duplicate!r} (set dump.name)")
    return inputs


def _grid_variants(policy: str, axes: Any, params_model: Any, source: str) -> list[SweepVariant]:
    """One variant per combination of the axes, in the order the keys are written."""
    where = f"grid.{policy}"
    if not isinstance(axes, dict) or not axes:
        raise _fail(source, where, "expected a table of parameter lists")
    for key, values in axes.items():
        if key not in params_model.model_fields:
            raise _fail(source, f"{where}.{key}", f"policy {policy} has no parameter {key!r}")
        if not isinstance(values, list) or not values:
            raise _fail(source, f"{where}.{key}", "expected a non-empty list of values (one per grid point)")
    combinations: list[dict] = [{}]
    for key, values in axes.items():
        combinations = [{**combo, key: value} for combo in combinations for value in values]
    return [
        SweepVariant(f"{policy} " + ",".join(f"{k}={_canonical(v)}" for k, v in combo.items()), policy, combo)
        for combo in combinations
    ]


def _slurm_options(raw: Any, source: str) -> SlurmOptions:
    if not isinstance(raw, dict):
        raise _fail(source, "slurm", "expected a table")
    extra = sorted(set(raw) - SLURM_KEYS)
    if extra:
        raise _fail(source, f"slurm.{extra[0]}", f"unknown key (known: {', '.join(sorted(SLURM_KEYS))})")
    values: dict[str, Any] = {}
    for key in ("partition", "account", "qos", "job_name"):
        if key in raw:
            if not isinstance(raw[key], str) or not _SLURM_WORD.match(raw[key]):
                raise _fail(source, f"slurm.{key}", "letters, digits and . _ , : + - only")
            values[key] = raw[key]
    for key in ("max_parallel", "mem_mb", "time_min", "cpus_per_task"):
        if key in raw:
            if not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 1:
                raise _fail(source, f"slurm.{key}", "expected an integer >= 1")
            values[key] = raw[key]
    return SlurmOptions(**values)


def expand(spec: Spec) -> list[Cell]:
    """The grid in a fixed order: input, then variant, then penalty, then seed, then preemptible."""
    cells = []
    for sweep_input in spec.inputs:
        for variant in spec.variants:
            for penalty in spec.penalties:
                for seed in spec.seeds:
                    for share in spec.preemptible:
                        cells.append(Cell(len(cells), sweep_input, variant, penalty, seed, share))
    return cells
