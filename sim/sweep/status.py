"""A sweep's progress, read from the cells' files (never from Slurm): ok, failed, started or missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dike_slurm.sim.sweep.cell import killed_reason, read_result
from dike_slurm.sim.sweep.plan import log_file, read_plan, started_file


def cell_states(out: Path) -> tuple[dict, list[dict]]:
    """The plan and, per cell, its state read from the files: ok, failed, started or missing."""
    out = out.resolve()
    plan = read_plan(out)
    states = []
    for cell_id, key in enumerate(plan["keys"]):
        result = read_result(out, cell_id, key)
        entry: dict[str, Any] = {"id": cell_id, "log": log_file(cell_id)}
        if result is not None and result.get("status") in ("ok", "failed"):
            entry["state"] = result["status"]
            entry["result"] = result
        elif started_file(out, cell_id).exists():
            entry["state"] = "started"
            try:
                entry["started"] = json.loads(started_file(out, cell_id).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                entry["started"] = {}
            reason = killed_reason(out, cell_id)
            if reason is not None:  # killed: it failed, with no result of its own
                entry["state"] = "failed"
                entry["result"] = {"status": "failed", "error": f"killed ({reason}); no result written"}
        else:
            entry["state"] = "missing"
        states.append(entry)
    return plan, states


def status(out: Path) -> dict:
    """Progress by the cells' files (not Slurm): counts, and the cells not done."""
    plan, states = cell_states(out)
    counts = {state: 0 for state in ("ok", "failed", "started", "missing")}
    for entry in states:
        counts[entry["state"]] += 1
    unfinished = [
        {"id": e["id"], "state": e["state"], "log": e["log"],
         **({"error": e["result"]["error"]} if e["state"] == "failed" else {}),
         **({"host": e["started"].get("host"), "slurm_job": e["started"].get("slurm_job")} if e["state"] == "started" else {})}
        for e in states if e["state"] != "ok"
    ]
    wall = [e["result"]["run"]["wall_s"] for e in states if e["state"] == "ok" and "run" in e["result"]]
    return {
        "sweep": plan["name"], "folder": str(out.resolve()), "cells": plan["cells"], "counts": counts,
        "done": counts["ok"] == plan["cells"], "cell_wall_s": round(sum(wall), 1), "unfinished": unfinished,
    }


def unfinished_ids(out: Path, *, include_started: bool = True) -> list[int]:
    """Cells without a result of status ok (failed ones are run again: a failure may be transient)."""
    _, states = cell_states(out)
    return [e["id"] for e in states if e["state"] != "ok" and (include_started or e["state"] != "started")]
