"""Slurm TRES strings: `billing=8,cpu=8,gres/gpu=4,gres/gpu:a100=4,mem=32G,node=1`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dike_slurm.errors import InputError

_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024**3}


@dataclass(frozen=True)
class Tres:
    """The parts of a TRES string the engine uses."""

    cpus: int = 0
    mem_mb: int = 0
    nodes: int = 0
    gpus: int = 0
    gpu_types: tuple[tuple[str, int], ...] = ()  # (type, count), e.g. (("a100", 4),)


@functools.lru_cache(maxsize=4096)  # a queue repeats a few dozen distinct strings across 50k jobs
def parse_tres(text: str) -> Tres:
    """Parse a TRES string; the typeless `gres/gpu` count wins, typed counts are summed otherwise."""
    raw = (text or "").strip()
    if not raw:
        return Tres()
    cpus = mem = nodes = 0
    untyped: int | None = None
    typed: dict[str, int] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"TRES item without '=': {item!r} in {text!r}")
        name = key.strip()
        key = name.lower()
        value = value.strip()
        if key == "mem":
            mem = _parse_mem(value, text)
            continue
        if key in ("cpu", "node") or key.startswith("gres/gpu"):
            count = _parse_count(value, item, text)
            if key == "cpu":
                cpus = count
            elif key == "node":
                nodes = count
            elif key == "gres/gpu":
                untyped = count
            elif key.startswith("gres/gpu:"):
                typed[name.split(":", 1)[1]] = count  # a type as the site spells it, as Gres= and squeue keep it
    gpus = untyped if untyped is not None else sum(typed.values())
    return Tres(cpus=cpus, mem_mb=mem, nodes=nodes, gpus=gpus, gpu_types=tuple(sorted(typed.items())))


def _parse_count(value: str, item: str, text: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise InputError(f"TRES count is not an integer: {item!r} in {text!r}") from None
    if count < 0:
        raise InputError(f"negative TRES count: {item!r} in {text!r}")
    return count


def _parse_mem(value: str, text: str) -> int:
    if not value:
        raise InputError(f"empty mem in TRES {text!r}")
    unit = value[-1].upper()
    number = value[:-1] if unit in _MEM_UNITS else value
    factor = _MEM_UNITS.get(unit, 1)
    try:
        return int(float(number) * factor)
    except ValueError:
        raise InputError(f"bad mem value {value!r} in TRES {text!r}") from None


def _gres_items(text: str):
    """(name, rest) of each item of a Gres / tres_per_node string: `gres/gpu:a100=8(S:0-1)` -> ("gpu", "a100:8")."""
    for item in (text or "").split(","):
        item = item.strip()
        if item.startswith("gres/"):
            item = item[len("gres/"):]
        if item.startswith("gres:"):
            item = item[len("gres:"):]
        name, _, rest = item.split("(", 1)[0].replace("=", ":").partition(":")
        yield name, rest


@functools.lru_cache(maxsize=4096)
def parse_gres_gpus(text: str) -> int:
    """GPUs in a Gres / tres_per_node string: `gpu:a100:8`, `gpu:8`, `gres/gpu:4`, `gpu:a100:8(S:0-1)`."""
    total = 0
    for name, rest in _gres_items(text):
        if name != "gpu":
            continue
        if not rest:
            total += 1
            continue
        last = rest.rsplit(":", 1)[-1]
        if last.isdigit():
            total += int(last)
        else:
            total += 1  # gpu:a100 with no count means one
    return total


@functools.lru_cache(maxsize=4096)
def parse_gres_gpu_types(text: str) -> tuple[str, ...]:
    """GPU types a Gres / tres_per_node string names, in order, once each: `gpu:a100:8` -> ("a100",).

    `gpu:8` and `gres/gpu:8` name no type (); `gpu:a100` (a count of one) names a100. Other GRES
    (`mps:100`) and socket suffixes (`(S:0-1)`, `(IDX:0-5)`) are ignored.
    """
    types: list[str] = []
    for name, rest in _gres_items(text):
        if name != "gpu" or not rest:
            continue
        head, _, last = rest.rpartition(":")
        gpu_type = head if last.isdigit() else rest
        if gpu_type and not gpu_type.isdigit() and gpu_type not in types:
            types.append(gpu_type)
    return tuple(types)


def requested_gpu_types(per_job: str, per_node: str) -> tuple[str, ...]:
    """The GPU types a job's GRES request names (squeue's tres_per_job, else tres_per_node); () for
    any type. Never the allocation: Slurm types an untyped job's (gres/gpu:a100=2 on an a100 node)."""
    return parse_gres_gpu_types(per_job) or parse_gres_gpu_types(per_node)


def tracks_gpus(accounting_storage_tres: str) -> bool:
    """Whether slurm.conf's AccountingStorageTRES (`gres/gpu,cpu,...`) tracks GPUs. Without it sacct
    records runs without GPUs and pyslurm 25.11 gives jobs and nodes none: doctor and the pyslurm
    backend ask this one question."""
    return "gres/gpu" in {item.strip().lower() for item in accounting_storage_tres.split(",")}
