"""The comparison of a replay with a real run (dike_slurm.sim.eval.fidelity: its statistics, the reading of a
run's sacct dump and its replay) and the fidelity harness's pure parts (bench/fidelity.py, loaded by
path: the workload, the runs, the table). The lab runs themselves are `make fidelity`."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from dike_slurm.errors import InputError
from dike_slurm.sim.eval.fidelity import (JobOutcome, compare, kendall_tau, leaves_of, measured_cycle_s, percentile,
                                     real_outcomes, replay_outcomes)
from dike_slurm.store.state import CycleSummary, StateStore

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("fidelity", REPO / "bench" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity"] = module
    spec.loader.exec_module(module)
    return module


fidelity = _load()


# ---------------------------------------------------------------------------- the workload


def test_the_workload_is_deterministic_and_within_its_ranges():
    first = fidelity.generate_workload(200, seed=5)
    assert first == fidelity.generate_workload(200, seed=5)
    assert first != fidelity.generate_workload(200, seed=6)
    assert len(first) == 200 and [j.index for j in first] == list(range(200))
    assert first[0].arrival_s == 0 and all(a.arrival_s <= b.arrival_s for a, b in zip(first, first[1:]))
    for job in first:
        assert 5 <= job.duration_s <= 20
        assert job.nodes == 1 or job.duration_s <= 10  # two-node jobs at most half the maximum
        assert job.gpus in (1, 2, 4, 8, 16) and job.nodes in (1, 2)
        assert job.gpus_per_node * job.nodes == job.gpus and job.gpus_per_node <= 8
        assert job.user in fidelity.USERS
        assert job.time_limit_min is None or job.time_limit_min >= math.ceil(1.5 * job.duration_s / 60)
    assert {j.user for j in first} == set(fidelity.USERS)
    assert any(j.nodes == 2 for j in first) and any(j.nodes == 1 for j in first)
    assert any(j.time_limit_min is None for j in first) and any(j.time_limit_min for j in first)


def test_the_workload_offers_its_load_and_arrives_in_bursts():
    jobs = fidelity.generate_workload(400, seed=1, load=1.0)
    gpu_seconds = sum(j.gpus * j.duration_s for j in jobs)
    offered = gpu_seconds / (fidelity.LAB_GPUS * jobs[-1].arrival_s)
    assert 0.6 < offered < 1.6  # the span is drawn, not fixed
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(jobs, jobs[1:])]
    within_a_second = sum(1 for g in gaps if g < 1.0)
    # bursts of mean 3: about two gaps in three are inside a burst, against ~1/6 for Poisson arrivals
    assert within_a_second > len(gaps) / 2


@pytest.mark.parametrize("bad", [dict(jobs=0), dict(load=0), dict(min_duration_s=0), dict(min_duration_s=9, max_duration_s=8)])
def test_the_workload_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        fidelity.generate_workload(**{"jobs": 5, **bad})


def test_sbatch_argv_is_an_argv_with_the_job_shape():
    job = fidelity.WorkJob(7, 1.5, "dikeuser1", 16, 2, 9, 1)
    argv = fidelity.sbatch_argv(job)
    assert argv[0] == "sbatch" and "--job-name=fid-0007" in argv and "--nodes=2" in argv
    assert "--gres=gpu:8" in argv and "--time=1" in argv and argv[-2:] == ["--wrap", "sleep 9"]
    assert "--requeue" not in argv
    unlimited = fidelity.sbatch_argv(fidelity.WorkJob(8, 0, "root", 1, 1, 5, None), preemptible=True)
    assert not any(a.startswith("--time") for a in unlimited)
    assert "--requeue" in unlimited and "--comment=dike:preemptible" in unlimited


@pytest.mark.parametrize("name, index", [
    ("fid-0042", 42), ("fid-1", 1), ("fid-", None), ("fid-12a", None), ("fid--3", None), ("xfid-0001", None),
    ("fid-0001|x", None), ("", None), ("fid-9999999", None), ("fid-٣", None),
])
def test_workload_index_reads_only_our_names(name, index):
    assert fidelity.workload_index(name) == index


def test_parse_runs_labels_repeated_runs():
    runs = fidelity.parse_runs("fifo, fifo,dike,dike+preempt")
    assert [(r.label, r.policy, r.preempt) for r in runs] == [
        ("fifo-1", "fifo", False), ("fifo-2", "fifo", False), ("dike-1", "dike", False),
        ("dike-preempt-1", "dike", True),
    ]
    for bad in ("tiresias", "fifo+preempt", "dike+x", ""):
        with pytest.raises(fidelity.FidelityError):
            fidelity.parse_runs(bad)


# ---------------------------------------------------------------------------- the metrics


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1
    # one swapped pair of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with ties: x = 1,2,2,3 (one tie), y = 1,2,3,3 (one tie), pairs: C=4, D=0
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(4 / math.sqrt(5 * 5))
    assert math.isnan(kendall_tau([1, 1], [1, 2]))
    assert math.isnan(kendall_tau([], []))
    with pytest.raises(ValueError):
        kendall_tau([1], [1, 2])


def test_percentile_interpolates():
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    assert math.isnan(percentile([], 50))


def outcome(submit, start, end, nodes=1, leaves=1, preemptions=0):
    return JobOutcome(submit, start, end, nodes, leaves, preemptions)


def test_compare_job_by_job():
    real = {
        0: outcome(0, 0, 10),
        1: outcome(0, 10, 20, nodes=2, leaves=1),
        2: outcome(1, 20, 30, nodes=2, leaves=2, preemptions=1),
        3: outcome(2, 30, 40),
    }
    other = {
        0: outcome(0, 0, 10),
        1: outcome(0, 12, 22, nodes=2, leaves=2),
        2: outcome(1, 20, 30, nodes=2, leaves=2),
        4: outcome(5, 5, 6),  # not in the reference: ignored
    }
    m = compare(real, other)
    assert m["jobs"] == 3 and m["missing"] == 1
    assert m["kendall_tau"] == 1
    assert m["start_error_median_s"] == 0 and m["start_error_p95_s"] == pytest.approx(1.8)
    # waits of the compared reference jobs: 0, 10, 19; mean |error| 2/3
    assert m["mean_wait_s"] == pytest.approx(29 / 3)
    assert m["start_error_wait_share"] == pytest.approx((2 / 3) / (29 / 3))
    assert m["mean_jct_reference_s"] == pytest.approx((10 + 20 + 29) / 3)
    assert m["mean_jct_error"] == pytest.approx(2 / 59)
    assert m["multi_node_jobs"] == 2 and m["same_leaves"] == 1 and m["same_leaves_share"] == 0.5
    assert m["leaves_reference"] == {1: 1, 2: 1} and m["leaves_other"] == {2: 2}
    assert m["preemptions_reference"] == 1 and m["preemptions_other"] == 0 and m["preempted_jobs_both"] == 0


def test_compare_with_nothing_in_common_is_not_an_error():
    m = compare({0: outcome(0, 1, 2)}, {})
    assert m["jobs"] == 0 and m["missing"] == 1 and math.isnan(m["kendall_tau"]) and math.isnan(m["same_leaves_share"])
    assert "| x | 0 | - |" in fidelity.table([("x", m)])


def test_leaves_of_counts_leaf_switches():
    leaf = {"n1": "s1", "n2": "s1", "n3": "s2", "n4": "s2"}.get
    assert leaves_of(["n1", "n2"], leaf) == 1
    assert leaves_of(["n1", "n3"], leaf) == 2
    assert leaves_of([], leaf) == 0


def test_the_table_has_a_row_per_comparison():
    m = compare({0: outcome(0, 0, 10, nodes=2, leaves=1), 1: outcome(0, 5, 9)},
                         {0: outcome(0, 1, 11, nodes=2, leaves=1), 1: outcome(0, 4, 8)})
    text = fidelity.table([("fifo: replay vs lab run 1", m), ("fifo: lab run 2 vs lab run 1 (noise)", m)])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| fifo: replay vs lab run 1 | 2 | 1.000 | 1.0 / 1.0 |")
    assert "1/1 (100%)" in lines[2] and "+0.0%" in lines[2]


# ---------------------------------------------------------------------------- a run's dump


SLURM_CONF = """\
SchedulerParameters=bf_interval=5,sched_interval=5,bf_continue
TopologyPlugin=topology/tree
NodeName=n[1-4] CPUs=16 RealMemory=64000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
"""
TOPOLOGY = "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\nSwitchName=top Switches=s[1-2]\n"
HEADER = "JobID|JobIDRaw|JobName|User|Account|Partition|State|Submit|Eligible|Start|End|ElapsedRaw|Timelimit|NNodes|NCPUS|NodeList|AllocTRES"


def row(job_id, name, state, submit, start, end, elapsed, nodes, nodelist, gpus, user="root", limit="00:01:00"):
    tres = f"cpu={nodes},gres/gpu={gpus},node={nodes}"
    return (f"{job_id}|{job_id}|{name}|{user}|root|gpu|{state}|2026-12-01T06:00:{submit:02d}|2026-12-01T06:00:{submit:02d}|"
            f"2026-12-01T06:00:{start:02d}|2026-12-01T06:00:{end:02d}|{elapsed}|{limit}|{nodes}|{nodes}|{nodelist}|{tres}")


def write_run(tmp_path: Path) -> Path:
    run = tmp_path / "fifo-1"
    run.mkdir()
    (run / "slurm.conf").write_text(SLURM_CONF)
    (run / "topology.conf").write_text(TOPOLOGY)
    (run / "dike.toml").write_text(fidelity.run_config(fidelity.RunSpec("fifo-1", "fifo"), run, run / "slurm.conf"))
    rows = [
        row(101, "fid-0000", "COMPLETED", 0, 0, 10, 10, 2, "n[1-2]", 16),
        row(102, "fid-0001", "REQUEUED", 1, 1, 4, 3, 1, "n3", 8),
        row(102, "fid-0001", "COMPLETED", 5, 12, 20, 8, 1, "n4", 8),
        row(103, "fid-0002", "COMPLETED", 2, 10, 15, 5, 2, "n[1,3]", 4),
        row(104, "other|x", "COMPLETED", 2, 2, 3, 1, 1, "n4", 1),  # not ours (and a | in its name)
        row(105, "fid-0003", "COMPLETED", 3, 20, 26, 6, 1, "n2", 8, user="dikeuser1", limit="UNLIMITED"),
    ]
    (run / "sacct.txt").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    store = StateStore(run / "state.sqlite")  # the run's engine cycles: an idle one, and two of 0.3 and 0.5 s
    with store.transaction():
        for started, seconds, jobs in ((0.0, 2.0, 0), (3.0, 0.3, 2), (6.0, 0.5, 3)):
            store.record_cycle(CycleSummary(started, seconds, "fifo", True, jobs, jobs, 0, 0, 6))
    store.close()
    return run


def test_real_outcomes_read_the_runs_jobs(tmp_path):
    run = write_run(tmp_path)
    outcomes, origin, index_of = real_outcomes(run, fidelity.workload_index)
    assert index_of == {101: 0, 102: 1, 103: 2, 105: 3}
    assert set(outcomes) == {0, 1, 2, 3}
    assert outcomes[0] == JobOutcome(0, 0, 10, 2, 1, 0)
    # requeued: the first record's submit, the first start, the last end and nodes, one preemption
    assert outcomes[1] == JobOutcome(1, 1, 20, 1, 1, 1)
    assert outcomes[2] == JobOutcome(2, 10, 15, 2, 2, 0)


def test_the_replay_of_a_run_starts_over_requeued_sleeps(tmp_path):
    run = write_run(tmp_path)
    _, origin, index_of = real_outcomes(run, fidelity.workload_index)
    replayed, stats = replay_outcomes(run, "fifo", origin, index_of)
    assert set(replayed) == {0, 1, 2, 3}
    # job 1 was requeued on the lab: replayed with its last run's length (8 s), not 3 + 8, and the
    # run's launch and exit (replay.run_overhead_s)
    assert replayed[1].end - replayed[1].start == pytest.approx(8.05) and replayed[1].preemptions == 0
    assert replayed[0].start == 0 and replayed[0].leaves == 1 and replayed[0].nodes == 2
    assert stats["preemptions"] == 0
    assert stats["cycle_latency_s"] == 0.4  # the mean of the run's cycles with jobs in scope


def test_a_run_without_engine_cycles_is_refused(tmp_path):
    run = write_run(tmp_path)
    (run / "state.sqlite").unlink()
    StateStore(run / "state.sqlite").close()
    with pytest.raises(InputError, match="no engine cycle with jobs in scope"):
        measured_cycle_s(run / "state.sqlite")


def test_replay_only_writes_the_table_the_json_and_the_plot(tmp_path, capsys):
    write_run(tmp_path)
    assert fidelity.main(["--replay-only", "--runs", "fifo", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| fifo: replay vs lab run 1 | 4 |" in table
    document = json.loads((tmp_path / "fidelity.json").read_text())
    assert document["comparisons"]["fifo: replay vs lab run 1"]["jobs"] == 4
    assert (tmp_path / "fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "fidelity.html").read_text()  # the report format: one page, the plot embedded
    assert "<td>fifo: replay vs lab run 1</td><td>4</td>" in page and 'src="data:image/png;base64,' in page
    assert "http://" not in page and "https://" not in page
    assert "fifo: replay vs lab run 1" in capsys.readouterr().out


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert fidelity.main(["--replay-only", "--runs", "fifo", "--out", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fidelity: error: ") and "Traceback" not in err
