"""The policy registry: entry points for built-ins and third-party plugins alike."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from dike_slurm.errors import RegistryError
from dike_slurm.registry import ENTRY_POINT_GROUP, build_registry, default_registry

BUILT_INS = {"fifo", "multifactor", "tiresias", "srtf_oracle", "dike"}


def test_built_ins_come_from_entry_points():
    registry = default_registry()
    assert BUILT_INS <= set(registry.names())
    assert registry.get("dike").name == "dike"
    with pytest.raises(RegistryError, match="unknown policy 'nope'"):
        registry.get("nope")


def test_duplicate_names_are_an_error():
    points = [
        EntryPoint("fifo", "dike_slurm.policies.fifo:FifoPolicy", ENTRY_POINT_GROUP),
        EntryPoint("fifo", "dike_slurm.policies.dike:DikePolicy", ENTRY_POINT_GROUP),
    ]
    with pytest.raises(RegistryError, match="duplicate policy name 'fifo'"):
        build_registry(points)


def test_broken_plugin_is_reported_not_fatal():
    points = [
        EntryPoint("fifo", "dike_slurm.policies.fifo:FifoPolicy", ENTRY_POINT_GROUP),
        EntryPoint("ghost", "no_such_module_xyz:Policy", ENTRY_POINT_GROUP),
        EntryPoint("wrong", "dike_slurm.policies.dike:DikeParams", ENTRY_POINT_GROUP),
    ]
    registry = build_registry(points)
    assert registry.names() == ["fifo"]
    assert {b.name for b in registry.broken} == {"ghost", "wrong"}
    assert "ModuleNotFoundError" in next(b.error for b in registry.broken if b.name == "ghost")


PLUGIN = '''
import random
from dike_slurm.domain.decisions import Decisions, SetPriority
from dike_slurm.policies.base import Policy, PolicyParams


class LongestFirstParams(PolicyParams):
    boost: float = 1.0


class LongestFirst(Policy):
    name = "longest_first"
    description = "Third-party test policy: most GPUs first."
    Params = LongestFirstParams

    def decide(self, snapshot, params, rng):
        return Decisions(tuple(SetPriority(j.job_id, 0, j.gpus * params.boost, "size") for j in snapshot.pending))
'''


def _install_plugin(root: Path, entry_points: str) -> dict[str, str]:
    """A real distribution on disk (dist-info with entry_points.txt), found through PYTHONPATH."""
    (root / "acme_policy.py").write_text(PLUGIN)
    info = root / "acme_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-policy\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    return env


def test_third_party_policy_is_listed_by_the_cli(tmp_path):
    env = _install_plugin(tmp_path, f"[{ENTRY_POINT_GROUP}]\nlongest_first = acme_policy:LongestFirst\n")
    # a new interpreter: entry points are read from PYTHONPATH's plugin at start, and the registry is loaded once
    result = subprocess.run(
        [sys.executable, "-m", "dike_slurm", "policies"], env={**env, "COLUMNS": "200"},
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for name in BUILT_INS | {"longest_first"}:
        assert name in result.stdout
    assert "boost = 1.0" in result.stdout


def test_broken_third_party_plugin_is_a_warning(tmp_path):
    env = _install_plugin(tmp_path, f"[{ENTRY_POINT_GROUP}]\nbroken = acme_policy:DoesNotExist\n")
    # a new interpreter: entry points are read from PYTHONPATH's plugin at start, and the registry is loaded once
    result = subprocess.run(
        [sys.executable, "-m", "dike_slurm", "policies"], env={**env, "COLUMNS": "200"},
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 0
    assert "policy plugin 'broken'" in result.stderr and "failed to load" in result.stderr
    assert "dike" in result.stdout


def test_third_party_plugin_clashing_with_a_built_in_is_refused(tmp_path):
    env = _install_plugin(tmp_path, f"[{ENTRY_POINT_GROUP}]\nfifo = acme_policy:LongestFirst\n")
    # a new interpreter: entry points are read from PYTHONPATH's plugin at start, and the registry is loaded once
    result = subprocess.run(
        [sys.executable, "-m", "dike_slurm", "policies"], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 1
    assert "duplicate policy name 'fifo'" in result.stderr
    assert "Traceback" not in result.stderr
