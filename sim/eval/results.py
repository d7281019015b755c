"""A replay's output folder as pandas tables, for notebooks (`dike_slurm.sim.eval.results.load`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from dike_slurm.errors import InputError

TIME_COLUMNS = ("submit", "start", "end")  # Slurm timestamps (UTC) in jobs-NAME.csv


class ReplayResults(NamedTuple):
    """`jobs`: a row per job and policy; `policies`: a row per policy; `summary`: summary.json."""

    jobs: pd.DataFrame
    policies: pd.DataFrame
    summary: dict


def load(out_dir: str | Path) -> ReplayResults:
    """The tables of `dike-slurm replay --out OUT_DIR`: jobs-NAME.csv and summary.json.

    `jobs` has the columns of jobs-NAME.csv after a `policy` column, times as UTC datetimes;
    `policies` is indexed by policy name, one column per metric of summary.json.
    """
    folder = Path(out_dir)
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the replay's summary.json: {exc.strerror}", source=str(folder)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"summary.json is not JSON: {exc}", source=str(folder)) from None
    names = list(summary.get("policies", {}))
    policies = pd.DataFrame.from_dict(summary.get("policies", {}), orient="index")
    policies.index.name = "policy"
    tables = [_jobs(folder / f"jobs-{name}.csv", name) for name in names]
    jobs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame({"policy": []})
    jobs["policy"] = pd.Categorical(jobs["policy"], categories=names)
    return ReplayResults(jobs, policies, summary)


def _jobs(path: Path, policy: str) -> pd.DataFrame:
    try:
        table = pd.read_csv(path, dtype={"job_id": str, "user": str}, keep_default_na=False)
    except OSError as exc:
        raise InputError(f"cannot read the per-job table of policy {policy!r}: {exc.strerror}",
                         source=str(path)) from None
    for column in TIME_COLUMNS:
        if column in table:
            table[column] = pd.to_datetime(table[column], format="%Y-%m-%dT%H:%M:%S", utc=True)
    if "heavy" in table:
        table["heavy"] = table["heavy"].astype(bool)
    table.insert(0, "policy", policy)
    return table
