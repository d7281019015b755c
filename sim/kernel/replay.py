"""Replaying a dump through several policies: loading, running, and the files it writes."""

from __future__ import annotations

import gc
import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

from dike_slurm.slurm.accounting_json import read_sacct_file
from dike_slurm.config import Config
from dike_slurm.errors import InputError
from dike_slurm.domain.head_window import window_size
from dike_slurm.domain.model import Topology
from dike_slurm.slurm.slurm_conf import ClusterConf, load_cluster
from dike_slurm.parsing.slurm_options import DEFAULT_BF_MAX_JOB_TEST, option_int, scheduler_depth, scheduler_parameters
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.dike import DikeParams
from dike_slurm.registry import default_registry
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.metrics import MetricsCollector, PolicyMetrics, summarise
from dike_slurm.sim.kernel.records import SimSettings, SimStats, Timeline
from dike_slurm.sim.kernel.simulator import Simulator
from dike_slurm.sim.kernel.trace import TraceBuild, build_trace, case_name
from dike_slurm.sim.kernel.warm import History, read_history
from dike_slurm.domain.slurm_priority import SlurmPriorityModel, effective_span, protection_reserve

# Slurm's defaults for the SchedulerParameters the simulator honours.
DEFAULT_MAX_SWITCH_WAIT_S = 300
DEFAULT_BF_WINDOW_MIN = 1440
DEFAULT_BF_INTERVAL_S = 30
DEFAULT_CRED_EXPIRE_S = 120  # AuthInfo cred_expire
DEFAULT_SCHED_INTERVAL_S = 60
DEFAULT_BATCH_SCHED_DELAY_S = 3
TIMELINE_BINS = 200


@dataclass(frozen=True)
class ReplayInput:
    """A dump turned into replayable jobs, with the cluster it replays on.

    The accounting records themselves are not kept: once the trace is built only their counts
    are needed, and a long dump's records would double the replay's memory.
    """

    dump: Path
    rows: int
    records: int
    skipped: dict[str, int]
    jobs_in_dump: int
    trace: TraceBuild
    conf: ClusterConf
    topology: Topology
    has_comment: bool = False  # the dump has the jobs' Comment: the engine's opt-in tag can be seen
    history: History | None = None  # the warm start (--history); None: the replay starts cold

    @property
    def case(self) -> str:
        return case_name(self.dump)

    def input_summary(self) -> dict:
        """The `input` section of summary.json."""
        return {
            "dump": self.dump.name,
            "rows": self.rows,
            "records": self.records,
            "skipped_rows": dict(self.skipped),
            "jobs_in_dump": self.jobs_in_dump,
            "jobs_replayed": len(self.trace.jobs),
            "jobs_not_replayed": dict(self.trace.excluded),
            "adjustments": dict(self.trace.notes),
            "nodes": len([n for n in self.conf.nodes if n.available]),
            "gpus": sum(n.gpus for n in self.conf.nodes if n.available),
            "leaf_switches": len(self.topology.leaves),
            "history": self.history.summary() if self.history is not None else None,
        }


def load_input(dump: Path, slurm_conf: Path, topology_conf: Path | None, history: Path | None = None) -> ReplayInput:
    """Read the dump and the cluster, and the earlier dump `history` for a warm start (sim/kernel/warm.py);
    a dump with nothing to replay is an error."""
    conf, topology = load_cluster(slurm_conf, topology_conf)
    read = read_sacct_file(dump)
    trace = build_trace(read.records, conf)
    if not trace.jobs:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in {**read.skipped, **trace.excluded}.items())
        raise InputError(f"no job to replay ({reasons or 'no data rows'})", source=str(dump))
    jobs_in_dump = len({r.job_id for r in read.records})
    past = read_history(history, conf, trace) if history is not None else None
    return ReplayInput(dump, read.rows, len(read.records), dict(read.skipped), jobs_in_dump, trace, conf, topology,
                       read.has_comment, past)


def _int_parameter(parameters: dict[str, str], key: str, default: int, source: str) -> int:
    return default if key not in parameters else option_int(parameters[key], f"SchedulerParameters {key}", source)


def sim_settings(
    config: Config, conf: ClusterConf, *, comm_penalty: float | None = None, seed: int | None = None,
    preemptible: float | str | None = None, source: str = "slurm.conf",
) -> SimSettings:
    """The simulator's settings: the [replay] section, the cluster's slurm.conf, Dike's comm class.

    `preemptible` (else [replay] preemptible): "live", the engine's opt-in rule, or a share."""
    replay = config.replay
    chosen = replay.preemptible if preemptible is None else preemptible
    opt_in = config.engine.preemption_opt_in if chosen == "live" else None
    parameters = scheduler_parameters(conf.options.get("schedulerparameters", ""))
    max_switch_wait = replay.max_switch_wait_s
    if max_switch_wait is None:
        max_switch_wait = _int_parameter(parameters, "max_switch_wait", DEFAULT_MAX_SWITCH_WAIT_S, source)
    dike = config.policy_params("dike")
    assert isinstance(dike, DikeParams)
    model = slurm_priority_model(config, conf, source)
    engine = config.engine
    return SimSettings(
        interval_s=replay.interval_s,
        cycle_latency_s=replay.cycle_latency_s,
        run_overhead_s=replay.run_overhead_s,
        comm_penalty=replay.comm_penalty if comm_penalty is None else comm_penalty,
        restart_cost_s=replay.restart_cost_s,
        checkpoint_interval_s=replay.checkpoint_interval_s,
        preemptible=0.0 if opt_in is not None else float(chosen),
        preemption_opt_in=opt_in,
        max_requeues_per_cycle=config.engine.max_requeues_per_cycle,
        seed=replay.seed if seed is None else seed,
        usage_half_life_s=config.accounting.usage_half_life_h * 3600.0,
        user_shares=dict(config.accounting.user_shares),
        history_window_s=config.accounting.lookback_days * 86400.0,
        max_switch_wait_s=max_switch_wait,
        bf_max_job_test=_int_parameter(parameters, "bf_max_job_test", DEFAULT_BF_MAX_JOB_TEST, source),
        bf_window_s=60.0 * _int_parameter(parameters, "bf_window", DEFAULT_BF_WINDOW_MIN, source),
        bf_interval_s=float(_int_parameter(parameters, "bf_interval", DEFAULT_BF_INTERVAL_S, source)),
        sched_interval_s=float(_int_parameter(parameters, "sched_interval", DEFAULT_SCHED_INTERVAL_S, source)),
        batch_sched_delay_s=float(_int_parameter(parameters, "batch_sched_delay", DEFAULT_BATCH_SCHED_DELAY_S, source)),
        backfill_reservations=replay.backfill_reservations,
        requeueable=conf.options.get("jobrequeue", "1").strip() != "0",
        requeue_hold_s=requeue_hold_s(conf, source),
        comm_gpus=dike.comm_gpus,
        comm_rules=tuple(dike.comm_rules),
        priority_model=model,
        priority_strategy=engine.priority_strategy,
        priority_span=effective_span(engine.priority_mode, engine.priority_span, model),
        priority_reserve=protection_reserve(model),
        priority_tolerance=engine.priority_tolerance,
        head_window=window_size(engine.head_window, engine.head_window_margin, scheduler_depth(parameters)),
        writes_per_cycle=writes_per_cycle(engine.max_changes_per_cycle, engine.write_budget_s, replay.write_cost_s),
        admin_comment=engine.admin_comment,
    )


def writes_per_cycle(cap: int, budget_s: float, cost_s: float) -> int | None:
    """The writes the live engine makes in one cycle: its cap, and as many as its write budget
    holds at `cost_s` each (0: writes take no time, only the cap holds them back)."""
    if cost_s <= 0:
        return cap
    return min(cap, int(budget_s / cost_s))


def slurm_priority_model(config: Config, conf: ClusterConf, source: str) -> SlurmPriorityModel:
    """Slurm's priority on the replayed cluster: the weights of its slurm.conf, and the QOS
    priorities of the qos.txt beside it (`sacctmgr show qos -P`) or else of [replay] qos_priority."""
    if conf.qos_priority is not None:
        return conf.priority_model(conf.qos_priority, f"{source} and the qos.txt beside it")
    return conf.priority_model(dict(config.replay.qos_priority), f"{source} and [replay] qos_priority")


def requeue_hold_s(conf: ClusterConf, source: str = "slurm.conf") -> float:
    """How long a requeued job waits before it may start again: Slurm sets its begin time to the
    requeue plus the credential lifetime (AuthInfo cred_expire, default 120 s) plus 1 s (22.05
    job_mgr.c `_job_requeue_op`; measured: tests/integration/test_fidelity_lab.py)."""
    lifetime = DEFAULT_CRED_EXPIRE_S
    for item in conf.options.get("authinfo", "").split(","):
        key, _, value = item.strip().partition("=")
        if key.lower() == "cred_expire":
            lifetime = option_int(value, "AuthInfo cred_expire", source)
    return float(lifetime + 1)


@dataclass(frozen=True)
class PolicyRun:
    """One policy's replay: its metrics, its counters and how long it took."""

    name: str
    metrics: PolicyMetrics
    stats: SimStats
    wall_s: float
    cpu_s: float


@dataclass(frozen=True)
class ReplayTask:
    """One replay to run: a policy, a communication penalty, optional parameter overrides."""

    label: str
    policy: str
    comm_penalty: float
    jobs_csv: Path | None = None
    params_override: dict | None = None


def policy_params(config: Config, name: str, override: dict | None = None) -> PolicyParams:
    """The parameters a replay runs policy `name` with: the configuration's, then `override`."""
    params = config.policy_params(name)
    return params.model_validate({**params.model_dump(), **override}) if override else params


def run_policy(
    name: str,
    replay_input: ReplayInput,
    config: Config,
    settings: SimSettings,
    *,
    jobs_csv: Path | None = None,
    params_override: dict | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Replay the trace under one policy (the same registry object the live engine runs)."""
    registry = default_registry()
    policy = registry.create(name)
    params = policy_params(config, name, params_override)
    trace = replay_input.trace.jobs
    span = trace[-1].submit - trace[0].submit
    timeline = Timeline(origin=trace[0].submit, width=max(settings.interval_s, span / TIMELINE_BINS, 1.0))
    cluster = SimCluster(replay_input.conf, replay_input.topology)
    started = time.perf_counter()
    cpu_started = time.process_time()
    handle = jobs_csv.open("w", encoding="utf-8", newline="") if jobs_csv is not None else None
    try:
        collector = MetricsCollector(handle)
        sink = collector
        if on_progress is not None:
            finished = 0

            def sink(result, _collect=collector):  # noqa: ANN001 - a JobResult
                nonlocal finished
                _collect(result)
                finished += 1
                if finished % 500 == 0:
                    on_progress(finished)

        simulator = Simulator(trace, cluster, policy, params, settings, timeline, sink, history=replay_input.history)
        gc_was_enabled = gc.isenabled()
        gc.disable()  # the replay allocates many small objects and frees none in cycles
        try:
            stats = simulator.run()
        finally:
            if gc_was_enabled:
                gc.enable()
    finally:
        if handle is not None:
            handle.close()
    metrics = summarise(collector, stats, timeline, cluster.total_gpus)
    return PolicyRun(name, metrics, stats, time.perf_counter() - started, time.process_time() - cpu_started)


# Set in the parent before the worker processes fork, so the trace is not pickled per task.
_SHARED: dict = {}


def _run_task(index: int, task: ReplayTask) -> tuple[int, PolicyRun]:
    replay_input, config, settings, progress = (
        _SHARED["input"], _SHARED["config"], _SHARED["settings"], _SHARED["progress"],
    )
    run = run_policy(
        task.policy,
        replay_input,
        config,
        replace(settings, comm_penalty=task.comm_penalty),
        jobs_csv=task.jobs_csv,
        params_override=task.params_override,
        on_progress=(lambda done: progress.put((index, done))) if progress is not None else None,
    )
    return index, replace(run, name=task.label)


def run_tasks(
    tasks: Sequence[ReplayTask],
    replay_input: ReplayInput,
    config: Config,
    settings: SimSettings,
    *,
    workers: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[PolicyRun]:
    """Run the replays (in `workers` processes when more than one); results in task order.

    `on_progress(task_index, jobs_finished)` is called from this process as replays advance.
    """
    workers = max(1, min(workers, len(tasks)))
    if workers == 1:
        _SHARED.update(input=replay_input, config=config, settings=settings, progress=None)
        results = []
        for index, task in enumerate(tasks):
            if on_progress is not None:
                _SHARED["progress"] = _Direct(on_progress)
            results.append(_run_task(index, task)[1])
            if on_progress is not None:  # its last jobs, as the processes' path reports a finished replay
                on_progress(index, results[-1].metrics.summary["jobs"])
        _SHARED.clear()
        return results
    context = multiprocessing.get_context("fork")
    progress = context.SimpleQueue()
    _SHARED.update(input=replay_input, config=config, settings=settings, progress=progress)
    runs: dict[int, PolicyRun] = {}
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            pending = {pool.submit(_run_task, index, task) for index, task in enumerate(tasks)}
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while not progress.empty():
                    index, finished = progress.get()
                    if on_progress is not None:
                        on_progress(index, finished)
                for future in done:
                    index, run = future.result()
                    runs[index] = run
                    if on_progress is not None:
                        on_progress(index, run.metrics.summary["jobs"])
    finally:
        _SHARED.clear()
    return [runs[index] for index in range(len(tasks))]


class _Direct:
    """The progress queue's `put`, calling back directly when replays run in this process."""

    def __init__(self, callback: Callable[[int, int], None]) -> None:
        self.callback = callback

    def put(self, item: tuple[int, int]) -> None:
        self.callback(*item)


def write_summary(path: Path, input_section: dict, runs: Sequence[PolicyRun], extra: dict | None = None) -> dict:
    """summary.json: the input counts and each policy's metrics (no wall-clock times: deterministic)."""
    document = {
        "input": input_section,
        "policies": {run.name: run.metrics.summary for run in runs},
    }
    if extra:
        document.update(extra)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return document


def preemptible_jobs(replay_input: ReplayInput, settings: SimSettings) -> tuple[int, str]:
    """How many jobs the replay lets be preempted, and the line the replay prints about it."""
    from dike_slurm.sim.kernel.job import count_preemptible

    jobs = replay_input.trace.jobs
    count = count_preemptible(jobs, settings)
    share = f"{count:,} of {len(jobs):,} jobs ({count / len(jobs):.0%})"
    rule = settings.preemption_opt_in
    if rule is None:
        return count, f"preemptible: {share}, a share of {settings.preemptible:g} drawn per job (seed {settings.seed})"
    parts = [f"partitions {', '.join(sorted(rule.partitions))}" if rule.partitions else "",
             f"QOS {', '.join(sorted(rule.qos))}" if rule.qos else "",
             f"{rule.tag!r} in the job's Comment"]
    text = f"preemptible: {share} by the engine's opt-in rule ({'; '.join(p for p in parts if p)})"
    if not replay_input.has_comment:
        text += ("; the dump has no Comment column, so no tagged job is seen (add Comment to sacct --format; "
                 "slurm.conf needs AccountingStoreFlags=job_comment)")
    return count, text
