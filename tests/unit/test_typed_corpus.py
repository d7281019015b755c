"""scripts/typed-corpus (issue 33): the heterogeneous corpus cases, converted from the public OpenB
CSVs (a committed excerpt, tests/fixtures/openb-excerpt) and from a Philly-derived case, read back
as the replay reads them."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dike_slurm.slurm.accounting import read_sacct_parsable2
from dike_slurm.slurm.slurm_conf import parse_slurm_conf
from dike_slurm.sim.kernel.replay import load_input

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "typed-corpus"
EXCERPT = ROOT / "tests" / "fixtures" / "openb-excerpt"
PHILLY = ROOT / "examples" / "corpus" / "philly-b436b2-s3"


def convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def read_case(folder: Path):
    return load_input(folder / "sacct.txt", folder / "slurm.conf", folder / "topology.conf")


def test_openb_pods_become_typed_jobs_on_the_real_node_models(tmp_path):
    out = tmp_path / "openb"
    done = convert("openb", str(EXCERPT), str(out), "--scale", "0.5", "--nodes-per-leaf", "4")
    assert done.returncode == 0, done.stderr
    with (EXCERPT / "openb_node_list_gpu_node.csv").open() as handle:
        real = Counter(row["model"] for row in csv.DictReader(handle))
    with (EXCERPT / "openb_pod_list_gpuspec33.csv").open() as handle:
        pods = list(csv.DictReader(handle))
    conf = parse_slurm_conf((out / "slurm.conf").read_text())
    # every model keeps half its nodes, at least one (A10: 2 -> 1), with its own GPUs per node
    assert Counter(n.gpu_types[0] for n in conf.nodes) == {m: max(1, int(c * 0.5 + 0.5)) for m, c in real.items()}
    assert all(n.features == n.gpu_types for n in conf.nodes)
    replay_input = read_case(out)
    ran = {300000 + int(p["name"].rsplit("-", 1)[1]): p for p in pods if p["num_gpu"] != "0" and p["scheduled_time"]}
    jobs = {j.job_id: j for j in replay_input.trace.jobs}
    assert set(jobs) == set(ran) and replay_input.trace.excluded == {}
    for job_id, pod in ran.items():
        job = jobs[job_id]
        spec = tuple(dict.fromkeys(filter(None, pod["gpu_spec"].split("|"))))
        assert job.gpu_types == tuple(sorted(spec)) or job.gpu_types == spec  # typed GRES, or the constraint's types
        assert job.gpus == int(pod["num_gpu"])  # a fractional pod asks for one whole GPU
        assert job.duration_s == int(pod["deletion_time"]) - int(pod["scheduled_time"])
        assert job.user == f"q{pod['qos']}"
    assert {len(j.gpu_types) for j in jobs.values()} >= {0, 1, 2}  # untyped, one model (GRES) and several (constraint)
    records = read_sacct_parsable2((out / "sacct.txt").read_text(), "sacct.txt").records
    assert any("|" in r.constraints for r in records) and any(r.gpu_types for r in records)
    # arrivals squeezed to the offered load asked for (0.9 by default), on the scaled cluster's GPUs
    gpus = sum(n.gpus for n in conf.nodes)
    span = max(j.submit for j in jobs.values()) - min(j.submit for j in jobs.values())
    offered = sum(j.gpus * j.duration_s for j in jobs.values()) / (gpus * span)
    assert offered == pytest.approx(0.9, rel=0.01)
    assert "'CPU-only pod': 3" in done.stdout and "'never scheduled': 3" in done.stdout


def test_openb_bad_input_is_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "csv"
    bad.mkdir()
    (bad / "openb_node_list_gpu_node.csv").write_text((EXCERPT / "openb_node_list_gpu_node.csv").read_text())
    lines = (EXCERPT / "openb_pod_list_gpuspec33.csv").read_text().splitlines()
    plain = next(i for i, line in enumerate(lines) if ",1,1000,,LS," in line)
    lines[plain] = lines[plain].replace(",1,1000,,LS,", ",1,1000,H100,LS,")
    (bad / "openb_pod_list_gpuspec33.csv").write_text("\n".join(lines) + "\n")
    done = convert("openb", str(bad), str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.strip() == (f"typed-corpus: {bad / 'openb_pod_list_gpuspec33.csv'}:{plain + 1}: gpu_spec names "
                                   "'H100', a model the node list lacks")
    assert not (tmp_path / "out").exists()


def test_philly_jobs_on_two_generations(tmp_path):
    out = tmp_path / "philly"
    done = convert("philly", str(PHILLY), str(out))
    assert done.returncode == 0, done.stderr
    source, typed = read_case(PHILLY), read_case(out)
    assert (out / "topology.conf").read_text() == (PHILLY / "topology.conf").read_text()
    types = {n.name: n.gpu_types for n in typed.conf.nodes}
    assert Counter(types.values()) == {("v100",): 32, ("p100",): 32}
    # the first four leaves' nodes are v100 (the nodes are named after their leaf: phiLLNN)
    assert all(types[name] == (("v100",) if int(name[3:5]) < 4 else ("p100",)) for name in types)
    assert typed.conf.priority_model({}, "slurm.conf").gpu_weight("gpu", ("v100",)) == 2.0
    before = {j.job_id: j for j in source.trace.jobs}
    for job in typed.trace.jobs:
        asked = {0: ("v100",), 1: ("v100",), 2: ("v100",), 3: ("p100",)}.get(job.job_id % 10, ())
        assert job.gpu_types == asked
        assert (job.submit, job.duration_s, job.gpus, job.num_nodes, job.user, job.time_limit_s) == (
            before[job.job_id].submit, before[job.job_id].duration_s, before[job.job_id].gpus,
            before[job.job_id].num_nodes, before[job.job_id].user, before[job.job_id].time_limit_s)
    assert len(typed.trace.jobs) == len(source.trace.jobs) == 2000


def test_the_committed_philly_case_is_the_converters_output(tmp_path):
    out = tmp_path / "philly-b436b2-s3-types"
    assert convert("philly", str(PHILLY), str(out)).returncode == 0
    committed = ROOT / "examples" / "corpus" / "philly-b436b2-s3-types"
    for name in ("sacct.txt", "slurm.conf", "topology.conf"):
        assert (out / name).read_text() == (committed / name).read_text(), name
