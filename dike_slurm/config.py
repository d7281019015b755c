"""The validated configuration: TOML file < environment (DIKE_SECTION__KEY) < CLI flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dike_slurm.domain.model import Exemptions, PreemptionOptIn
from dike_slurm.errors import ConfigError, RegistryError
from dike_slurm.parsing.toml_file import read_toml_file
from dike_slurm.policies.base import PolicyParams
from dike_slurm.registry import default_registry

ENV_PREFIX = "DIKE_"
ENV_CONFIG_FILE = "DIKE_CONFIG"  # names the file; not a setting itself


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Section):
    """The live cycle."""

    policy: str = Field("dike", description="policy the engine runs")
    interval_s: float = Field(60.0, gt=0, description="seconds between cycles")
    priority_strategy: Literal["site_factor", "priority", "nice"] = "site_factor"
    priority_span: int = Field(
        1_000_000, ge=1, description="largest SiteFactor/Priority written; policy order is spread over [1, span]"
    )
    priority_mode: Literal["tiers", "blend", "over"] = Field(
        "tiers",
        description="how Dike's SiteFactor sits among Slurm's own factors: tiers (keep every QOS tier, Dike orders "
        "inside each), blend (span = the site's weights together), over (span as configured, above every tier)",
    )
    priority_tolerance: float = Field(
        0.01, ge=0, lt=1, description="a value within this fraction of priority_span of what Slurm has is not rewritten"
    )
    admin_comment: bool = Field(True, description="write `dike:level=N,attained=X` to AdminComment")
    max_changes_per_cycle: int = Field(
        10_000, ge=0, description="safety cap on writes per cycle, first jobs first (write_budget_s is the usual limit)"
    )
    write_budget_s: float = Field(
        20.0, gt=0, description="seconds of a cycle the writes may take: once used, the rest (the queue's tail) waits "
        "for the next cycle"
    )
    head_window: int | None = Field(
        None, ge=0, description="pending jobs per partition the engine orders, the policy's first ones; the rest keep "
        "Slurm's own factors (SiteFactor back to its original); unset: head_window_margin x the jobs Slurm's "
        "scheduler looks at (SchedulerParameters bf_max_job_test, bf_max_job_part, default_queue_depth); 0: every job"
    )
    head_window_margin: float = Field(
        2.0, ge=1, description="the window over the scheduler's depth, for the jobs that start between two cycles"
    )
    breaker_change_fraction: float = Field(
        0.9, gt=0, le=1, description="stop writing if more than this fraction of managed jobs would change"
    )
    breaker_min_jobs: int = Field(20, ge=0, description="the fraction check applies from this many managed jobs")
    breaker_max_errors: int = Field(5, ge=0, description="stop writing after this many failed writes in a cycle")
    cycle_deadline_s: float = Field(
        45.0, gt=0, description="the whole cycle's budget: reads share it, writes stop once it has passed"
    )
    max_requeues_per_cycle: int = Field(
        2, ge=0, description="preemption rate limit: at most this many requeues per cycle, whatever the policy asks"
    )
    preempt_signal: str | None = Field(
        None, pattern=r"^(SIG)?[A-Z][A-Z0-9]*$|^[0-9]+$",
        description="signal the batch shell of a job with this (e.g. USR1) and requeue it preempt_grace_s later; unset: requeue at once",
    )
    preempt_grace_s: float = Field(60.0, ge=0, description="seconds between the grace signal and the requeue")
    preemptible_tag: str = Field(
        "dike:preemptible", min_length=1, description="live preemption is opt-in: jobs whose comment holds this tag"
    )
    preemptible_partitions: list[str] = Field(default_factory=list, description="... or that run in these partitions")
    preemptible_qos: list[str] = Field(default_factory=list, description="... or that run under these QOS")
    state_db: Path = Field(Path("/var/lib/dike-slurm/state.sqlite"))
    state_group: str | None = Field(
        None, description="the group that may read the state file the engine creates (0640); unset: its user only (0600)"
    )
    lock_file: Path | None = Field(None, description="default: state_db + '.lock'")
    seed: int = 0
    log_format: Literal["text", "json"] = Field("text", description="log lines on stderr: text, or one JSON object per line")
    metrics_file: Path | None = Field(None, description="Prometheus textfile rewritten after every cycle; unset: none")

    @cached_property
    def preemption_opt_in(self) -> PreemptionOptIn:
        """Which jobs live preemption may requeue (the replay's default follows it too)."""
        return PreemptionOptIn(self.preemptible_tag, frozenset(self.preemptible_partitions), frozenset(self.preemptible_qos))


class ScopeSettings(_Section):
    """Which jobs the engine may touch (empty list: all)."""

    partitions: list[str] = Field(default_factory=list)
    accounts: list[str] = Field(default_factory=list)
    qos: list[str] = Field(default_factory=list)
    exempt_tag: str = Field("dike:exempt", min_length=1, description="jobs whose comment holds this are never touched "
                            "(the job's user sets it)")
    exempt_admin_tag: str = Field("dike:exempt", min_length=1, description="jobs whose AdminComment holds this are "
                                  "never touched (only admins set AdminComment)")
    exempt_qos: list[str] = Field(default_factory=list, description="jobs of these QOS are never touched")
    exempt_partitions: list[str] = Field(default_factory=list, description="jobs submitted to any of these partitions "
                                         "are never touched")
    exempt_accounts: list[str] = Field(default_factory=list, description="jobs of these accounts are never touched")

    @cached_property
    def exemptions(self) -> Exemptions:
        """The jobs the engine never writes: the comment tag, or what only admins set."""
        return Exemptions(self.exempt_tag, self.exempt_admin_tag, frozenset(self.exempt_qos),
                          frozenset(self.exempt_partitions), frozenset(self.exempt_accounts))


class SlurmSettings(_Section):
    """How the engine reaches Slurm."""

    backend: Literal["cli", "pyslurm", "simulated"] = "cli"
    slurm_conf: Path | None = Field(None, description="exported as SLURM_CONF to every Slurm command")
    topology_conf: Path | None = Field(None, description="default: `scontrol show topology`")
    bin_dir: Path | None = Field(None, description="folder of squeue/sinfo/sacct/scontrol; default: PATH")
    command_timeout_s: float = Field(30.0, gt=0)
    simulated_trace: Path | None = Field(
        None, description="backend 'simulated': the sacct dump it replays (cluster from slurm_conf/topology_conf)"
    )


class AccountingSettings(_Section):
    """Usage and history from sacct."""

    usage_half_life_h: float = Field(168.0, gt=0, description="decay of each owner's GPU usage")
    lookback_days: float = Field(30.0, gt=0, description="sacct history read for usage and thresholds")
    since: datetime | None = Field(
        None, description="accounting before this time is never read (the day the site's current setup began); "
        "unset: lookback_days alone"
    )
    user_shares: dict[str, float] = Field(default_factory=dict, description="fair share per user/account (default 1)")

    def window_start(self, now: float) -> float:
        """The oldest time the engine reads accounting from and keeps runs since: `lookback_days`
        before `now`, or `since` when that is later. A `since` without a zone is UTC, as `audit --since`."""
        start = now - self.lookback_days * 86400.0
        if self.since is None:
            return start
        since = self.since if self.since.tzinfo else self.since.replace(tzinfo=timezone.utc)
        return max(start, since.timestamp())


class RetentionSettings(_Section):
    """How long the state store keeps its history; older rows go, a bounded number per cycle."""

    audit_days: float = Field(
        90.0, gt=0, description="audit rows older than this are deleted (exported first when audit_export is set)"
    )
    cycles_days: float = Field(90.0, gt=0, description="cycle summaries older than this are deleted")
    max_deletes_per_cycle: int = Field(
        5000, ge=1, description="at most this many rows deleted per table per cycle; a backlog takes several cycles"
    )
    audit_export: Path | None = Field(
        None, description="JSON lines file every audit row is appended to before it is deleted; unset: not kept"
    )
    optimize_every_h: float = Field(
        24.0, gt=0, description="PRAGMA optimize this often, and VACUUM when over half the file is free pages"
    )


class ReplaySettings(_Section):
    """The offline simulator."""

    interval_s: float = Field(60.0, gt=0, description="policy cycle in simulated seconds")
    cycle_latency_s: float = Field(
        1.0, ge=0, description="seconds from a cycle's reads to its writes reaching Slurm: the live "
        "engine's cycle time (`dike-slurm status`, last cycle); below interval_s",
    )
    run_overhead_s: float = Field(
        0.05, ge=0, description="a run ends this long after its recorded run time (Slurm's launch and "
        "exit; sacct's whole seconds would otherwise end it exactly at a pass or cycle of that second)",
    )
    comm_penalty: float = Field(
        1.0, ge=0, description="a heavy job spread over s leaves runs 1 + penalty x (s-1) times longer"
    )
    restart_cost_s: float = Field(120.0, ge=0, description="time a requeued job spends restarting before it makes progress")
    checkpoint_interval_s: float = Field(
        1800.0, ge=0, description="jobs checkpoint every this many seconds of work; a requeue loses the work since; 0: nothing lost"
    )
    preemptible: Annotated[float, Field(ge=0, le=1)] | Literal["live"] = Field(
        "live", description="which jobs may be preempted: \"live\", the engine's opt-in rule (engine.preemptible_tag in "
        "the dump's Comment, engine.preemptible_partitions, engine.preemptible_qos), or a share drawn per job from "
        "the seed (1: all, 0: none)",
    )
    seed: int = 0
    max_switch_wait_s: int | None = Field(
        None, ge=0, description="cap on Switches=N@wait; unset: slurm.conf SchedulerParameters max_switch_wait, else 300"
    )
    backfill_reservations: int = Field(
        16, ge=0, description="blocked jobs that get a backfill reservation per scheduling pass"
    )
    write_cost_s: float = Field(
        0.001, ge=0, description="seconds one engine write takes (the lab's fed scontrol: 0.6-1.7 ms, "
        "docs/benchmarks.md): the replay makes at most engine.write_budget_s / write_cost_s writes per cycle, as the "
        "live engine would; 0: every write lands at once"
    )
    qos_priority: dict[str, int] = Field(
        default_factory=dict,
        description="QOS name -> Priority for Slurm's QOS factor; a qos.txt beside slurm.conf "
        "(`sacctmgr show qos -P` output) is read instead when present",
    )

    @model_validator(mode="after")
    def _latency_within_the_cycle(self) -> ReplaySettings:
        if self.cycle_latency_s >= self.interval_s:
            raise ValueError(
                f"cycle_latency_s ({self.cycle_latency_s:g}) must be below interval_s ({self.interval_s:g}): "
                "the engine starts a cycle only when the last one has written; set replay.cycle_latency_s"
            )
        return self


class Config(_Section):
    """The whole configuration; `[policies.NAME]` tables hold each policy's parameters."""

    engine: EngineSettings = Field(default_factory=EngineSettings)
    scope: ScopeSettings = Field(default_factory=ScopeSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    accounting: AccountingSettings = Field(default_factory=AccountingSettings)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def policy_params(self, name: str) -> PolicyParams:
        """The validated parameters of one policy (its defaults where the file is silent)."""
        params_model = default_registry().get(name).Params
        try:
            return params_model.model_validate(self.policies.get(name, {}))
        except ValidationError as exc:
            raise ConfigError(_describe(exc, prefix=f"policies.{name}")) from None


def _describe(
    exc: ValidationError, prefix: str = "", source: str = "", env_names: Mapping[tuple[str, ...], str] | None = None
) -> str:
    """Every problem as `key: message`; a key set by a DIKE_* variable names the variable, not the file."""
    return _joined(_problems(exc, prefix, env_names), source)


def _problems(
    exc: ValidationError, prefix: str = "", env_names: Mapping[tuple[str, ...], str] | None = None
) -> list[str]:
    """Each problem as `key: message`, or `environment variable DIKE_...: key: message` where a
    DIKE_* variable set the key."""
    problems = []
    for error in exc.errors():
        loc = tuple(prefix.split(".") if prefix else ()) + tuple(str(p) for p in error["loc"])
        key = ".".join(loc) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        variable = _variable_for(loc, env_names or {})
        problems.append(f"{key}: {message}" if variable is None else f"environment variable {variable}: {key}: {message}")
    return problems


def _joined(problems: list[str], source: str) -> str:
    """One line: the file's problems after its name, then those of the environment."""
    from_env = [p for p in problems if p.startswith("environment variable ")]
    from_file = [p for p in problems if not p.startswith("environment variable ")]
    where = f"{source}: " if source and from_file else ""
    return "; ".join(([where + "; ".join(from_file)] if from_file else []) + from_env)


def _variable_for(loc: tuple[str, ...], env_names: Mapping[tuple[str, ...], str]) -> str | None:
    """The DIKE_* variable that set this key or a table above it (None: the file or a default)."""
    for length in range(len(loc), 0, -1):
        if loc[:length] in env_names:
            return env_names[loc[:length]]
    return None


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _env_value(text: str) -> Any:
    """TOML literal if it parses as one (30, true, ["gpu"]), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def environment_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`DIKE_ENGINE__INTERVAL_S=30` -> {"engine": {"interval_s": 30}}; DIKE_CONFIG is excluded."""
    overrides: dict[str, Any] = {}
    for path, _name, text in _environment_keys(environ):
        target = overrides
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _env_value(text)
    return overrides


def _environment_keys(environ: Mapping[str, str]) -> list[tuple[tuple[str, ...], str, str]]:
    """(key path, variable name, value) of every DIKE_SECTION__KEY variable, sorted by name."""
    keys = []
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_FILE or "__" not in name:
            continue
        path = tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__"))
        if len(path) >= 2 and all(path):
            keys.append((path, name, text))
    return keys


@dataclass(frozen=True)
class ConfigSource:
    """Where a configuration came from: a file (named by --config or $DIKE_CONFIG) or the built-in
    defaults, plus the DIKE_SECTION__KEY variables applied on top."""

    kind: Literal["file", "env", "defaults"]  # file: --config; env: $DIKE_CONFIG; defaults: no file
    path: Path | None
    variables: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: `configuration: /etc/dike-slurm/dike.toml (--config) + DIKE_ENGINE__INTERVAL_S`."""
        base = {"file": f"{self.path} (--config)", "env": f"{self.path} ($DIKE_CONFIG)",
                "defaults": "built-in defaults (no file)"}[self.kind]
        return "configuration: " + base + "".join(f" + {v}" for v in self.variables)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": None if self.path is None else str(self.path),
                "variables": list(self.variables)}


def config_source(path: Path | None, environ: Mapping[str, str] | None = None, *, offline: bool = False) -> ConfigSource:
    """The file a command reads: `path`, else $DIKE_CONFIG (never for an offline command), else none."""
    environ = os.environ if environ is None else environ
    variables = tuple(name for _, name, _ in _environment_keys(environ))
    if path is not None:
        return ConfigSource("file", path, variables)
    if not offline and environ.get(ENV_CONFIG_FILE):
        return ConfigSource("env", Path(environ[ENV_CONFIG_FILE]), variables)
    return ConfigSource("defaults", None, variables)


def read_toml(path: Path) -> dict[str, Any]:
    return read_toml_file(path, ConfigError, missing="config file not found", unreadable="cannot read config")


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    offline: bool = False,
) -> Config:
    """Load and validate: the file (or $DIKE_CONFIG), then DIKE_* variables, then CLI overrides."""
    return load_with_source(path, environ=environ, overrides=overrides, offline=offline)[0]


def _named_policies(config: Config | None, data: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(key, policy name, its parameters) of engine.policy and of every [policies.NAME] table, each
    name once; read from the raw data where the file did not validate, so that every problem is found."""
    if config is not None:
        engine_policy, tables = config.engine.policy, config.policies
    else:
        engine = data.get("engine") if isinstance(data.get("engine"), Mapping) else {}
        engine_policy = engine.get("policy", EngineSettings.model_fields["policy"].default)
        tables = data.get("policies") if isinstance(data.get("policies"), Mapping) else {}
    named: dict[str, tuple[str, str, Any]] = {}
    if isinstance(engine_policy, str):
        named[engine_policy] = ("engine.policy", engine_policy, tables.get(engine_policy, {}))
    for name, params in tables.items():
        named.setdefault(str(name), (f"policies.{name}", str(name), params))
    return list(named.values())


def load_with_source(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    offline: bool = False,
) -> tuple[Config, ConfigSource]:
    """The configuration and where it came from. `offline` (replay, tune): $DIKE_CONFIG, which
    names the live engine's file, is not read; only an explicit `path` is."""
    environ = os.environ if environ is None else environ
    origin = config_source(path, environ, offline=offline)
    data = read_toml(origin.path) if origin.path is not None else {}
    env_keys = _environment_keys(environ)
    env_names = {key: name for key, name, _ in env_keys}
    data = _merge(data, environment_overrides(environ))
    data = _merge(data, overrides or {})
    source = str(origin.path) if origin.path is not None else "configuration"
    problems: list[str] = []
    config: Config | None = None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems += _problems(exc, env_names=env_names)
    for key, name, params in _named_policies(config, data):
        try:
            params_model = default_registry().get(name).Params
        except RegistryError as exc:
            where = _variable_for(tuple(key.split(".")), env_names)
            problems.append(f"environment variable {where}: {key}: {exc}" if where else f"{key}: {exc}")
            continue
        try:
            params_model.model_validate(params)
        except ValidationError as exc:
            problems += _problems(exc, prefix=f"policies.{name}", env_names=env_names)
    if problems or config is None:
        raise ConfigError(_joined(problems, source), problems=problems, source_name=source)
    return config, origin
