"""Corpus evaluation (`dike-slurm eval`, `make eval`): every case under every policy.

What runs (cases, policies, settings, seeds, the corpus's targets.toml) and the run itself, into
one JSON-ready result; sim/eval/eval_report.py, which it imports, turns it into the overall and
targets tables and the files.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dike_slurm.errors import InputError
from dike_slurm.sim.eval.eval_report import (
    BASELINE_SETTING,
    FIFO,
    MULTIFACTOR,
    check_targets,
    gpu_type_invariant,
    overall,
    pareto,
)
from dike_slurm.sim.eval.targets import TARGETS_FILE, TargetSet, find_targets_file, load_targets

CASE_FILES = ("sacct.txt", "slurm.conf", "topology.conf")
CASE_HISTORY = "history.txt"  # optional: the case's earlier dump, its warm start (sim/kernel/warm.py)


def case_history(folder: Path) -> Path | None:
    """The folder's history.txt, the warm start of the dump beside it; None: the replay starts cold."""
    history = folder / CASE_HISTORY
    return history if history.is_file() else None


@dataclass(frozen=True)
class Variant:
    """A policy as the evaluation runs it: a label, the registry name, parameter overrides."""

    label: str
    policy: str
    params_override: dict | None = None
    preemptive: bool = False  # also run with half of the jobs preemptible
    cost: int = 1  # relative replay time: the slowest replays are started first


# The policies evaluated, in table order; one line per variant.
VARIANTS: tuple[Variant, ...] = (
    Variant("fifo", "fifo"),
    Variant("multifactor", "multifactor"),
    Variant("tiresias", "tiresias", preemptive=True, cost=3),
    Variant("srtf_oracle", "srtf_oracle", cost=2),
    Variant("srtf_preemptive", "srtf_oracle", {"preemptive": True}, preemptive=True, cost=4),
    Variant("dike", "dike", preemptive=True, cost=8),
    # the paper's information-agnostic Dike: attained service only, no service prior
    Variant("dike_agnostic", "dike", {"service_prior": False}, preemptive=True, cost=8),
)
QUICK_VARIANTS = ("fifo", "srtf_preemptive", "dike")


@dataclass(frozen=True)
class Setting:
    """Replay conditions: communication penalty, share of preemptible jobs, seeds (mean reported)."""

    key: str
    label: str
    comm_penalty: float
    preemptible: float
    seeds: tuple[int, ...] = (0,)
    preemptive_only: bool = False


SETTINGS: tuple[Setting, ...] = (
    Setting("pen0", "pen 0", 0.0, 1.0),
    Setting("pen1_none", "pen 1 NONE", 1.0, 0.0, preemptive_only=True),
    Setting("pen1_half", "pen 1 HALF", 1.0, 0.5, (0, 1), preemptive_only=True),
    Setting("pen1", "pen 1", 1.0, 1.0),
)
QUICK_SETTINGS = ("pen1",)


# The seed of every shuffled twin's permutations (sim/tracegen/shuffle.py).
TWIN_SEED = 1
TWIN_SUFFIX = "-shuffled"


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    twin_of: str | None = None  # a shuffled twin: the case whose trace it shuffles (TWIN_SEED)


@dataclass(frozen=True)
class Plan:
    """What one evaluation runs."""

    cases: tuple[Case, ...]
    variants: tuple[Variant, ...]
    settings: tuple[Setting, ...]
    skipped: tuple[str, ...] = ()  # variants left out, with why
    targets: tuple[TargetSet, ...] = ()  # the acceptance targets, from targets_file
    targets_file: Path | None = None

    def runs(self) -> int:
        count = 0
        for setting in self.settings:
            variants = [v for v in self.variants if v.preemptive or not setting.preemptive_only]
            count += len(variants) * len(setting.seeds)
        return count * len(self.cases)


# ---------------------------------------------------------------------------------------- input


def find_cases(folders: Sequence[Path]) -> tuple[Case, ...]:
    """Case folders: a folder holding any case file is a case, else each sub-folder is one.

    A corpus's cases.json, when present, gives the order. A missing file is one InputError.
    """
    cases: list[Case] = []
    for folder in folders:
        if not folder.is_dir():
            raise InputError("not a folder", source=str(folder))
        if _is_case(folder):
            cases.append(_case(folder))
            continue
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        order = _listed_order(folder)
        subfolders.sort(key=lambda p: (order.get(p.name, len(order)), p.name))
        for name in order:
            if not (folder / name).is_dir():
                raise InputError(f"cases.json lists {name!r} but there is no such folder", source=str(folder))
        if not subfolders:
            raise InputError("no case here (neither sacct.txt nor case folders)", source=str(folder))
        cases.extend(_case(sub) for sub in subfolders)
    seen: dict[str, Path] = {}
    for case in cases:
        if case.name in seen:
            raise InputError(f"two cases are named {case.name!r} ({seen[case.name]} and {case.folder})")
        seen[case.name] = case.folder
    return tuple(cases)


def _is_case(folder: Path) -> bool:
    return any((folder / name).exists() for name in CASE_FILES)


def _case(folder: Path) -> Case:
    missing = [name for name in CASE_FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"case folder is missing {', '.join(missing)}", source=str(folder))
    return Case(folder.resolve().name if folder.name in ("", ".") else folder.name, folder)


def _listed_order(folder: Path) -> dict[str, int]:
    listing = folder / "cases.json"
    if not listing.is_file():
        return {}
    try:
        entries = json.loads(listing.read_text(encoding="utf-8"))
        return {str(entry["case"]): index for index, entry in enumerate(entries)}
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(f"cannot read the case list: {exc}", source=str(listing)) from None


def with_twins(cases: Sequence[Case]) -> tuple[Case, ...]:
    """Each case followed, when its cluster has at most one GPU type, by its shuffled twin: the same
    jobs with users and names shuffled across them, where job history predicts nothing."""
    from dike_slurm.slurm.slurm_conf import load_cluster

    out: list[Case] = []
    for case in cases:
        out.append(case)
        conf, _ = load_cluster(case.folder / "slurm.conf", case.folder / "topology.conf")
        if len({t for node in conf.nodes for t in node.gpu_types}) <= 1:
            out.append(Case(case.name + TWIN_SUFFIX, case.folder, twin_of=case.name))
    return tuple(out)


def make_plan(
    folders: Sequence[Path], *, quick: bool = False, only: Sequence[str] = (), twins: bool = True,
    targets: Path | None = None,
) -> Plan:
    """Cases (each one-type case with its shuffled twin, unless `twins` is False), variants,
    settings and the acceptance targets: the file `targets`, else the corpus's (find_targets_file;
    without one, none are checked, and the plan says so among what it skips); variants whose
    override the policy does not take are skipped."""
    from dike_slurm.registry import default_registry

    cases = find_cases(folders)
    if twins:
        cases = with_twins(cases)
    registry = default_registry()
    known = {v.label for v in VARIANTS}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise InputError(f"unknown variant {unknown[0]!r}; known: {', '.join(sorted(known))}")
    wanted = set(only) if only else (set(QUICK_VARIANTS) if quick else known)
    wanted.add(FIFO)  # the baseline of every ratio
    variants, skipped = [], []
    for variant in VARIANTS:
        if variant.label not in wanted:
            continue
        fields = registry.get(variant.policy).Params.model_fields
        absent = [key for key in (variant.params_override or {}) if key not in fields]
        if absent:
            skipped.append(f"{variant.label}: policy {variant.policy} has no parameter {absent[0]!r} yet")
            continue
        variants.append(variant)
    settings = tuple(s for s in SETTINGS if not quick or s.key in QUICK_SETTINGS)
    targets_file = targets
    if targets_file is None:
        targets_file, looked = find_targets_file(folders, _is_case)
        if targets_file is None:
            skipped.append(f"targets: no {TARGETS_FILE} beside the cases ({', '.join(map(str, looked))}): "
                           "none checked (--targets FILE names one)")
    target_sets = () if targets_file is None else load_targets(
        targets_file, variants=[v.label for v in VARIANTS], settings=[s.key for s in SETTINGS])
    return Plan(cases, tuple(variants), settings, tuple(skipped), target_sets, targets_file)


def load_config(path: Path | None):
    """Config defaults, or the explicit file (never $DIKE_CONFIG nor DIKE_* variables)."""
    from dike_slurm.config import Config, load_config as load

    return Config() if path is None else load(path, environ={})


# ---------------------------------------------------------------------------------------- running


def _replay_groups(plan: Plan) -> dict[tuple[float, int], list[tuple[Setting, Variant]]]:
    """The replays of every case, one settings object per (share preemptible, seed); the penalty is
    per task."""
    groups: dict[tuple[float, int], list[tuple[Setting, Variant]]] = {}
    for setting in plan.settings:
        for seed in setting.seeds:
            for variant in plan.variants:
                if setting.preemptive_only and not variant.preemptive:
                    continue
                groups.setdefault((setting.preemptible, seed), []).append((setting, variant))
    return groups


def evaluate(
    plan: Plan,
    config,
    *,
    workers: int = 2,
    command: str = "",
    log: Callable[[str], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Run every replay of the plan and return the whole result (JSON-ready, every number).
    `on_progress(jobs_replayed, jobs_in_all_replays)` is called as the replays advance."""
    from dike_slurm.sim.kernel.replay import load_input

    log = log or (lambda _line: None)
    started = time.perf_counter()
    git = _git_state()  # the code the replays run, not what was committed meanwhile
    inputs = _case_inputs(plan.cases, load_input)
    groups = _replay_groups(plan)
    total_jobs = sum(len(inputs[case.name].trace.jobs) * len(members) for case in plan.cases for members in groups.values())
    progress = _Progress(total_jobs, on_progress)
    case_results = [_evaluate_case(case, inputs[case.name], groups, plan, config, workers, log, progress)
                    for case in plan.cases]
    result = {
        "command": command,
        "git": git,
        "quick": plan.settings != SETTINGS,
        "workers": workers,
        "variants": [asdict(v) for v in plan.variants],
        "skipped_variants": list(plan.skipped),
        "settings": [asdict(s) for s in plan.settings],
        "replay_config": config.replay.model_dump(mode="json"),
        "policy_params": {v.label: {**config.policy_params(v.policy).model_dump(mode="json"), **(v.params_override or {})}
                          for v in plan.variants},
        "cases": case_results,
    }
    _tabulate(result, plan)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


@dataclass
class _Progress:
    """Jobs replayed so far out of every replay's, reported as each replay finishes."""

    total_jobs: int
    on_progress: Callable[[int, int], None] | None
    replayed_jobs: int = 0

    def group(self) -> Callable[[int, int], None]:
        """The callback of one group of replays run side by side: replay index -> its jobs done."""
        done_before, finished = self.replayed_jobs, {}

        def advance(index: int, jobs: int) -> None:
            finished[index] = jobs
            if self.on_progress is not None:
                self.on_progress(done_before + sum(finished.values()), self.total_jobs)
        return advance


def _evaluate_case(case: Case, replay_input, groups: dict, plan: Plan, config, workers: int,
                   log: Callable[[str], None], progress: _Progress) -> dict:
    """Every replay of one case, as its entry of the result."""
    from dike_slurm.sim.kernel.replay import ReplayTask, run_tasks, sim_settings

    case_started = time.perf_counter()
    log(f"{case.name}: {len(replay_input.trace.jobs)} jobs")
    runs, used = [], {}
    for (preemptible, seed), members in groups.items():
        members.sort(key=lambda member: -member[1].cost)  # stable: table order within a cost
        settings = sim_settings(config, replay_input.conf, seed=seed, preemptible=preemptible,
                                source=str(case.folder / "slurm.conf"))
        tasks = [ReplayTask(v.label, v.policy, s.comm_penalty, params_override=v.params_override) for s, v in members]
        # comm_penalty is per run (runs[].comm_penalty), not this object's
        used[f"preemptible={preemptible:g} seed={seed}"] = {
            key: value for key, value in asdict(settings).items() if key != "comm_penalty"}
        group_started = time.perf_counter()
        results = run_tasks(tasks, replay_input, config, settings, workers=workers, on_progress=progress.group())
        progress.replayed_jobs += len(replay_input.trace.jobs) * len(tasks)
        for (setting, variant), run in zip(members, results):
            runs.append({
                "variant": variant.label, "setting": setting.key, "seed": seed,
                "comm_penalty": setting.comm_penalty, "preemptible": preemptible,
                "summary": dict(run.metrics.summary), "wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
                # the mixed-GPU invariant: every start of a typed job was checked against its nodes' types
                "starts": run.stats.starts, "typed_starts": run.stats.typed_starts,
            })
        log(f"{case.name}: {len(tasks)} replays (preemptible {preemptible:g}, seed {seed}) "
            f"in {time.perf_counter() - group_started:.0f} s")
    gpu_types = sorted({t for node in replay_input.conf.nodes for t in node.gpu_types})
    return {
        "name": case.name,
        "folder": str(case.folder),
        "twin_of": case.twin_of,
        "gpu_types": gpu_types,
        # mixed GPU generations: tabled on their own, outside the overall means
        "heterogeneous": len(gpu_types) > 1,
        "input": replay_input.input_summary(),
        "avg_run_h": _avg_run_h(replay_input),
        "sim_settings": used,
        "runs": runs,
        "rows": _rows(runs, plan),
        "wall_s": round(time.perf_counter() - case_started, 1),
        "cpu_s": round(sum(run["cpu_s"] for run in runs), 1),
    }


def _tabulate(result: dict, plan: Plan) -> None:
    """The overall means, the invariant, the targets and the frontier, from the cases' rows."""
    result["overall"] = overall(result)
    result["heterogeneous_overall"] = overall(result, heterogeneous=True)
    result["gpu_type_invariant"] = gpu_type_invariant(result)
    result["targets_file"] = None if plan.targets_file is None else str(plan.targets_file)
    result["twin_seed"] = TWIN_SEED
    check_targets(result, plan.targets)
    result["twin_overall"] = overall(result, twins=True)
    result["pareto"] = pareto(result)


def _case_inputs(cases: Sequence[Case], load_input) -> dict:
    """Each case's replay input, each folder read once, warm where the folder holds a history.txt:
    a twin's is its case's, with users and names shuffled across the jobs (its history's with them)."""
    from dike_slurm.sim.tracegen.shuffle import shuffled_twin

    read: dict[Path, object] = {}
    inputs = {}
    for case in cases:
        replay_input = read.get(case.folder)
        if replay_input is None:
            replay_input = read[case.folder] = load_input(*(case.folder / name for name in CASE_FILES),
                                                          case_history(case.folder))
        if case.twin_of is not None:
            replay_input = shuffled_twin(replay_input, TWIN_SEED)
        inputs[case.name] = replay_input
    return inputs


def _avg_run_h(replay_input) -> float | None:
    durations = [job.duration_s for job in replay_input.trace.jobs]
    return sum(durations) / len(durations) / 3600.0 if durations else None


def _git_state() -> dict:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    modified = [line[3:] for line in dirty.stdout.splitlines() if line.strip()]
    return {"commit": head.stdout.strip(), "dirty": bool(modified), "modified": modified}


def _rows(runs: list[dict], plan: Plan) -> list[dict]:
    """One row per (setting, variant): the seeds' mean of every numeric metric, and fifo/policy."""
    rows = []
    for setting in plan.settings:
        for variant in plan.variants:
            mine = [r for r in runs if r["setting"] == setting.key and r["variant"] == variant.label]
            if not mine:
                continue
            rows.append({
                "setting": setting.key,
                "variant": variant.label,
                "metrics": _mean([r["summary"] for r in mine]),
                "seeds": {str(r["seed"]): r["summary"]["avg_jct_s"] for r in mine},
            })
    for row in rows:
        for baseline in (FIFO, MULTIFACTOR):
            base = next((r for r in rows if r["variant"] == baseline
                         and r["setting"] == BASELINE_SETTING.get(row["setting"], row["setting"])), None)
            row[f"{baseline}_ratio"] = _ratio(base["metrics"]["avg_jct_s"], row["metrics"]["avg_jct_s"]) if base else None
            row[f"{baseline}_ratio_seeds"] = {
                seed: _ratio(base["metrics"]["avg_jct_s"], value) for seed, value in row["seeds"].items()
            } if base else {}
    return rows


def _mean(summaries: list[dict]) -> dict:
    if len(summaries) == 1:
        return dict(summaries[0])
    merged = {}
    for key, value in summaries[0].items():
        values = [s[key] for s in summaries]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = sum(values) / len(values)
    return merged


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator
