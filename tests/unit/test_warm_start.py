"""The replay's warm start (sim/kernel/warm.py): a window replayed with its history makes the same
decisions as the replay of history and window together, from the window's start on."""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path

import in_process
import pytest

from dike_slurm.domain.model import Topology
from dike_slurm.registry import default_registry
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.records import JobResult, SimSettings, Timeline
from dike_slurm.sim.kernel.simulator import Simulator
from dike_slurm.sim.kernel.trace import TraceJob
from dike_slurm.sim.kernel.warm import ENDED_AFTER, IN_WINDOW, History, PastJob, PastRun
from dike_slurm.slurm.slurm_conf import parse_slurm_conf

# Slurm's multifactor with fair share on, so that Slurm's own usage is seeded too.
CLUSTER = (
    "NodeName=n[1-4] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-4] Default=YES\n"
    "PriorityType=priority/multifactor\nPriorityWeightFairshare=10000\nPriorityWeightAge=1000\n"
    "PriorityMaxAge=7-0\nPriorityDecayHalfLife=7-0\n"
)
WEEK = 7 * 86400.0
ROOT = Path(__file__).resolve().parents[2]


def _jobs(rng: random.Random, first_id: int, count: int, first_submit: float, gap_s: float) -> list[TraceJob]:
    """Invented: six users whose job names say how long they run (train.sh hours, eval.sh minutes),
    so that the service prior has something to learn; the first job is submitted at `first_submit`."""
    jobs, now = [], first_submit
    for i in range(count):
        long = rng.random() < 0.3
        jobs.append(TraceJob(
            job_id=first_id + i, display_id=str(first_id + i), user=f"u{rng.randrange(6)}", account="research",
            partition="gpu", qos="normal", name="train.sh" if long else "eval.sh", comment="", submit=now,
            eligible_delay_s=0.0, duration_s=math.exp(rng.gauss(math.log(10800.0 if long else 900.0), 0.3)),
            time_limit_s=None, gpus=rng.choice([1, 2, 4, 8]), num_nodes=1, cpus=1,
        ))
        now += rng.expovariate(1 / gap_s)
    return jobs


def _replay(policy_name: str, jobs: list[TraceJob], history: History | None) -> dict[int, tuple]:
    conf = parse_slurm_conf(CLUSTER)
    settings = SimSettings(preemptible=0.0, priority_model=conf.priority_model({}, "invented"))
    policy = default_registry().create(policy_name)
    results: list[JobResult] = []
    Simulator(jobs, SimCluster(conf, Topology()), policy, policy.Params(), settings,
              Timeline(origin=jobs[0].submit, width=3600.0), results.append, history=history).run()
    return {r.job_id: (r.start, r.end, r.wait_s, r.level, r.preemptions) for r in results}


@pytest.mark.parametrize("policy_name", ["dike", "multifactor"])
def test_a_window_with_its_history_replays_as_history_and_window_together(policy_name: str) -> None:
    """History: 150 jobs over about three days. The window starts a week after the history's first
    submission (a whole number of every period the simulator keeps, so cycles fall at the same
    times) and is busy (about 1.5x the cluster), so that order matters. Seeded with the history's
    runs as the joint replay ran them, the window's jobs start and end exactly as in the joint
    replay; started cold they do not."""
    rng = random.Random(7)
    past = _jobs(rng, 1, 150, 1_000_000.0, 1800.0)
    window = _jobs(rng, 10_000, 120, past[0].submit + WEEK, 120.0)
    together = _replay(policy_name, past + window, None)
    window_start = window[0].submit
    ran = [(together[job.job_id], job) for job in past]
    assert all(end <= window_start for (_, end, *_), _ in ran)  # every past job ended before the window
    history = History(Path("invented"), window_start, tuple(
        PastJob(job, (PastRun(start, end),)) for (start, end, *_), job in sorted(ran, key=lambda r: (r[0][1], r[1].job_id))
    ))
    warm = _replay(policy_name, window, history)
    cold = _replay(policy_name, window, None)
    expected = {job.job_id: together[job.job_id] for job in window}
    assert warm == expected
    assert cold != expected  # the history changes decisions: the test has something to prove


def _dike_slurm(*args: str) -> subprocess.CompletedProcess:
    result = in_process.dike_slurm(*args, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def split_dump(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A generated dump (invented) cut at its middle submission into an earlier dump and a window,
    as docs/replay.md tells a site to cut its own; one window job is repeated in the earlier dump."""
    folder = tmp_path_factory.mktemp("split")
    _dike_slurm("trace", "generate", "--out", str(folder), "--jobs", "200", "--nodes", "8", "--seed", "5", "--load", "3")
    header, *rows = (folder / "sacct.txt").read_text(encoding="utf-8").splitlines()
    submit = header.split("|").index("Submit")
    cut = sorted(row.split("|")[submit] for row in rows)[len(rows) // 2]
    earlier = [row for row in rows if row.split("|")[submit] < cut]
    window = [row for row in rows if row.split("|")[submit] >= cut]
    (folder / "earlier.txt").write_text("\n".join([header, *earlier, window[-1]]) + "\n", encoding="utf-8")
    (folder / "window.txt").write_text("\n".join([header, *window]) + "\n", encoding="utf-8")
    return folder / "earlier.txt", folder / "window.txt", folder / "slurm.conf"


def test_replay_with_history_says_what_seeded_it_and_what_it_left_out(split_dump, tmp_path):
    earlier, window, conf = split_dump
    warm = _dike_slurm("replay", str(window), "--slurm-conf", str(conf), "-p", "dike", "--history", str(earlier),
                       "--out", str(tmp_path / "warm"))
    cold = _dike_slurm("replay", str(window), "--slurm-conf", str(conf), "-p", "dike", "--out", str(tmp_path / "cold"))
    history = json.loads((tmp_path / "warm" / "summary.json").read_text())["input"]["history"]
    earlier_jobs = len({line.split("|")[1] for line in earlier.read_text().splitlines()[1:]})  # JobIDRaw
    left = history["jobs_left_out"]
    assert history["jobs_seeded"] > 40 and left[IN_WINDOW] == 1 and left[ENDED_AFTER] >= 1, history
    assert history["jobs_seeded"] + sum(left.values()) == earlier_jobs  # every job of the earlier dump accounted for
    assert history["last_end"] <= history["window_start"]  # nothing later than the window's start
    assert f"Warm start: {history['jobs_seeded']} jobs of earlier.txt" in warm.stdout
    assert f"{IN_WINDOW}: 1" in warm.stdout
    assert "Cold start: no --history" in cold.stdout
    assert json.loads((tmp_path / "cold" / "summary.json").read_text())["input"]["history"] is None
    assert "Warm start" in (tmp_path / "warm" / "report.html").read_text()
    warm_jct, cold_jct = (json.loads((tmp_path / run / "summary.json").read_text())["policies"]["dike"]["avg_jct_s"]
                          for run in ("warm", "cold"))
    assert warm_jct != cold_jct  # what the history knows changes Dike's order


def test_a_missing_history_dump_is_one_clear_line_naming_it(split_dump, tmp_path):
    earlier, _, conf = split_dump
    missing = tmp_path / "nothing.txt"
    result = in_process.dike_slurm("replay", str(earlier), "--slurm-conf", str(conf), "-p", "dike",
                                   "--history", str(missing), "--out", str(tmp_path / "out"), cwd=ROOT,
                                   env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr
    assert "nothing.txt" in result.stderr, result.stderr


def test_a_case_folder_with_a_history_starts_warm_and_its_twin_shuffles_the_history_with_its_jobs(split_dump, tmp_path):
    from dike_slurm.sim.eval.evaluate import Case, _case_inputs
    from dike_slurm.sim.kernel.replay import load_input

    earlier, window, conf = split_dump
    case = tmp_path / "split"
    case.mkdir()
    for source, name in ((window, "sacct.txt"), (earlier, "history.txt"), (conf, "slurm.conf"),
                         (conf.parent / "topology.conf", "topology.conf")):
        (case / name).write_bytes(source.read_bytes())
    inputs = _case_inputs([Case("split", case), Case("split-shuffled", case, twin_of="split")], load_input)
    plain, twin = inputs["split"], inputs["split-shuffled"]
    assert plain.history is not None and twin.history is not None and len(plain.history.jobs) > 40
    past, shuffled_past = plain.history.jobs, twin.history.jobs
    assert [(p.trace.job_id, p.runs) for p in shuffled_past] == [(p.trace.job_id, p.runs) for p in past]
    # one draw over history and window: the same users and names, moved across both
    def identities(input_):
        jobs = [p.trace for p in input_.history.jobs] + list(input_.trace.jobs)
        return [j.user for j in jobs], [j.name for j in jobs]

    (users, names), (twin_users, twin_names) = identities(plain), identities(twin)
    assert sorted(twin_users) == sorted(users) and sorted(twin_names) == sorted(names)
    assert twin_users[:len(past)] != users[:len(past)] and twin_names[:len(past)] != names[:len(past)]


def test_a_sweep_dump_takes_a_history_and_its_cells_start_warm(split_dump):
    from dike_slurm.config import Config
    from dike_slurm.sim.sweep.cell import _replay
    from dike_slurm.sim.sweep.spec import spec_from_data

    earlier, window, conf = split_dump
    spec = spec_from_data({"policies": ["dike"], "dump": [{"path": window.name, "slurm_conf": conf.name,
                                                             "history": earlier.name}]},
                          base=window.parent, source="sweep.toml")
    assert spec.inputs[0].history == str(earlier)
    cold = spec_from_data({"policies": ["dike"], "dump": [{"path": window.name, "slurm_conf": conf.name}]},
                          base=window.parent, source="sweep.toml")
    assert set(cold.inputs[0].as_dict()) == {"name", "dump", "slurm_conf", "topology"}  # cold cells keep their keys
    cell = {"input": spec.inputs[0].as_dict(), "policy": "dike", "comm_penalty": 1.0, "seed": 0, "preemptible": 0.0,
            "params": {}}
    _, input_section = _replay({"config": Config().model_dump(mode="json")}, cell)
    assert input_section["history"]["jobs_seeded"] > 40


def test_tune_takes_a_history_and_its_sweep_cells_carry_it(split_dump, tmp_path):
    earlier, window, conf = split_dump
    result = _dike_slurm("tune", str(window), "--slurm-conf", str(conf), "--history", str(earlier), "--quantiles", "0.5,0.9",
                         "--sweep-out", str(tmp_path / "sweep"))
    assert "Warm start:" in result.stdout
    plan = json.loads((tmp_path / "sweep" / "plan.json").read_text())
    assert [i["history"] for i in plan["grid"]["inputs"]] == [str(earlier.resolve())]
