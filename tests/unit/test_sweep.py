"""Sweeps (sim/sweep/, `dike-slurm sweep`): the grid, the cell files, idempotent runs, write-then-rename,
failed and missing cells, the merge, the array script and its submission, and `tune --sweep-out`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import in_process

from dike_slurm.errors import InputError
from dike_slurm.sim.sweep import cell as sweep_cell
from dike_slurm.sim.sweep import merge as sweep_merge
from dike_slurm.sim.sweep import plan as sweep_plan
from dike_slurm.sim.sweep import run as sweep_run
from dike_slurm.sim.sweep import spec as sweep_spec
from dike_slurm.sim.sweep import status as sweep_status

ROOT = Path(__file__).resolve().parents[2]


def dike_slurm(*args: str, check: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    result = in_process.dike_slurm(*args, cwd=cwd, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A small generated cluster and dump: a replay takes a fraction of a second. 60 jobs (54 replayed):
    every test here checks the sweep's files, states and merge, which no more jobs would change."""
    folder = tmp_path_factory.mktemp("tiny")
    dike_slurm("trace", "generate", "--out", str(folder), "--jobs", "60", "--nodes", "4", "--seed", "5", "--load", "0.8")
    return folder


def write_spec(folder: Path, body: str, name: str = "spec.toml") -> Path:
    path = folder / name
    path.write_text(body, encoding="utf-8")
    return path


def basic_spec(tmp_path: Path, tiny: Path, extra: str = "", penalties: str = "[0, 1]") -> Path:
    return write_spec(tmp_path, f"""
name = "unit"
policies = ["fifo", "dike"]
penalties = {penalties}
seeds = [0, 3]
[[dump]]
path = "{tiny / 'sacct.txt'}"
slurm_conf = "{tiny / 'slurm.conf'}"
{extra}
""")


# ------------------------------------------------------------------------------ the grid


def test_grid_expands_in_a_fixed_order(tmp_path, tiny):
    spec_path = write_spec(tmp_path, f"""
name = "grid"
policies = ["fifo", "dike"]
penalties = [0.5, 0, 0.5]     # a repeated value counts once
seeds = [1, 2]
preemptible = [1.0, 0.5]
corpus = ["{tiny}"]
[[dump]]
path = "{tiny / 'sacct.txt'}"
slurm_conf = "{tiny / 'slurm.conf'}"
name = "again"
[grid.dike]
preemption = [true, false]
levels = [2, 3]
[[variant]]
label = "tiresias-fast"
policy = "tiresias"
params = {{}}
[replay]
interval_s = 120
""")
    spec = sweep_spec.load_spec(spec_path)
    assert [i.name for i in spec.inputs] == ["again", tiny.name]  # dumps first, then the corpus's cases
    assert [v.label for v in spec.variants] == [
        "fifo", "dike preemption=true,levels=2", "dike preemption=true,levels=3",
        "dike preemption=false,levels=2", "dike preemption=false,levels=3", "tiresias-fast"]
    assert spec.variants[2].params == {"preemption": True, "levels": 3}
    assert spec.penalties == (0.5, 0.0) and spec.seeds == (1, 2) and spec.preemptible == (1.0, 0.5)
    assert spec.config["replay"]["interval_s"] == 120
    cells = sweep_spec.expand(spec)
    assert len(cells) == 2 * 6 * 2 * 2 * 2
    first = cells[:9]
    assert [(c.variant.label, c.comm_penalty, c.seed, c.preemptible) for c in first] == [
        ("fifo", 0.5, 1, 1.0), ("fifo", 0.5, 1, 0.5), ("fifo", 0.5, 2, 1.0), ("fifo", 0.5, 2, 0.5),
        ("fifo", 0.0, 1, 1.0), ("fifo", 0.0, 1, 0.5), ("fifo", 0.0, 2, 1.0), ("fifo", 0.0, 2, 0.5),
        ("dike preemption=true,levels=2", 0.5, 1, 1.0)]
    assert [c.id for c in cells] == list(range(len(cells)))
    assert all(c.input.name == "again" for c in cells[:48]) and all(c.input.name == tiny.name for c in cells[48:])


def test_the_same_spec_gives_the_same_cell_files(tmp_path, tiny):
    spec = sweep_spec.load_spec(basic_spec(tmp_path, tiny))
    one = sweep_plan.write_plan(spec, tmp_path / "one")
    two = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "two")
    assert one.cells == two.cells == 8
    for cell_id in range(8):
        assert sweep_plan.cell_file(one.out, cell_id).read_bytes() == sweep_plan.cell_file(two.out, cell_id).read_bytes()
    assert (one.out / "plan.json").read_bytes() == (two.out / "plan.json").read_bytes()
    cell = json.loads(sweep_plan.cell_file(one.out, 5).read_text())
    assert (cell["label"], cell["comm_penalty"], cell["seed"]) == ("dike", 0.0, 3)
    keys = json.loads((one.out / "plan.json").read_text())["keys"]
    assert len(set(keys)) == 8  # every cell computes something else


def test_a_changed_configuration_changes_the_keys(tmp_path, tiny):
    plain = sweep_spec.load_spec(basic_spec(tmp_path, tiny))
    slower = sweep_spec.load_spec(basic_spec(tmp_path, tiny, "[replay]\ninterval_s = 300"))
    config_a, config_b = sweep_spec.content_sha(plain.config), sweep_spec.content_sha(slower.config)
    cells = sweep_spec.expand(plain)
    assert cells[0].key(config_a) != cells[0].key(config_b)
    sweep_plan.write_plan(plain, tmp_path / "sweep")
    with pytest.raises(InputError, match="holds another sweep"):
        sweep_plan.write_plan(slower, tmp_path / "sweep")


@pytest.mark.parametrize("top, tables, key", [
    ('policies = ["fifo"]\nbogus = 1', "", "bogus: unknown key"),
    ('policies = ["nope"]', "", "policies: unknown policy 'nope'"),
    ('policies = ["dike"]', "[grid.dike]\nnot_a_knob = [1]", "grid.dike.not_a_knob: policy dike has no parameter"),
    ('policies = ["dike"]', "[grid.dike]\nlevels = 3", "grid.dike.levels: expected a non-empty list"),
    ('policies = ["fifo"]', "[grid.dike]\nlevels = [3]", "grid.dike: 'dike' is not in policies"),
    ('policies = ["fifo"]\npenalties = [-1]', "", "penalties: values must be finite and >= 0"),
    ('policies = ["fifo"]\nseeds = [1.5]', "", "seeds: expected a non-empty list of integers"),
    ('policies = ["fifo"]', "[replay]\ninterval_s = 0", "replay.interval_s: Input should be greater than 0"),
    ('policies = ["fifo"]', "[replay]\nintervall = 5", "replay.intervall: unknown key"),
    ('policies = ["fifo"]', '[slurm]\npartition = "cpu; rm -rf /"', "slurm.partition: letters, digits"),
    ('policies = ["fifo"]', "[slurm]\nmem = 5", "slurm.mem: unknown key"),
    ('policies = ["fifo"]', '[[variant]]\npolicy = "dike"\nparams = { knob = 1 }',
     "variant[0].params.knob: policy dike has no parameter"),
    ('policies = ["fifo"]', '[[variant]]\nlabel = "fifo"\npolicy = "fifo"', "two variants are labelled 'fifo'"),
    ('policies = ["fifo"]\nconfig = "missing.toml"', "", "config: "),
    ('policies = ["fifo"]\nname = "a b"', "", "name: letters, digits"),
])
def test_bad_spec_names_the_file_and_the_key(tmp_path, tiny, top, tables, key):
    spec = write_spec(tmp_path, f'{top}\n[[dump]]\npath = "{tiny / "sacct.txt"}"\n'
                      f'slurm_conf = "{tiny / "slurm.conf"}"\n{tables}\n')
    with pytest.raises(InputError) as caught:
        sweep_spec.load_spec(spec)
    assert str(caught.value).startswith(f"{spec}: ") and key in str(caught.value)


def test_missing_dump_and_no_input(tmp_path):
    spec = write_spec(tmp_path, 'policies = ["fifo"]\n[[dump]]\npath = "nowhere.txt"\nslurm_conf = "x.conf"\n')
    with pytest.raises(InputError, match=r"dump\[0\]\.path: no such file: .*nowhere.txt"):
        sweep_spec.load_spec(spec)
    with pytest.raises(InputError, match="dump: give at least one"):
        sweep_spec.load_spec(write_spec(tmp_path, 'policies = ["fifo"]\n', "empty.toml"))
    with pytest.raises(InputError, match="not valid TOML"):
        sweep_spec.load_spec(write_spec(tmp_path, 'policies = [\n', "broken.toml"))


def test_bad_spec_on_the_command_line_is_one_line(tmp_path, tiny):
    spec = write_spec(tmp_path, f'policies = ["fifo"]\nseeds = "x"\n[[dump]]\npath = "{tiny / "sacct.txt"}"\n'
                      f'slurm_conf = "{tiny / "slurm.conf"}"\n')
    result = dike_slurm("sweep", "plan", str(spec), "--out", str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {spec}: seeds: expected a non-empty list of integers"


# ------------------------------------------------------------------------------ the array script


def test_array_script_sizes_and_quotes(tmp_path, tiny):
    spec = sweep_spec.load_spec(basic_spec(tmp_path, tiny, '[slurm]\npartition = "cpu"\nmax_parallel = 3\naccount = "research"'))
    plan = sweep_plan.write_plan(spec, tmp_path / "sw", python="/opt/py thon/bin/python3")
    script = (plan.out / "sweep.sbatch").read_text()
    assert script == plan.script
    lines = script.splitlines()
    assert "#SBATCH --array=0-7%3" in lines and "#SBATCH --partition=cpu" in lines and "#SBATCH --account=research" in lines
    size_mb = (tiny / "sacct.txt").stat().st_size / 1e6
    assert plan.mem_mb == 64 * -(-(256 + 4 * size_mb) // 64) and f"#SBATCH --mem={plan.mem_mb}M" in lines
    assert plan.time_min == -(-(10 + 5 * size_mb) // 1) and "#SBATCH --qos" not in script and "--gres" not in script
    assert f"#SBATCH --output={plan.out}/logs/cell-%a.log" in lines and "#SBATCH --open-mode=append" in lines
    assert lines[-1] == f"exec '/opt/py thon/bin/python3' -m dike_slurm sweep run {plan.out} \"$SLURM_ARRAY_TASK_ID\""
    spaced = tmp_path / "with space"
    with pytest.raises(InputError, match="path must be plain"):
        sweep_plan.write_plan(spec, spaced)
    assert not spaced.exists()  # refused before anything is written
    fixed = sweep_spec.load_spec(basic_spec(tmp_path, tiny, "[slurm]\nmem_mb = 999\ntime_min = 125"))
    again = sweep_plan.write_plan(fixed, tmp_path / "fixed")
    assert "#SBATCH --mem=999M" in again.script and "#SBATCH --time=2:05:00" in again.script


def test_compress_ids():
    assert sweep_run.compress_ids([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert sweep_run.compress_ids([4]) == "4"
    assert sweep_run.compress_ids([]) == ""


def fake_sbatch(tmp_path: Path, answer: str = "4242;dikelab", code: int = 0) -> tuple[Path, Path]:
    record = tmp_path / "sbatch-argv.json"
    script = tmp_path / "fake-sbatch"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                      f"print({answer!r})\nsys.exit({code})\n")
    script.chmod(0o755)
    return script, record


def test_submit_passes_only_the_unfinished_cells(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny, "[slurm]\nmax_parallel = 2")), tmp_path / "sw")
    assert sweep_cell.run_cell(plan.out, 1).status == "ok"
    assert sweep_cell.run_cell(plan.out, 2).status == "ok"
    script, record = fake_sbatch(tmp_path)
    submitted = sweep_run.submit(plan.out, sbatch=str(script))
    assert submitted["job_id"] == 4242 and submitted["cells"] == [0, 3, 4, 5, 6, 7]
    assert json.loads(record.read_text()) == ["--parsable", "--array=0,3-7%2", str(plan.out / "sweep.sbatch")]
    result = dike_slurm("sweep", "submit", str(plan.out), "--sbatch", str(script))
    assert result.stdout.splitlines()[-1] == "4242" and "6 cells (0,3-7)" in result.stdout
    failing, _ = fake_sbatch(tmp_path, "sbatch: error: invalid partition", 1)
    result = dike_slurm("sweep", "submit", str(plan.out), "--sbatch", str(failing), check=False)
    assert result.returncode == 1 and "sbatch failed (1)" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------ running cells


def test_a_finished_cell_is_skipped(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    first = sweep_cell.run_cell(plan.out, 3)
    assert first.status == "ok"
    path = sweep_plan.result_file(plan.out, 3)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    result = json.loads(before[0])
    assert result["status"] == "ok" and result["summary"]["jobs"] == result["input_summary"]["jobs_replayed"] > 0
    assert result["run"]["runner"] == "local" and not sweep_plan.started_file(plan.out, 3).exists()
    assert sweep_cell.run_cell(plan.out, 3).status == "skipped"
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    out = dike_slurm("sweep", "run", str(plan.out), "3").stdout
    assert "cell 3: already done, skipped" in out


def test_a_partial_or_stale_result_is_not_taken_for_a_finished_one(tmp_path, tiny, monkeypatch):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    path = sweep_plan.result_file(plan.out, 0)
    path.write_text('{"id": 0, "key": "', encoding="utf-8")  # cut short
    assert sweep_status.status(plan.out)["counts"]["missing"] == 8
    assert sweep_cell.run_cell(plan.out, 0).status == "ok"
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, "key": "another-sweep"}), encoding="utf-8")  # another grid's result
    assert sweep_status.status(plan.out)["counts"]["ok"] == 0
    # A crash between writing and renaming leaves only a hidden temporary file, never a result.
    path.unlink()

    real_replace = os.replace

    def crash(src, dst):  # noqa: ANN001 - the result's rename fails, the started marker's works
        if Path(dst) == path:
            raise OSError("killed before the rename")
        real_replace(src, dst)

    monkeypatch.setattr(sweep_plan.os, "replace", crash)
    with pytest.raises(InputError, match="0000.json: cannot write: killed before the rename"):
        sweep_cell.run_cell(plan.out, 0)
    monkeypatch.undo()
    assert not path.exists() and [p.name for p in (plan.out / "results").glob(".*.tmp")] == [
        f".0000.json.{os.getpid()}.tmp"]
    state = sweep_status.status(plan.out)
    assert state["counts"] == {"ok": 0, "failed": 0, "started": 1, "missing": 7}
    assert sweep_merge.merge(plan.out)["counts"] == {"ok": 0, "failed": 0, "missing": 8}
    assert sweep_cell.run_cell(plan.out, 0).status == "ok"  # the leftover temporary file is no result


def test_a_started_cell_without_a_result_shows_as_started_then_missing(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    sweep_plan.write_atomic(sweep_plan.started_file(plan.out, 6), json.dumps(
        {"key": "x", "host": "n3", "slurm_job": "77_6", "at": 0}))
    state = sweep_status.status(plan.out)
    assert state["counts"] == {"ok": 0, "failed": 0, "started": 1, "missing": 7}
    started = next(c for c in state["unfinished"] if c["id"] == 6)
    assert started == {"id": 6, "state": "started", "log": "logs/cell-6.log", "host": "n3", "slurm_job": "77_6"}
    merged = sweep_merge.merge(plan.out)
    assert {"id": 6, "label": "dike", "log": "logs/cell-6.log", "started": True} in merged["missing"]


OOM_LINE = ("slurmstepd: error: Detected 1 oom_kill event in StepId=77_5.batch. Some of your processes may have "
            "been killed by the cgroup out-of-memory handler.\n")


def test_a_cell_killed_by_slurm_is_failed_with_the_reason_from_its_log(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    where = {"host": "n1", "slurm_job": "77_5", "pid": 9}
    sweep_plan.write_atomic(sweep_plan.started_file(plan.out, 5), json.dumps({"key": "x", **where, "at": __import__("time").time()}))
    log = plan.out / "logs" / "cell-5.log"
    log.write_text(sweep_cell.start_line(5, where) + "\n" + OOM_LINE)
    state = sweep_status.status(plan.out)
    assert state["counts"] == {"ok": 0, "failed": 1, "started": 0, "missing": 7}
    merged = sweep_merge.merge(plan.out)
    assert merged["failed"] == [{"id": 5, "label": "dike", "log": "logs/cell-5.log",
                                 "error": "killed (out of memory); no result written"}]
    script, record = fake_sbatch(tmp_path)
    assert sweep_run.submit(plan.out, sbatch=str(script))["cells"] == list(range(8))  # killed: submitted again at once
    # Run again: the new attempt's start line comes after the old kill, so it counts as running.
    with log.open("a") as handle:
        handle.write(sweep_cell.start_line(5, {**where, "slurm_job": "78_5"}) + "\n")
    assert sweep_status.status(plan.out)["counts"]["started"] == 1
    assert 5 not in sweep_run.submit(plan.out, sbatch=str(script))["cells"]  # may still run: left out
    for line, reason in (("*** JOB 80 ON n2 CANCELLED AT 2026-12-01T06:00:00 DUE TO TIME LIMIT ***", "time limit"),
                         ("slurmstepd: error: Job 81 exceeded memory limit (900000 > 327680), being killed",
                          "out of memory"),
                         ("*** JOB 82 ON n2 CANCELLED AT 2026-12-01T06:00:00 ***", "cancelled")):
        log.write_text(sweep_cell.start_line(5, where) + "\n" + line + "\n")
        assert sweep_cell.killed_reason(plan.out, 5) == reason


def test_a_cell_killed_locally_is_failed_with_its_signal(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    for cell_id in range(1, 8):
        sweep_cell.run_cell(plan.out, cell_id)
    dying = tmp_path / "dying-python"
    dying.write_text(f"#!{sys.executable}\nimport json, os, signal, sys\n"
                     "folder, cell = sys.argv[5], int(sys.argv[6])\n"
                     "open(f'{folder}/results/{cell:04d}.started', 'w').write(json.dumps({'key': 'k', 'at': 0}))\n"
                     "print(f'cell {cell}: started on here (pid 1)', flush=True)\n"
                     "os.kill(os.getpid(), signal.SIGKILL)\n")
    dying.chmod(0o755)
    ran = sweep_run.run_local(plan.out, 1, python=str(dying))
    assert ran["ran"] == [0] and ran["exit_codes"] == {0: -9}
    assert (plan.out / "logs" / "cell-0.log").read_text().endswith("dike-slurm sweep local: cell 0 killed by signal SIGKILL\n")
    assert sweep_merge.merge(plan.out)["failed"] == [{"id": 0, "label": "fifo", "log": "logs/cell-0.log",
                                                "error": "killed (signal SIGKILL); no result written"}]
    assert sweep_run.run_local(plan.out, 1)["ran"] == [0]  # resumed with the real Python
    assert sweep_merge.merge(plan.out)["counts"] == {"ok": 8, "failed": 0, "missing": 0}


def test_a_failed_cell_fails_alone_and_shows_in_the_merge(tmp_path, tiny):
    spec = sweep_spec.load_spec(basic_spec(tmp_path, tiny, '[[variant]]\nlabel = "dike-bad"\npolicy = "dike"\nparams = { levels = 0 }'))
    plan = sweep_plan.write_plan(spec, tmp_path / "sw")
    assert plan.cells == 12
    bad = dike_slurm("sweep", "run", str(plan.out), "8", check=False)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "cell 8 failed: bad parameter: levels: Input should be greater than or equal to 2"
    for cell_id in (0, 4, 5):
        assert sweep_cell.run_cell(plan.out, cell_id).status == "ok"
    merged = sweep_merge.merge(plan.out)
    assert merged["counts"] == {"ok": 3, "failed": 1, "missing": 8}
    assert merged["failed"] == [{"id": 8, "label": "dike-bad", "log": "logs/cell-8.log",
                                 "error": "bad parameter: levels: Input should be greater than or equal to 2"}]
    result = json.loads(sweep_plan.result_file(plan.out, 8).read_text())
    assert result["status"] == "failed" and "ValidationError" in result["traceback"]
    assert sweep_status.unfinished_ids(plan.out) == [1, 2, 3, 6, 7, 8, 9, 10, 11]  # a failed cell is run again
    files = sweep_merge.write_merge(plan.out, merged)
    report = files["report"].read_text()
    assert "## Failed cells" in report and "| 8 | dike-bad | bad parameter: levels" in report
    assert "## Missing cells" in report and "| 1 | fifo | no | logs/cell-1.log |" in report


# ------------------------------------------------------------------------------ merge


def test_merge_is_the_same_run_in_process_or_in_local_processes(tmp_path, tiny):
    # one penalty: four cells (two policies, two seeds: rows are still seed means), each local
    # process a fresh Python
    spec = sweep_spec.load_spec(basic_spec(tmp_path, tiny, penalties="[1]"))
    here = sweep_plan.write_plan(spec, tmp_path / "here")
    assert here.cells == 4
    for cell_id in reversed(range(here.cells)):  # any order
        assert sweep_cell.run_cell(here.out, cell_id).status == "ok"
    there = sweep_plan.write_plan(spec, tmp_path / "there")
    ran = sweep_run.run_local(there.out, 2)
    assert ran["ran"] == list(range(4)) and set(ran["exit_codes"].values()) == {0}
    assert sweep_run.run_local(there.out, 2)["ran"] == []  # nothing left to run
    one, two = sweep_merge.merge(here.out), sweep_merge.merge(there.out)
    assert json.dumps(one) == json.dumps(two)
    assert one["counts"] == {"ok": 4, "failed": 0, "missing": 0}
    files_here, files_there = sweep_merge.write_merge(here.out, one), sweep_merge.write_merge(there.out, two)
    for kind in ("json", "csv", "report"):
        assert files_here[kind].read_bytes() == files_there[kind].read_bytes()
    # The numbers are those of a plain replay of the same cell.
    cell = next(c for c in one["cells"] if (c["label"], c["comm_penalty"], c["seed"]) == ("dike", 1.0, 3))
    replay = tmp_path / "replay"
    dike_slurm("replay", str(tiny / "sacct.txt"), "--slurm-conf", str(tiny / "slurm.conf"), "-p", "dike",
               "--comm-penalty", "1", "--seed", "3", "--out", str(replay))
    assert json.loads((replay / "summary.json").read_text())["policies"]["dike"] == cell["metrics"]


def test_merge_rows_are_seed_means_and_best_per_metric(tmp_path, tiny):
    plan = sweep_plan.write_plan(sweep_spec.load_spec(basic_spec(tmp_path, tiny)), tmp_path / "sw")
    for cell_id in range(plan.cells):
        sweep_cell.run_cell(plan.out, cell_id)
    merged = sweep_merge.merge(plan.out)
    by = {(c["label"], c["comm_penalty"], c["seed"]): c["metrics"] for c in merged["cells"]}
    row = next(r for r in merged["rows"] if (r["label"], r["comm_penalty"]) == ("fifo", 1.0))
    assert row["seeds"] == [0, 3] and row["seeds_ok"] == 2
    assert row["metrics"]["avg_jct_s"] == (by[("fifo", 1.0, 0)]["avg_jct_s"] + by[("fifo", 1.0, 3)]["avg_jct_s"]) / 2
    best = {(b["comm_penalty"], b["metric"]): b for b in merged["best"]}
    jct = best[(1.0, "avg_jct_s")]
    means = {r["label"]: r["metrics"]["avg_jct_s"] for r in merged["rows"] if r["comm_penalty"] == 1.0}
    assert jct["value"] == min(means.values()) and jct["labels"] == [k for k, v in means.items() if v == jct["value"]]
    assert best[(1.0, "gpu_utilization")]["better"] == "higher"
    csv_lines = sweep_merge.csv_text(merged).splitlines()
    assert len(csv_lines) == 1 + plan.cells and csv_lines[0].startswith("id,input,label,policy,comm_penalty,seed")
    result = dike_slurm("sweep", "merge", str(plan.out), "--json")
    assert json.loads(result.stdout) == json.loads((plan.out / "merge" / "merged.json").read_text()) == merged


def test_plan_again_resumes_and_status_reads_the_files(tmp_path, tiny):
    spec_path = basic_spec(tmp_path, tiny)
    out = tmp_path / "sw"
    first = json.loads(dike_slurm("sweep", "plan", str(spec_path), "--out", str(out), "--json").stdout)
    assert first["cells"] == 8 and first["resumed"] is False
    for cell_id in (0, 2, 3, 4, 6, 7):  # in this process; the two left run in local processes
        sweep_cell.run_cell(out, cell_id)
    again = json.loads(dike_slurm("sweep", "plan", str(spec_path), "--out", str(out), "--local", "2", "--json").stdout)
    assert again["resumed"] is True and again["local"]["ran"] == [1, 5]
    state = json.loads(dike_slurm("sweep", "status", str(out), "--json").stdout)
    assert state["counts"] == {"ok": 8, "failed": 0, "started": 0, "missing": 0} and state["done"] is True
    text = dike_slurm("sweep", "status", str(out)).stdout
    assert "8/8 ok, 0 failed" in text


# ------------------------------------------------------------------------------ tune as a preset sweep


@pytest.fixture(scope="module")
def thresholds_matter(tmp_path_factory) -> tuple[Path, list[str]]:
    """A trace and tune options under which a candidate beats the configured Dike: every job
    preemptible, configured thresholds (200 and 2,000 GPU-hours) above every job's service."""
    folder = tmp_path_factory.mktemp("matter")
    dike_slurm("trace", "generate", "--out", str(folder), "--jobs", "150", "--nodes", "4", "--seed", "3", "--load", "0.8")
    (folder / "site.toml").write_text("[policies.dike]\nthresholds_gpuh = [200, 2000]\n", encoding="utf-8")
    return folder, ["--preemptible", "all", "--config", str(folder / "site.toml")]


def _tune_answer(lines: list[str]) -> list[str]:
    """tune's answer: from its first line to the end of `lines`."""
    first = next(i for i, line in enumerate(lines) if line.startswith(("best average JCT: ", "no candidate ")))
    return lines[first:]


@pytest.mark.parametrize("case", ["no job preemptible", "thresholds matter"])
def test_tune_sweep_out_gives_the_answer_tune_gives(case, tmp_path, tiny, request):
    """The same answer, line for line, from tune and from its sweep's merge: on the tiny trace with no
    job preemptible, that the candidates change nothing and why; else the thresholds to use."""
    folder, options = (tiny, []) if case == "no job preemptible" else request.getfixturevalue("thresholds_matter")
    args = ["tune", str(folder / "sacct.txt"), "--slurm-conf", str(folder / "slurm.conf"),
            "--quantiles", "0.5,0.75", "--quantiles", "0.9,0.99", "--workers", "1", *options]
    answer = _tune_answer(dike_slurm(*args).stdout.splitlines())
    out = tmp_path / "tune"
    written = dike_slurm(*args, "--sweep-out", str(out)).stdout
    assert "wrote sweep tune: 4 cells" in written and "[policies.dike]" not in written
    dike_slurm("sweep", "local", str(out), "-j", "2")
    merged = dike_slurm("sweep", "merge", str(out)).stdout.splitlines()
    assert merged[-1 - len(answer):-1] == answer
    if case == "no job preemptible":
        assert answer == [answer[0]] and answer[0].startswith("no candidate changes anything: the 2 candidates and")
        assert "No job was preemptible (0 of 54 jobs)" in answer[0]
    else:
        assert answer[0].startswith("best average JCT: dike q=0.5,0.75 (") and answer[1] == "[policies.dike]"
    report = (out / "merge" / "report.md").read_text(encoding="utf-8")
    assert f"## tune\n\n{answer[0]}\n" in report
