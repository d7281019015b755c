"""dike_slurm.sim.eval.results.load on a replay output written by the real `dike-slurm replay`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import in_process

from dike_slurm.errors import InputError
from dike_slurm.sim.eval.results import load

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("fifo", "dike")


def dike(*args: str) -> None:
    result = in_process.dike_slurm(*args, cwd=REPO, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("replay")
    dike("trace", "generate", "--jobs", "60", "--nodes", "4", "--nodes-per-leaf", "2", "--seed", "3",
         "--out", str(folder / "trace"))
    dike("replay", str(folder / "trace" / "sacct.txt"), "--slurm-conf", str(folder / "trace" / "slurm.conf"),
         *(f"--policy={name}" for name in POLICIES), "--workers", "1", "--out", str(folder / "out"))
    return folder / "out"


def test_the_tables_hold_what_the_replay_wrote(out_dir):
    results = load(out_dir)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert results.summary == summary
    assert list(results.policies.index) == list(POLICIES)
    assert results.policies.loc["fifo", "jobs"] == summary["policies"]["fifo"]["jobs"]
    assert list(results.jobs["policy"].cat.categories) == list(POLICIES)
    for name in POLICIES:
        jobs = results.jobs[results.jobs["policy"] == name]
        csv_rows = (out_dir / f"jobs-{name}.csv").read_text().splitlines()[1:]
        assert len(jobs) == len(csv_rows) == results.policies.loc[name, "jobs"]
        assert list(jobs["job_id"]) == [row.split(",", 1)[0] for row in csv_rows]
        assert jobs["jct_s"].mean() == pytest.approx(results.policies.loc[name, "avg_jct_s"], abs=1e-3)


def test_job_columns_have_notebook_types(out_dir):
    jobs = load(out_dir).jobs
    for column in ("submit", "start", "end"):
        assert isinstance(jobs[column].dtype, pd.DatetimeTZDtype) and str(jobs[column].dt.tz) == "UTC"
    assert (jobs["submit"] <= jobs["start"]).all() and (jobs["start"] <= jobs["end"]).all()
    # the timestamps are Slurm's whole seconds; jct_s keeps the fraction (a run ends its launch and
    # exit after its work: replay.run_overhead_s)
    assert (((jobs["end"] - jobs["submit"]).dt.total_seconds() - jobs["jct_s"]).abs() < 1).all()
    assert jobs["job_id"].str.contains("_").any()  # array tasks keep their display id, not a number
    assert jobs["heavy"].dtype == bool


def test_a_folder_without_a_replay_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="summary.json"):
        load(tmp_path)
    (tmp_path / "summary.json").write_text('{"policies": {"fifo": {"jobs": 1}}}')
    with pytest.raises(InputError, match="fifo"):
        load(tmp_path)
