"""`dike-slurm replay`, `trace stats|generate` and `tune` end to end, as a user runs them."""

from __future__ import annotations

import csv
import html
import json
import re
import subprocess
from pathlib import Path

import pytest
import in_process

from dike_slurm.sim.kernel.metrics import JOB_CSV_COLUMNS, METRIC_KEYS

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample"
HOSTILE_USER = "<script>alert('x')</script>&amp;"
REQUIRED_METRICS = {
    "jobs", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_wait_s", "makespan_s", "gpu_utilization",
    "avg_slowdown", "user_jain_index", "worst_user_slowdown", "preemptions", "heavy_consolidated_fraction",
}


def dike_slurm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = in_process.dike_slurm(*args, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"})
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    """A small generated cluster and dump, with one user renamed to a hostile string."""
    folder = tmp_path_factory.mktemp("trace")
    dike_slurm("trace", "generate", "--out", str(folder), "--jobs", "150", "--nodes", "4", "--seed", "3", "--load", "0.8")
    dump = folder / "sacct.txt"
    lines = dump.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("|")
    user_column = header.index("User")
    victim = lines[1].split("|")[user_column]
    renamed = [lines[0]] + [
        "|".join(HOSTILE_USER if i == user_column and value == victim else value for i, value in enumerate(line.split("|")))
        for line in lines[1:]
    ]
    dump.write_text("\n".join(renamed) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def replay_out(small_trace: Path, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("out") / "replay"
    result = dike_slurm(
        "replay", str(small_trace / "sacct.txt"), "--slurm-conf", str(small_trace / "slurm.conf"),
        "--policy", "fifo", "--policy", "dike", "--penalty-sweep", "0,2", "--out", str(out),
    )
    return out, result


def test_replay_writes_summary_jobs_and_report(replay_out):
    out, result = replay_out
    assert {p.name for p in out.iterdir()} == {"summary.json", "jobs-fifo.csv", "jobs-dike.csv", "report.html"}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"input", "policies", "settings", "comm_penalty_sweep", "config", "unfinished_at_dump_end"}
    assert list(summary["policies"]) == ["fifo", "dike"]
    for metrics in summary["policies"].values():
        assert REQUIRED_METRICS <= set(metrics) and list(metrics) == list(METRIC_KEYS)
        assert metrics["jobs"] == summary["input"]["jobs_replayed"]
    assert set(summary["comm_penalty_sweep"]) == {"0", "1", "2"}
    assert summary["input"]["rows"] > 0 and "jobs_not_replayed" in summary["input"]
    with (out / "jobs-dike.csv").open(encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == JOB_CSV_COLUMNS and len(rows) - 1 == summary["policies"]["dike"]["jobs"]
    assert "replay at comm penalty 1" in result.stdout and "report:" in result.stdout


def test_report_has_the_table_the_plots_and_escapes_names(replay_out):
    out, _ = replay_out
    html = (out / "report.html").read_text(encoding="utf-8")
    assert '<table id="comparison">' in html and '<table id="penalty">' in html
    assert '<table id="parameters">' in html  # every policy parameter, from the configuration the replay used
    assert "did not pass the policies' parameters" not in html
    assert html.count("data:image/svg+xml;base64,") >= 5  # CDF, wait by size, users, utilisation, levels
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;amp;" in html


def test_replay_is_deterministic(small_trace, replay_out, tmp_path):
    out, _ = replay_out
    again = tmp_path / "again"
    dike_slurm(
        "replay", str(small_trace / "sacct.txt"), "--slurm-conf", str(small_trace / "slurm.conf"),
        "--policy", "fifo", "--policy", "dike", "--penalty-sweep", "0,2", "--workers", "1", "--out", str(again),
    )
    assert (again / "summary.json").read_bytes() == (out / "summary.json").read_bytes()
    assert (again / "jobs-dike.csv").read_bytes() == (out / "jobs-dike.csv").read_bytes()


def test_trace_stats(small_trace):
    result = dike_slurm("trace", "stats", str(small_trace / "sacct.txt"), "--json")
    stats = json.loads(result.stdout)
    assert stats["jobs"] == 150 and stats["gpu_jobs"] > 0 and stats["users"] > 1
    assert sum(stats["gpus_per_job"].values()) == stats["gpu_jobs"]
    table = dike_slurm("trace", "stats", str(SAMPLE / "sacct.txt")).stdout
    assert "gpu hours" in table and "skipped rows" in table


def test_tune_proposes_thresholds_that_beat_the_configured_ones(small_trace, tmp_path):
    """Every job preemptible and configured thresholds far above every job's service (200 and 2,000
    GPU-hours): the median and 75th percentile cut average JCT, and tune says to use them."""
    config = tmp_path / "site.toml"
    config.write_text("[policies.dike]\nthresholds_gpuh = [200, 2000]\n", encoding="utf-8")
    result = dike_slurm(
        "tune", str(small_trace / "sacct.txt"), "--slurm-conf", str(small_trace / "slurm.conf"), "--config", str(config),
        "--quantiles", "0.5,0.75", "--quantiles", "0.9,0.99", "--preemptible", "all",
    )
    assert "preemptible: 139 of 139 jobs (100%), a share of 1 drawn per job (seed 0)" in result.stdout.splitlines()
    assert "dike q=0.9,0.99" in result.stdout and "dike (configured)" in result.stdout
    assert re.search(r"^best average JCT: dike q=0\.5,0\.75 \(1\.\d\dx the configured Dike\); to use it:\n"
                     r"\[policies\.dike\]\nthresholds_gpuh = \[[\d.]+, [\d.]+\]$", result.stdout, re.M)


def test_tune_says_when_the_candidates_are_identical_and_why_and_recommends_nothing(small_trace, tmp_path):
    """The trace tags no job for the engine's opt-in rule: no job is preemptible, so every Dike run
    gives the same figures; tune says so and why, on screen and in --out's summary.json and report."""
    out = tmp_path / "tune"
    result = dike_slurm(
        "tune", str(small_trace / "sacct.txt"), "--slurm-conf", str(small_trace / "slurm.conf"),
        "--quantiles", "0.5,0.75", "--quantiles", "0.9,0.99", "--out", str(out),
    )
    lines = result.stdout.splitlines()
    assert any(line.startswith("preemptible: 0 of 139 jobs (0%) by the engine's opt-in rule") for line in lines)
    answer = (
        "no candidate changes anything: the 2 candidates and the configured Dike all give identical figures. No job was "
        "preemptible (0 of 139 jobs), so no job is requeued and every waiting job has attained no service: all wait at "
        "level 0 whatever the thresholds, which then only order running jobs that nothing preempts. Nothing to "
        "recommend: replay with --preemptible all, or the share of jobs that would opt in, to see what the thresholds "
        "do once jobs may be preempted."
    )
    assert answer in lines
    assert "[policies.dike]" not in result.stdout and "best average JCT" not in result.stdout
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert list(summary["policies"]) == ["fifo", "dike (configured)", "dike q=0.5,0.75", "dike q=0.9,0.99"]
    dike_runs = [summary["policies"][name] for name in list(summary["policies"])[1:]]
    assert all(run == dike_runs[0] for run in dike_runs)  # what the answer says, in the figures themselves
    assert summary["tune"]["best"] is None and summary["tune"]["answer"] == answer
    assert [c["label"] for c in summary["tune"]["candidates"]] == ["dike q=0.5,0.75", "dike q=0.9,0.99"]
    assert summary["settings"]["preemptible"] == "live" and summary["settings"]["preemptible_jobs"] == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h1>Replay of " in page and "preemptible by the engine&#39;s opt-in rule (0 of 139 jobs)</h1>" in page
    assert "<td>thresholds_gpuh</td><td>unset</td><td>[0.345, 1.866]</td>" in page  # each candidate's own


def test_tune_answers_from_the_figures_and_names_why_they_do_not_differ():
    from dike_slurm.sim.eval.tune import Candidate, answer

    def run(avg_jct_s: float, preemptions: int = 0) -> dict:
        return {"jobs": 10, "avg_jct_s": avg_jct_s, "preemptions": preemptions, "worst_user": "ann"}

    same = [Candidate("dike q=0.5,0.75", (1.0, 2.0), run(3600.0)), Candidate("dike q=0.9,0.99", (5.0, 50.0), run(3600.0))]
    off = answer(run(3600.0), same, preemptible_jobs=10, jobs=10, preemption_on=False)
    assert off.best is None and "[policies.dike] preemption is off, so no job is requeued" in off.lines[0]
    assert off.lines[0].endswith("Nothing to recommend: compare them with [policies.dike] preemption = true.")
    preempting = answer(run(3600.0, 4), [Candidate("a", (1.0, 2.0), run(3600.0, 4))], preemptible_jobs=10, jobs=10)
    assert preempting.lines == ("no candidate changes anything: the candidate and the configured Dike give identical "
                                "figures. The thresholds changed no decision on this trace. Nothing to recommend.",)
    small = answer(run(3600.0), [Candidate("a", (1.0, 2.0), run(3590.0))])  # 0.28% better: the report's "same"
    assert small.best is None and small.lines == (
        "no candidate cuts average JCT by 0.5% or more against the configured Dike (the best, a, gives 0.997 h against "
        "1.000 h): keep the configured thresholds.",)
    better = answer(run(3600.0), [Candidate("a", (1.0, 2.0), run(3400.0)), Candidate("b", (0.5, 1.0), run(3000.0))])
    assert better.best.label == "b" and better.lines == (
        "best average JCT: b (1.20x the configured Dike); to use it:", "[policies.dike]", "thresholds_gpuh = [0.5, 1]")
    assert better.as_dict() == {"best": "b", "thresholds_gpuh": [0.5, 1.0], "answer": "\n".join(better.lines)}


@pytest.mark.parametrize(
    "args, message",
    [
        (["replay", "missing.txt", "--slurm-conf", "examples/sample/slurm.conf", "--policy", "fifo", "--out", "{tmp}"],
         "missing.txt: no such file"),
        (["replay", "examples/sample/sacct.txt", "--slurm-conf", "nowhere.conf", "--policy", "fifo", "--out", "{tmp}"],
         "nowhere.conf: cannot read"),
        (["replay", "examples/sample/sacct.txt", "--slurm-conf", "examples/sample/slurm.conf", "--policy", "nope",
          "--out", "{tmp}"], "unknown policy 'nope'"),
        (["replay", "examples/sample/sacct.txt", "--slurm-conf", "examples/sample/slurm.conf", "--out", "{tmp}"],
         "give at least one --policy"),
        (["replay", "{bad_dump}", "--slurm-conf", "examples/sample/slurm.conf", "--policy", "fifo", "--out", "{tmp}"],
         "sacct header lacks required column(s) User"),
        (["tune", "examples/sample/sacct.txt", "--slurm-conf", "examples/sample/slurm.conf", "--quantiles", "0.9,0.5"],
         "need 2 ascending values"),
        (["trace", "stats", "{bad_dump}"], "bad.txt:1: sacct header lacks"),
        (["tune", "examples/sample/sacct.txt", "--slurm-conf", "examples/sample/slurm.conf", "--out", "{tmp}",
          "--sweep-out", "{tmp}"], "give --out (run the replays now and write their results) or --sweep-out"),
    ],
)
def test_bad_input_gives_one_line_and_no_traceback(args, message, tmp_path):
    bad_dump = tmp_path / "bad.txt"
    bad_dump.write_text("JobID|State|Submit|Start|End|AllocTRES\n1|COMPLETED|x|y|z|gres/gpu=1\n", encoding="utf-8")
    args = [a.format(tmp=tmp_path / "out", bad_dump=bad_dump) for a in args]
    result = dike_slurm(*args, check=False)
    assert result.returncode in (1, 2), result.stderr  # RegistryError 1, InputError 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_replay_never_reads_the_live_configuration_and_says_which_it_used(small_trace, tmp_path):
    """$DIKE_CONFIG names the live engine's file: a replay ignores it (unless given --config) and
    says where its configuration came from, on screen and in summary.json."""
    live = tmp_path / "live.toml"
    live.write_text("[replay]\ncomm_penalty = 7.5\n")
    out = tmp_path / "replay"
    result = in_process.dike_slurm(
        "replay", str(small_trace / "sacct.txt"), "--slurm-conf", str(small_trace / "slurm.conf"), "--policy",
        "fifo,dike", "--out", str(out), cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DIKE_CONFIG": str(live), "DIKE_REPLAY__SEED": "4"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "configuration: built-in defaults (no file) + DIKE_REPLAY__SEED"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"] == {"kind": "defaults", "path": None, "variables": ["DIKE_REPLAY__SEED"]}
    assert summary["settings"]["comm_penalty"] == 1.0 and summary["settings"]["seed"] == 4
    assert set(summary["policies"]) == {"fifo", "dike"}  # `--policy fifo,dike` is two policies


def _opt_in_dump(small_trace: Path, folder: Path, *, comment: bool) -> tuple[Path, set[int], set[int]]:
    """The small trace with QOS ckpt on every 5th job and, when `comment`, a Comment column whose
    tag opts in every 7th; returns the dump and the ids of each kind."""
    lines = (small_trace / "sacct.txt").read_text(encoding="utf-8").splitlines()
    header = lines[0].split("|")
    qos, ids = header.index("QOS"), header.index("JobIDRaw")
    rows, by_qos, by_tag = [], set(), set()
    for line in lines[1:]:
        fields = line.split("|")
        job = int(fields[ids])
        if job % 5 == 0:
            fields[qos] = "ckpt"
            by_qos.add(job)
        tagged = job % 7 == 0
        if tagged:
            by_tag.add(job)
        rows.append("|".join(fields + (["train dike:preemptible" if tagged else "plain"] if comment else [])))
    folder.mkdir()
    dump = folder / "sacct.txt"
    dump.write_text("\n".join(["|".join(header + (["Comment"] if comment else []))] + rows) + "\n", encoding="utf-8")
    return dump, by_qos, by_tag


def test_the_replay_lets_preempt_what_the_live_rule_would_and_says_how_many(small_trace, tmp_path):
    from dike_slurm.config import Config
    from dike_slurm.sim.kernel.replay import load_input, preemptible_jobs, sim_settings

    dump, by_qos, by_tag = _opt_in_dump(small_trace, tmp_path / "tagged", comment=True)
    replay_input = load_input(dump, small_trace / "slurm.conf", None)
    replayed = {job.job_id for job in replay_input.trace.jobs}
    config = Config.model_validate({"engine": {"preemptible_qos": ["ckpt"]}})
    settings = sim_settings(config, replay_input.conf)
    count, text = preemptible_jobs(replay_input, settings)
    assert count == len((by_qos | by_tag) & replayed) and 0 < count < len(replayed)
    assert text.startswith(f"preemptible: {count:,} of {len(replayed):,} jobs") and "QOS ckpt" in text
    assert "'dike:preemptible' in the job's Comment" in text and "no Comment column" not in text
    every = sim_settings(Config.model_validate({"engine": {"preemptible_partitions": ["gpu"]}}), replay_input.conf)
    assert preemptible_jobs(replay_input, every)[0] == len(replayed)
    assert preemptible_jobs(replay_input, sim_settings(config, replay_input.conf, preemptible=0.0))[0] == 0
    # Without a Comment column the tag cannot be seen, and the line says so.
    bare, _, _ = _opt_in_dump(small_trace, tmp_path / "bare", comment=False)
    bare_input = load_input(bare, small_trace / "slurm.conf", None)
    count, text = preemptible_jobs(bare_input, sim_settings(config, bare_input.conf))
    assert count == len(by_qos & replayed) and "the dump has no Comment column" in text


def test_the_replay_prints_the_share_it_used(small_trace, tmp_path):
    dump, _, _ = _opt_in_dump(small_trace, tmp_path / "tagged", comment=True)
    out = tmp_path / "out"
    result = dike_slurm("replay", str(dump), "--slurm-conf", str(small_trace / "slurm.conf"), "--policy", "fifo",
                        "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["preemptible"] == "live"
    count = summary["settings"]["preemptible_jobs"]
    assert f"preemptible: {count:,} of " in result.stdout and "by the engine's opt-in rule" in result.stdout
    every = dike_slurm("replay", str(dump), "--slurm-conf", str(small_trace / "slurm.conf"), "--policy", "fifo",
                       "--preemptible", "all", "--out", str(tmp_path / "all"))
    jobs = summary["input"]["jobs_replayed"]
    assert f"preemptible: {jobs:,} of {jobs:,} jobs (100%), a share of 1 drawn per job" in every.stdout


def test_the_progress_bar_shows_jobs_per_second_and_time_left_at_a_terminal_and_nothing_in_a_pipe(monkeypatch):
    import io

    from rich.console import Console

    from dike_slurm.cli import progress as progress_module

    monkeypatch.setattr(progress_module, "PROGRESS_AFTER_S", 0.0)
    shown = {}
    for terminal in (True, False):
        out = io.StringIO()
        bar = progress_module.LazyProgress(["dike"], 100, Console(file=out, force_terminal=terminal, width=120))
        bar(0, 40)
        bar(0, 100)
        assert (bar.progress is not None) == terminal
        bar.close()
        shown[terminal] = out.getvalue()
    assert "jobs/s" in shown[True] and "left" in shown[True] and "dike" in shown[True]
    assert shown[False] == ""


LIVE_HEADER = "JobID|JobIDRaw|User|Partition|State|Submit|Start|End|ElapsedRaw|Timelimit|NNodes|NCPUS|ReqTRES|AllocTRES"
LIVE_ROWS = (  # taken at 10:20 while jobs ran; each job's story in the comment
    "1|1|ann|gpu|COMPLETED|2026-01-05T10:00:00|2026-01-05T10:00:00|2026-01-05T10:05:00|300|01:00:00|1|8|gres/gpu=1|gres/gpu=1",
    # 2 ran two minutes, was requeued and is pending again (--duplicates: both records)
    "2|2|bob|gpu|REQUEUED|2026-01-05T10:00:00|2026-01-05T10:01:00|2026-01-05T10:03:00|120|01:00:00|1|8|gres/gpu=2|gres/gpu=2",
    "2|2|bob|gpu|PENDING|2026-01-05T10:03:00|Unknown|Unknown|0|01:00:00|1|8|gres/gpu=2|",
    # 3: the same without --duplicates: one record, REQUEUED
    "3|3|bob|gpu|REQUEUED|2026-01-05T10:00:00|2026-01-05T10:02:00|2026-01-05T10:04:00|120|01:00:00|1|8|gres/gpu=1|gres/gpu=1",
    "4|4|cat|gpu|PENDING|2026-01-05T10:05:00|Unknown|Unknown|0|01:00:00|1|8|gres/gpu=8|",  # waited 15 min so far
    "5|5|cat|gpu|PENDING|2026-01-05T10:13:00|Unknown|Unknown|0|01:00:00|1|8|gres/gpu=4|",  # waited 7 min so far
    "6|6|dan|gpu|RUNNING|2026-01-05T10:06:00|2026-01-05T10:16:00|Unknown|240|01:00:00|1|8|gres/gpu=4|gres/gpu=4",
    "7|7|dan|gpu|CANCELLED by 0|2026-01-05T10:00:00|2026-01-05T10:02:00|2026-01-05T10:02:00|0|01:00:00|1|8|gres/gpu=1|",
    "8|8|ann|gpu|COMPLETED|2026-01-05T10:10:00|2026-01-05T10:10:00|2026-01-05T10:20:00|600|01:00:00|1|8|gres/gpu=1|gres/gpu=1",
)


@pytest.fixture()
def live_dump(tmp_path) -> Path:
    folder = tmp_path / "lab-live"
    folder.mkdir()
    (folder / "sacct.txt").write_text("\n".join((LIVE_HEADER, *LIVE_ROWS)) + "\n", encoding="utf-8")
    (folder / "slurm.conf").write_text("NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=ALL Default=YES\n",
                                       encoding="utf-8")
    return folder


def test_a_dump_taken_while_jobs_ran_says_which_jobs_it_left_out_and_what_they_waited(live_dump, tmp_path):
    """The two pending jobs and the running one are left out and said so, with their waits, on
    screen, in summary.json and on the report; the two requeued, pending again, are replayed."""
    out = tmp_path / "out"
    result = dike_slurm("replay", str(live_dump / "sacct.txt"), "--slurm-conf", str(live_dump / "slurm.conf"),
                        "-p", "fifo", "--out", str(out))
    sentence = ("The dump was taken while jobs ran (its last time: 2026-01-05T10:20:00): 2 GPU jobs still pending "
                "(waited 00:11:00 on average, the longest 00:15:00 so far) and 1 GPU job running (waited 00:10:00 "
                "before starting) at its end are left out of the replay, whose waits and JCTs therefore do not "
                "include them; 2 GPU jobs requeued and pending again are replayed with the run time they had.")
    lines = result.stdout.splitlines()
    assert f"  {sentence}" in lines
    assert ("These figures leave out the 3 GPU jobs still pending or running when the dump was taken "
            "(see its input above).") in lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input"]["jobs_replayed"] == 4  # 1, 2, 3 and 8
    assert summary["input"]["jobs_not_replayed"] == {"never started (pending or cancelled before start)": 3,
                                                     "still running at the end of the dump": 1}
    assert summary["unfinished_at_dump_end"] == {
        "dump_end": "2026-01-05T10:20:00", "pending_left_out": 2, "pending_wait_so_far_s": {"mean": 660.0, "max": 900.0},
        "running_left_out": 1, "running_wait_s": {"mean": 600.0, "max": 600.0}, "pending_again_replayed": 2,
    }
    page = (out / "report.html").read_text(encoding="utf-8")
    shown = html.escape(sentence, quote=True)
    assert f'<p id="unfinished">{shown}</p>' in page and f'<p class="note" id="unfinished-note"><strong>{shown}</strong></p>' in page


def test_a_finished_dump_says_every_job_had_ended(replay_out):
    out, result = replay_out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unfinished_at_dump_end"]["pending_left_out"] == 0 == summary["unfinished_at_dump_end"]["running_left_out"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert '<p id="unfinished">Every GPU job of the dump had ended when it was taken.</p>' in page
    assert "unfinished-note" not in page and "These figures leave out" not in result.stdout


def test_trace_stats_counts_requeues_from_the_states_it_prints(live_dump):
    stats = json.loads(dike_slurm("trace", "stats", str(live_dump / "sacct.txt"), "--json").stdout)
    assert stats["final_states"]["REQUEUED"] == 1  # job 3; job 2's last record is PENDING
    assert stats["requeued_jobs"] == 2  # job 2 (two records) and job 3 (REQUEUED, its only record)
    table = dike_slurm("trace", "stats", str(live_dump / "sacct.txt")).stdout
    assert re.search(r"requeued jobs\s+│\s+2\s", table) and "REQUEUED: 1" in table
