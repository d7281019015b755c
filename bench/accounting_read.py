"""Reading a million-row sacct dump: the project's reader (str.split) against a pandas reader.

    .venv/bin/python bench/accounting_read.py [--rows 1000000]

DESIGN.md prefers pandas at the input boundary if it is not slower than the standard library.
This script builds the same AccountingRecords both ways from the same dump (the bundled
sample's rows repeated) and prints the CPU time of each; the faster one is what
dike_slurm/slurm/accounting.py ships. The pandas reader lives only here, for the comparison.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import pandas as pd

from dike_slurm.domain.model import JobState
from dike_slurm.parsing.durations import parse_duration
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.tres import parse_tres
from dike_slurm.slurm.accounting import AccountingRecord, read_sacct_parsable2

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def big_dump(rows: int) -> str:
    """The bundled sample's data rows repeated until there are `rows` of them."""
    lines = (ROOT / "examples" / "sample" / "sacct.txt").read_text(encoding="utf-8").splitlines()
    header, data = lines[0], lines[1:]
    repeated = (data * (rows // len(data) + 1))[:rows]
    return "\n".join([header, *repeated]) + "\n"


def read_with_pandas(text: str) -> list[AccountingRecord]:
    """A vectorised pandas reader producing the same records (bad rows are dropped, not counted)."""
    frame = pd.read_csv(
        io.StringIO(text), sep="|", dtype=str, keep_default_na=False, engine="c", on_bad_lines="skip", quoting=3
    )
    frame = frame[~frame["JobID"].str.contains(".", regex=False)]
    ids = frame["JobID"].str.extract(r"^(\d+)(?:_(\d+)|_\[[^\]]*\])?")
    times = {
        column: (pd.to_datetime(frame[column], format="%Y-%m-%dT%H:%M:%S", errors="coerce") - pd.Timestamp(0))
        .dt.total_seconds()
        for column in ("Submit", "Eligible", "Start", "End")
    }
    limits = frame["Timelimit"].map({v: parse_duration(v) for v in frame["Timelimit"].unique()})
    tres_cache = {v: parse_tres(v) for v in pd.unique(pd.concat([frame["AllocTRES"], frame["ReqTRES"]]))}
    held = times["Start"].notna() & (frame["AllocTRES"] != "")
    gpus = frame["AllocTRES"].map(lambda v: tres_cache[v].gpus).where(held, frame["ReqTRES"].map(lambda v: tres_cache[v].gpus))
    nodes = frame["NodeList"].map({v: expand_hostlist(v) for v in frame["NodeList"].unique()})
    states = frame["State"].map({v: JobState.parse(v) for v in frame["State"].unique()})
    columns = zip(
        frame["JobIDRaw"].astype(int), frame["JobID"], ids[0].astype(int), ids[1], frame["JobName"], frame["User"],
        frame["Account"], frame["Partition"], frame["QOS"], states, frame["State"], times["Submit"], times["Eligible"],
        times["Start"], times["End"], pd.to_numeric(frame["ElapsedRaw"]), limits, pd.to_numeric(frame["NNodes"]),
        pd.to_numeric(frame["NCPUS"]), gpus, nodes, pd.to_numeric(frame["Priority"], errors="coerce"), frame["Flags"],
    )
    records = []
    for (raw, display, base, task, name, user, account, partition, qos, state, state_text, submit, eligible, start,
         end, elapsed, limit, num_nodes, cpus, gpu_count, node_names, priority, flags) in columns:
        array_task = int(task) if isinstance(task, str) else None
        records.append(AccountingRecord(
            job_id=raw, display_id=display, array_job_id=base if "_" in display else None, array_task_id=array_task,
            name=name, user=user, account=account, partition=partition, qos=qos, state=state, state_text=state_text,
            submit=None if pd.isna(submit) else submit, eligible=None if pd.isna(eligible) else eligible,
            start=None if pd.isna(start) else start, end=None if pd.isna(end) else end, elapsed_s=int(elapsed),
            time_limit_s=None if pd.isna(limit) else int(limit), num_nodes=int(num_nodes) or 1, cpus=int(cpus) or 1,
            gpus=int(gpu_count), nodes=node_names, priority=None if pd.isna(priority) else int(priority), flags=flags,
        ))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "accounting_read.json")
    args = parser.parse_args(argv)
    text = big_dump(args.rows)
    started = time.process_time()
    ours = read_sacct_parsable2(text, "bench")
    ours_s = time.process_time() - started
    started = time.process_time()
    theirs = read_with_pandas(text)
    pandas_s = time.process_time() - started
    same = len(theirs) == len(ours.records) and all(
        (a.job_id, a.gpus, a.start, a.end, a.time_limit_s, a.nodes) == (b.job_id, b.gpus, b.start, b.end, b.time_limit_s, b.nodes)
        for a, b in zip(ours.records, theirs)
    )
    result = {
        "rows": args.rows,
        "records": len(ours.records),
        "str_split_cpu_s": round(ours_s, 2),
        "pandas_cpu_s": round(pandas_s, 2),
        "same_records": same,
        "faster": "str.split" if ours_s <= pandas_s else "pandas",
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
