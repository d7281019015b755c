"""The corpus evaluation's result as tables: overall geometric means, the targets (the corpus's
targets.toml, checked by sim/eval/targets.py), the per-case tables, and the files `dike-slurm
eval` writes (eval.json, results.md, report.html, the generated section of docs/results.md). Computation only, then rendering; no replays.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dike_slurm.errors import InputError
from dike_slurm.sim.eval.targets import CASE_GROUPS, TargetSet, check_set

FIFO = "fifo"  # the baseline of every ratio
MULTIFACTOR = "multifactor"
EVERY_PREEMPTIBLE = "pen1"  # penalty 1, every job preemptible: the plot's and the headroom's setting
# A setting that runs only the preemptive variants borrows the others' rows from this one: fifo,
# multifactor and the non-preemptive oracle never preempt, so which jobs may be preempted does not
# change them.
BASELINE_SETTING = {"pen1_none": "pen1", "pen1_half": "pen1"}

RESULTS_BEGIN = "<!-- eval:begin (written by `dike-slurm eval --results`; edit above or below, not inside) -->"
RESULTS_END = "<!-- eval:end -->"


def row_of(case: dict, variant: str, setting: str) -> dict | None:
    """The case's row of one variant in one setting (None when it did not run)."""
    return next((r for r in case["rows"] if r["variant"] == variant and r["setting"] == setting), None)


def row_or_baseline(case: dict, variant: dict, setting: str) -> dict | None:
    """The row, or for a variant that never preempts (it does not run in the settings that borrow),
    its row in the setting this one borrows from: fifo, multifactor and the non-preemptive oracle
    are the same whichever jobs may be preempted."""
    row = row_of(case, variant["label"], setting)
    if row is None and setting in BASELINE_SETTING and not variant["preemptive"]:
        return row_of(case, variant["label"], BASELINE_SETTING[setting])
    return row


def _geomean(ratios: list[float]) -> dict:
    return {"geomean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)), "min": min(ratios),
            "max": max(ratios), "cases": len(ratios)}


def cases_of(result: dict, heterogeneous: bool = False, twins: bool | None = False) -> list[dict]:
    """The cases on one GPU type, or (`heterogeneous`) those whose cluster mixes GPU types: the
    mixed ones have their own tables, outside the overall means and the targets. `twins`:
    False the cases as given, True only their shuffled twins, None both."""
    return [case for case in result["cases"] if case.get("heterogeneous", False) == heterogeneous
            and (twins is None or (case.get("twin_of") is not None) == twins)]


def overall(result: dict, heterogeneous: bool = False, twins: bool = False) -> dict:
    """Per variant and setting, the geometric mean over cases of fifo/policy and of
    multifactor/policy average JCT (min, max, cases); over the mixed-GPU cases with `heterogeneous`,
    over the shuffled twins with `twins`."""
    table = {}
    cases = cases_of(result, heterogeneous, twins)
    for setting in result["settings"]:
        for variant in result["variants"]:
            cell = {}
            for baseline in (FIFO, MULTIFACTOR):
                ratios = [row[f"{baseline}_ratio"] for case in cases
                          if (row := row_or_baseline(case, variant, setting["key"])) and row.get(f"{baseline}_ratio")]
                if ratios:
                    cell[baseline] = _geomean(ratios)
            if cell:
                table.setdefault(variant["label"], {})[setting["key"]] = cell
    return table


def gpu_type_invariant(result: dict) -> dict:
    """The mixed-GPU invariant, no job runs on a GPU type it did not ask for, over every replay: per
    case the starts, the typed starts the simulator checked against their nodes' types, and the
    violations. The simulator stops a replay at the first (sim.cluster.WrongGpuType), so an
    evaluation that finished has none."""
    cases = [{"case": case["name"], "gpu_types": case.get("gpu_types", []), "replays": len(case["runs"]),
              "starts": sum(r.get("starts", 0) for r in case["runs"]),
              "typed_starts": sum(r.get("typed_starts", 0) for r in case["runs"]), "violations": 0}
             for case in result["cases"]]
    return {"cases": cases, **{key: sum(c[key] for c in cases) for key in ("replays", "starts", "typed_starts",
                                                                         "violations")}}


# ---------------------------------------------------------------------------------------- targets

def check_targets(result: dict, target_sets: Sequence[TargetSet]) -> None:
    """Each target set's PASS/FAIL per case and criterion into `result`, under the set's key, in
    the file's order (`target_sets`)."""
    for target_set in target_sets:
        result[target_set.key] = check_set(target_set, cases_of(result, twins=CASE_GROUPS[target_set.cases]))
    result["target_sets"] = [target_set.key for target_set in target_sets]


def pareto(result: dict) -> dict:
    """Per setting and policy, over the one-type cases and over their twins: the geometric means
    of the policy's average JCT and worst-user slowdown against the baseline's (multifactor's, else
    fifo's where multifactor did not run; below 1 is better), and the policies that are at least as
    good on both and better on one (it is dominated). Empty without a one-type case."""
    ran = {row["variant"] for case in result["cases"] for row in case["rows"]}
    baseline = MULTIFACTOR if MULTIFACTOR in ran else FIFO
    out: dict = {}
    for twins in (False, True):
        cases = cases_of(result, twins=twins)
        for setting in result["settings"]:
            points = {}
            for variant in result["variants"]:
                jct, worst = [], []
                for case in cases:
                    row = row_or_baseline(case, variant, setting["key"])
                    base = row_of(case, baseline, BASELINE_SETTING.get(setting["key"], setting["key"]))
                    if row is None or base is None:
                        continue
                    m, b = row["metrics"], base["metrics"]
                    if m["avg_jct_s"] > 0 and b["avg_jct_s"] > 0 and m["worst_user_slowdown"] > 0 and b["worst_user_slowdown"] > 0:
                        jct.append(m["avg_jct_s"] / b["avg_jct_s"])
                        worst.append(m["worst_user_slowdown"] / b["worst_user_slowdown"])
                if jct:
                    points[variant["label"]] = {"jct": _geomean(jct)["geomean"], "worst_user": _geomean(worst)["geomean"],
                                                "cases": len(jct)}
            for label, point in points.items():
                point["dominated_by"] = sorted(
                    other for other, p in points.items() if other != label
                    and p["jct"] <= point["jct"] and p["worst_user"] <= point["worst_user"]
                    and (p["jct"] < point["jct"] or p["worst_user"] < point["worst_user"]))
            if points:
                out.setdefault("twins" if twins else "cases", {})[setting["key"]] = points
    return {"baseline": baseline, **out} if out else {}


# ---------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


CASE_HEADERS = [
    "setting", "policy", "avg JCT", "p95 JCT", "p99 JCT", "avg wait", "worst user", "Jain",
    "preempt", "lost GPU-h", "lost", "max/job", "p99/job", "fifo/policy", "multifactor/policy",
]
LEGEND = (
    "Settings, all at communication penalty 1 unless named: NONE = no job preemptible (the day a site "
    "switches Dike on: live preemption is opt-in); HALF = half of the jobs preemptible (drawn per job; the "
    "jobs that checkpoint), mean of seeds 0 and 1; pen 1 = every job preemptible; pen 0 = penalty 0, every "
    "job preemptible. fifo, multifactor (Slurm's own priority, what a site runs) and srtf_oracle never "
    "preempt: the NONE and HALF tables take their pen 1 rows. Times in hours; worst user = worst-user "
    "slowdown; Jain = Jain fairness index of the users' mean slowdowns; preempt = preemptions; lost = share "
    "of GPU-hours lost to preemption; max/job, p99/job = preemptions per job; fifo/policy, "
    "multifactor/policy = the baseline's avg JCT / the policy's (above 1 is better)."
)


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _headroom(case: dict) -> str:
    fifo = row_of(case, FIFO, EVERY_PREEMPTIBLE)
    if fifo is None or not case["avg_run_h"]:
        return ""
    return f"; fifo avg JCT / avg run time at pen 1: {fifo['metrics']['avg_jct_s'] / 3600 / case['avg_run_h']:.2f}"


def _ratio_cell(row: dict, baseline: str) -> str:
    text = _num(row.get(f"{baseline}_ratio"), ".3f")
    seeds = row.get(f"{baseline}_ratio_seeds") or {}
    if len(seeds) > 1:
        text += " (" + " / ".join(_num(v, ".3f") for v in seeds.values()) + ")"
    return text


def _target_table(title: str, targets_of: dict, note: str) -> Table:
    criteria = targets_of["criteria"]
    rows = [[entry["case"]] + [f"{entry['cells'][c['key']]['status']} {entry['cells'][c['key']]['value']}".strip()
                               for c in criteria] for entry in targets_of["cases"]]
    passed = sum(cell["status"] == "PASS" for e in targets_of["cases"] for cell in e["cells"].values())
    failed = sum(cell["status"] == "FAIL" for e in targets_of["cases"] for cell in e["cells"].values())
    return Table(title, ["case"] + [c["label"] for c in criteria], rows, [f"{passed} PASS, {failed} FAIL. {note}"])


def tables(result: dict) -> list[Table]:
    """Finished tables (strings) for the terminal, markdown and HTML: overall per setting, targets,
    then the cases."""
    labels = {s["key"]: s["label"] for s in result["settings"]}
    out = _overall_tables(result, result["overall"], "overall, {label}: geometric mean over cases",
                          f"{len(cases_of(result))} cases; above 1 is better than the baseline.")
    twins = cases_of(result, twins=True)
    if twins:
        out += _overall_tables(
            result, result.get("twin_overall") or overall(result, twins=True),
            "shuffled twins, {label}: geometric mean over the twins",
            f"{len(twins)} twins: each one-type case with users and job names shuffled across its jobs, so that job "
            "history predicts nothing; above 1 is better than the baseline.")
    for key in result.get("target_sets", ()):  # a set has no case when every case evaluated mixes GPU types
        if result[key]["cases"]:
            note = result[key]["note"].replace("{twin_seed}", str(result.get("twin_seed", "?")))
            out.append(_target_table(result[key]["title"], result[key], note))
    if result.get("pareto"):
        out += _pareto_tables(result)
    skipped = ["Not run: " + "; ".join(result["skipped_variants"]) + "."] if result["skipped_variants"] else []
    if out:
        out[-1].notes.extend(skipped)
        skipped = []
    mixed = cases_of(result, heterogeneous=True)
    if mixed:
        out += _overall_tables(
            result, result.get("heterogeneous_overall") or overall(result, heterogeneous=True),
            "mixed GPU generations, {label}: geometric mean over the heterogeneous cases",
            f"{len(mixed)} cases whose clusters mix GPU types ({', '.join(c['name'] for c in mixed)}), outside the "
            "overall means and the targets above; above 1 is better than the baseline.")
    if "gpu_type_invariant" in result:
        out.append(_invariant_table(result["gpu_type_invariant"]))
    if out:
        out[-1].notes.extend(skipped)
    for case in result["cases"]:
        rows = []
        for row in case["rows"]:
            m = row["metrics"]
            rows.append([
                labels[row["setting"]], row["variant"], _hours(m["avg_jct_s"]), _hours(m["p95_jct_s"]),
                _hours(m["p99_jct_s"]), _hours(m["avg_wait_s"]), _num(m["worst_user_slowdown"], ".2f"),
                _num(m["user_jain_index"], ".3f"), _num(m["preemptions"], ".0f"), _num(m["preemption_lost_gpu_h"], ".1f"),
                _num(m["lost_gpu_fraction"], ".2%"), _num(m["max_preemptions_per_job"], "g"),
                _num(m["p99_preemptions_per_job"], "g"), _ratio_cell(row, FIFO), _ratio_cell(row, MULTIFACTOR),
            ])
        info = case["input"]
        mixed_types = f" of {len(case['gpu_types'])} types ({', '.join(case['gpu_types'])})" if case.get(
            "heterogeneous") else ""
        notes = [f"{info['jobs_replayed']} jobs on {info['gpus']} GPUs{mixed_types} ({info['nodes']} nodes, "
                 f"{info['leaf_switches']} leaf switches), average run time {_num(case['avg_run_h'], '.2f')} h"
                 f"{_headroom(case)}; replays took {case['wall_s']:.0f} s ({case['cpu_s']:.0f} CPU-s)."]
        if any(row["setting"] in BASELINE_SETTING for row in case["rows"]):
            notes.append("NONE and HALF rows: the preemptive policies (HALF: mean of seeds 0 and 1, brackets: each "
                         "seed's ratio); their baselines are the pen 1 rows (fifo and multifactor never preempt).")
        out.append(Table(f"case {case['name']}", list(CASE_HEADERS), rows, notes))
    return out


def _pareto_tables(result: dict) -> list[Table]:
    """One table per setting: each policy's average JCT and worst-user slowdown against
    multifactor's, on the cases and on their twins, and what dominates it."""
    out = []
    labels = {s["key"]: s["label"] for s in result["settings"]}
    for setting in result["settings"]:
        rows = []
        for variant in result["variants"]:
            cells = [variant["label"]]
            for group in ("cases", "twins"):
                point = result["pareto"].get(group, {}).get(setting["key"], {}).get(variant["label"])
                cells += (["", "", ""] if point is None else [
                    f"{point['jct']:.3f}", f"{point['worst_user']:.3f}",
                    ", ".join(point["dominated_by"]) if point["dominated_by"] else "frontier"])
            rows.append(cells)
        out.append(Table(
            f"average JCT against worst-user slowdown, {labels[setting['key']]}: geometric mean of "
            f"policy/{result['pareto']['baseline']}",
            ["policy", "JCT (cases)", "worst user (cases)", "dominated by (cases)", "JCT (twins)",
             "worst user (twins)", "dominated by (twins)"], rows,
            [f"Below 1 is better than {result['pareto']['baseline']}. Dominated by: policies at least as good on both and better on one; "
             "frontier: none is."]))
    return out


def _overall_tables(result: dict, table: dict, title: str, note: str) -> list[Table]:
    """One table per setting: each variant's geometric mean of baseline/policy (min-max)."""
    out = []
    for setting in result["settings"]:
        rows = []
        for variant in result["variants"]:
            cell = table.get(variant["label"], {}).get(setting["key"])
            if cell is None:
                continue
            rows.append([variant["label"]] + [
                f"{cell[b]['geomean']:.3f} ({cell[b]['min']:.2f}-{cell[b]['max']:.2f})" if b in cell else "-"
                for b in (FIFO, MULTIFACTOR)
            ])
        if rows:
            out.append(Table(f"{title.format(label=setting['label'])} of baseline/policy avg JCT (min-max)",
                             ["policy", "fifo/policy", "multifactor/policy"], rows, [note]))
    return out


def _invariant_table(invariant: dict) -> Table:
    rows = [[c["case"], ", ".join(c["gpu_types"]) or "untyped", str(c["replays"]), str(c["starts"]),
             str(c["typed_starts"]), str(c["violations"])] for c in invariant["cases"]]
    rows.append(["all", "", str(invariant["replays"]), str(invariant["starts"]), str(invariant["typed_starts"]),
                 str(invariant["violations"])])
    return Table(
        "invariant: no job runs on a GPU type it did not ask for, over every start of every replay",
        ["case", "GPU types", "replays", "starts", "typed starts checked", "violations"], rows,
        ["Every start of a job that asks for GPU types (typed GRES, or a constraint naming them) is checked against "
         "the GPU types of the nodes it starts on; a job that asks for none may run on any. A violation stops the "
         "replay (WrongGpuType), so an evaluation that finished shows 0."])


def markdown(result: dict, table_list: Sequence[Table]) -> str:
    """The generated section of docs/results.md: the command, then every table."""
    git = result["git"]
    modified = [path for path in git.get("modified", []) if path.startswith(("policies/", "sim/", "dike_slurm/"))]
    commit = (git["commit"] or "unknown")[:12] + (" (with uncommitted changes" + (
        f" to {', '.join(modified[:6])}{' ...' if len(modified) > 6 else ''}" if modified else "") + ")"
        if git["dirty"] else "")
    lines = [
        f"Made by `{result['command']}` at commit {commit}, {result['workers']} workers, "
        f"{result['wall_s'] / 60:.1f} min of replays.",
        "",
        LEGEND,
        "",
    ]
    for table in table_list:
        lines += [f"### {table.title}", "", "| " + " | ".join(table.headers) + " |",
                  "|" + "|".join("---" for _ in table.headers) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table.rows]
        lines += [""] + [f"{note}" for note in table.notes] + [""]
    return "\n".join(lines).rstrip() + "\n"


def splice_results(text: str, section: str, source: str) -> str:
    """docs/results.md with its generated section replaced (the markers must be there)."""
    begin, end = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
    if begin < 0 or end < begin:
        raise InputError(f"has no generated section (the lines {RESULTS_BEGIN!r} and {RESULTS_END!r})", source=source)
    return text[: begin + len(RESULTS_BEGIN)] + "\n\n" + section + "\n" + text[end:]


def check_results_file(path: Path) -> None:
    """Fail before any replay when the results file cannot take the section."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=str(path)) from None
    splice_results(text, "", str(path))


# ---------------------------------------------------------------------------------------- files


def _plot_uri(result: dict) -> str | None:
    """A bar chart of fifo/policy avg JCT per case at penalty 1 (matplotlib, imported here)."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in result["cases"] if row_of(c, FIFO, EVERY_PREEMPTIBLE)]
    variants = [v["label"] for v in result["variants"] if v["label"] != FIFO]
    if not cases or not variants:
        return None
    figure, axes = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(variants)
    for index, label in enumerate(variants):
        values = [(row_of(c, label, EVERY_PREEMPTIBLE) or {}).get("fifo_ratio") or 0.0 for c in cases]
        axes.bar([x + index * width for x in range(len(cases))], values, width, label=label)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([x + width * (len(variants) - 1) / 2 for x in range(len(cases))])
    axes.set_xticklabels([c["name"] for c in cases], rotation=15, fontsize=8)
    axes.set_ylabel("fifo / policy avg JCT")
    axes.set_yscale("log")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def render_html(result: dict, table_list: Sequence[Table]) -> str:
    from dike_slurm.sim.eval.report import template_environment

    template = template_environment().get_template("eval.html.j2")
    git = result["git"]
    return template.render(
        command=result["command"],
        commit=(git["commit"] or "unknown")[:12] + (" (dirty)" if git["dirty"] else ""),
        wall_min=f"{result['wall_s'] / 60:.1f}",
        legend=LEGEND,
        tables=list(table_list),
        plot=_plot_uri(result),
    )


def write_outputs(result: dict, out: Path, *, results_md: Path | None = None, html: bool = True) -> list[Table]:
    """eval.json, results.md and report.html into `out` (replaced whole), then docs' section."""
    table_list = tables(result)
    section = markdown(result, table_list)
    files = {
        "eval.json": json.dumps(result, indent=2, default=str) + "\n",
        "results.md": section,
    }
    if html:
        try:
            files["report.html"] = render_html(result, table_list)
        except Exception as exc:  # noqa: BLE001 - the report is optional; the numbers are not lost for it
            result["html_error"] = f"{type(exc).__name__}: {exc}"
            files["eval.json"] = json.dumps(result, indent=2, default=str) + "\n"
    spliced = None
    if results_md is not None:
        spliced = splice_results(results_md.read_text(encoding="utf-8"), section, str(results_md))
    out = out.absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        mask = os.umask(0)
        os.umask(mask)
        staging.chmod(0o777 & ~mask)  # mkdtemp's 0700 would outlive the rename
    except OSError as exc:
        raise InputError(f"cannot create the output folder: {exc.strerror}", source=str(out)) from None
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "x")
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if spliced is not None and results_md is not None:
        temporary = results_md.with_name(f".{results_md.name}.tmp")
        temporary.write_text(spliced, encoding="utf-8")
        os.replace(temporary, results_md)
    return table_list
