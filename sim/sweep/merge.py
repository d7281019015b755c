"""The finished cells of a sweep in one document, one CSV table and one report. Nothing that depends
on where or when a cell ran (host, wall time, job id) enters it: the same SPEC gives the same
merged.json, run locally or on Slurm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError
from dike_slurm.sim.sweep.plan import MERGE, cell_file, json_text, write_atomic
from dike_slurm.sim.sweep.spec import share_text
from dike_slurm.sim.sweep.status import cell_states


def _metric_table() -> list:
    from dike_slurm.sim.eval.report_compare import METRICS

    return [m for m in METRICS if m.better]


def _mean(values: list) -> float | None:
    if any(v is None for v in values) or not values:
        return None
    return sum(values) / len(values)


def merge(out: Path) -> dict:
    """The finished cells in one document (deterministic: no host, time or job id in it)."""
    out = out.resolve()
    plan, states = cell_states(out)
    cells, failed, missing, inputs = [], [], [], {}
    for entry in states:
        description = {k: v for k, v in _read_json(cell_file(out, entry["id"])).items() if k not in ("key",)}
        description["input"] = description["input"]["name"]
        row = {**description, "status": entry["state"]}
        if entry["state"] == "ok":
            row["metrics"] = entry["result"]["summary"]
            inputs.setdefault(description["input"], entry["result"]["input_summary"])
        elif entry["state"] == "failed":
            row["error"] = entry["result"]["error"]
            failed.append({"id": entry["id"], "label": row["label"], "error": row["error"], "log": entry["log"]})
        else:
            row["status"] = "missing"
            missing.append({"id": entry["id"], "label": row["label"], "log": entry["log"],
                            "started": entry["state"] == "started"})
        cells.append(row)
    rows = _rows(cells)
    document = {
        "sweep": {"name": plan["name"], "cells": plan["cells"], "config_sha256": plan["config_sha256"],
                  "grid": plan["grid"]},
        "counts": {"ok": sum(c["status"] == "ok" for c in cells), "failed": len(failed), "missing": len(missing)},
        "inputs": {name: inputs[name] for name in sorted(inputs)},
        "cells": cells,
        "rows": rows,
        "best": _best(rows),
        "failed": failed,
        "missing": missing,
    }
    if plan.get("preset") and plan["preset"].get("kind") == "tune":
        document["tune"] = _tune_pick(plan["preset"], rows)
    return document


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None


def _rows(cells: list[dict]) -> list[dict]:
    """One row per (input, variant, penalty, preemptible): the mean over its seeds, when all are ok."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["input"], cell["label"], cell["comm_penalty"], cell["preemptible"]), []).append(cell)
    rows = []
    for (name, label, penalty, share), members in groups.items():
        ok = [c for c in members if c["status"] == "ok"]
        row: dict[str, Any] = {"input": name, "label": label, "policy": members[0]["policy"],
                               "comm_penalty": penalty, "preemptible": share,
                               "seeds": [c["seed"] for c in members], "seeds_ok": len(ok)}
        if ok and len(ok) == len(members):
            row["metrics"] = {
                key: _mean([c["metrics"].get(key) for c in ok])
                for key, value in ok[0]["metrics"].items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)
            }
        rows.append(row)
    return rows


def _best(rows: list[dict]) -> list[dict]:
    """Per (input, penalty, preemptible) and metric, the variant(s) with the best seed mean."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "metrics" in row:
            groups.setdefault((row["input"], row["comm_penalty"], row["preemptible"]), []).append(row)
    best = []
    for (name, penalty, share), members in groups.items():
        for metric in _metric_table():
            scored = [(r["metrics"].get(metric.key), r["label"]) for r in members if r["metrics"].get(metric.key) is not None]
            if not scored:
                continue
            target = min(v for v, _ in scored) if metric.better == "lower" else max(v for v, _ in scored)
            best.append({"input": name, "comm_penalty": penalty, "preemptible": share, "metric": metric.key,
                         "better": metric.better, "value": target,
                         "labels": [label for value, label in scored if value == target],
                         "variants": len(members)})
    return best


def _tune_pick(preset: dict, rows: list[dict]) -> dict:
    """tune's answer (sim/eval/tune.answer, as `tune` gives it): the candidate thresholds with the
    best average JCT against the configured Dike, or none, and why."""
    from dike_slurm.sim.eval.tune import CONFIGURED, Candidate, answer

    measured = {r["label"]: r["metrics"] for r in rows if "metrics" in r and r["metrics"].get("avg_jct_s") is not None}
    candidates = [Candidate(c["label"], tuple(c["thresholds_gpuh"]), measured[c["label"]])
                  for c in preset.get("candidates", []) if c["label"] in measured]
    if not candidates or CONFIGURED not in measured:
        return {"best": None, "thresholds_gpuh": None, "answer": "tune: the configured Dike or every candidate has no result"}
    return answer(measured[CONFIGURED], candidates, preemptible_jobs=preset.get("preemptible_jobs"),
                  jobs=preset.get("jobs"), preemption_on=preset.get("preemption")).as_dict()


def write_merge(out: Path, document: dict) -> dict[str, Path]:
    """merge/merged.json, merge/summary.csv (a row per cell) and merge/report.md."""
    folder = out.resolve() / MERGE
    folder.mkdir(parents=True, exist_ok=True)
    files = {"json": folder / "merged.json", "csv": folder / "summary.csv", "report": folder / "report.md"}
    write_atomic(files["json"], json_text(document))
    write_atomic(files["csv"], csv_text(document))
    write_atomic(files["report"], report_markdown(document))
    return files


CSV_METRICS = ("avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_wait_s", "makespan_s", "gpu_utilization",
               "avg_slowdown", "user_jain_index", "worst_user_slowdown", "preemptions",
               "heavy_consolidated_fraction", "preemption_lost_gpu_h")


def csv_text(document: dict) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "input", "label", "policy", "comm_penalty", "seed", "preemptible", "status", "jobs",
                     *CSV_METRICS, "error"])
    for cell in document["cells"]:
        metrics = cell.get("metrics", {})
        writer.writerow([cell["id"], cell["input"], cell["label"], cell["policy"], repr(cell["comm_penalty"]),
                         cell["seed"], repr(cell["preemptible"]), cell["status"], metrics.get("jobs", ""),
                         *("" if metrics.get(k) is None else repr(metrics[k]) for k in CSV_METRICS),
                         cell.get("error", "")])
    return buffer.getvalue()


def format_metric(key: str, value: float | None) -> str:
    from dike_slurm.sim.eval.report_compare import METRICS

    if value is None:
        return "-"
    for metric in METRICS:
        if metric.key == key:
            return metric.format(value)
    return f"{value:g}"


REPORT_METRICS = ("avg_jct_s", "p95_jct_s", "avg_wait_s", "gpu_utilization", "user_jain_index",
                  "worst_user_slowdown", "preemptions")


def report_markdown(document: dict) -> str:
    """The report: best per metric, the seed means per variant, failed and missing cells."""
    from dike_slurm.sim.eval.report_compare import METRICS

    labels = {m.key: m.label for m in METRICS}
    sweep, counts = document["sweep"], document["counts"]
    lines = [f"# Sweep {sweep['name']}", "",
             f"{sweep['cells']} cells: {counts['ok']} ok, {counts['failed']} failed, {counts['missing']} missing. "
             "Rows are means over the seeds (a row needs all its seeds ok).", ""]
    groups: dict[tuple, list[dict]] = {}
    for row in document["rows"]:
        groups.setdefault((row["input"], row["comm_penalty"], row["preemptible"]), []).append(row)
    for (name, penalty, share), rows in groups.items():
        lines += [f"## {name}, comm penalty {penalty:g}, preemptible {share_text(share)}", "", "Best per metric:", "",
                  "| metric | best | value |", "|---|---|---|"]
        for best in document["best"]:
            if (best["input"], best["comm_penalty"], best["preemptible"]) == (name, penalty, share):
                lines.append(f"| {labels.get(best['metric'], best['metric'])} ({best['better']} is better) | "
                             f"{', '.join(best['labels'])} | {format_metric(best['metric'], best['value'])} |")
        lines += ["", "| variant | seeds ok | " + " | ".join(labels[k] for k in REPORT_METRICS) + " |",
                  "|---|---|" + "---|" * len(REPORT_METRICS)]
        for row in rows:
            metrics = row.get("metrics", {})
            lines.append(f"| {row['label']} | {row['seeds_ok']}/{len(row['seeds'])} | "
                         + " | ".join(format_metric(k, metrics.get(k)) for k in REPORT_METRICS) + " |")
        lines.append("")
    if document["failed"]:
        lines += ["## Failed cells", "", "| cell | variant | error | log |", "|---|---|---|---|"]
        for cell in document["failed"]:
            error = cell["error"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {cell['id']} | {cell['label']} | {error} | {cell['log']} |")
        lines.append("")
    if document["missing"]:
        lines += ["## Missing cells", "", "| cell | variant | started | log |", "|---|---|---|---|"]
        for cell in document["missing"]:
            lines.append(f"| {cell['id']} | {cell['label']} | {'yes (killed?)' if cell['started'] else 'no'} | {cell['log']} |")
        lines.append("")
    if "tune" in document:
        first, *toml = document["tune"]["answer"].splitlines()  # a recommendation ends with its TOML lines
        lines += ["## tune", "", first, ""] + (["```toml", *toml, "```", ""] if toml else [])
    return "\n".join(lines)
