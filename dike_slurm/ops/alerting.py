"""What admins are alerted on and watch: Prometheus alert rules and a Grafana dashboard over the
metrics the engine exports (dike_slurm/ops/metrics.py), as files sites load as they are.

The rules are values for templates/prometheus-rules.yml.j2 (dike_slurm/ops/render.py renders it);
the dashboard is JSON built here. Every expression names only metrics `metrics.exported_names()`
lists (tests/unit/test_alert_rules.py checks it with promtool).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dike_slurm.config import Config

ALERTING_KINDS = ("prometheus-rules", "grafana")
NOT_CYCLING_INTERVALS = 3  # the service is late by this many engine.interval_s
PAUSED_FOR = "1h"
HELD_BACK_FOR = "15m"
REQUEUES_PER_HOUR = 20
ERRORS_WINDOW = "15m"
DASHBOARD_UID = "dike-slurm"


@dataclass(frozen=True)
class AlertRule:
    """One alert, as Prometheus's rule file holds it (`{{ $value }}` in its texts is Prometheus's)."""

    name: str
    expr: str
    for_: str  # "" fires at the first evaluation that matches
    severity: str
    summary: str
    description: str


def _seconds(value: float) -> str:
    return f"{int(round(value))}s"


def alert_rules(config: Config) -> tuple[AlertRule, ...]:
    """The alerts: not cycling, failing cycles, paused long, breaker latched, write errors,
    held-back writes growing, requeues over a rate, wasted preemptions."""
    interval = config.engine.interval_s
    late = NOT_CYCLING_INTERVALS * interval
    held = "sum without (reason) (dike_slurm_writes_held_back)"
    return (
        AlertRule(
            "DikeSlurmNotCycling",
            f"time() - dike_slurm_cycle_timestamp_seconds > {late:g} or absent(dike_slurm_cycle_timestamp_seconds)",
            "", "critical", "dike-slurm has not completed a cycle for {{ $value | humanizeDuration }}",
            f"No applied cycle for more than {NOT_CYCLING_INTERVALS} intervals ({late:g} s): the service is down, "
            "stuck, failing (dike_slurm_cycle_failures_in_a_row) or runs as a dry run, which writes no textfile. "
            "journalctl -u dike-slurm says why."),
        AlertRule(
            "DikeSlurmCyclesFailing", "dike_slurm_cycle_failures_in_a_row >= 2", "", "warning",
            "dike-slurm: {{ $value }} failed cycles in a row",
            "Cycles fail (Slurm unreachable, the state store unwritable, a bad site setting); the service retries "
            "with backoff. journalctl -u dike-slurm has one line per failure."),
        AlertRule(
            "DikeSlurmPausedLong", "dike_slurm_paused == 1", PAUSED_FOR, "warning",
            f"dike-slurm writes have been paused for over {PAUSED_FOR}",
            "An operator ran dike-slurm pause; nothing is written until dike-slurm resume. "
            "dike-slurm status shows the reason."),
        AlertRule(
            "DikeSlurmBreakerLatched", "dike_slurm_breaker_latched == 1", "", "critical",
            "dike-slurm circuit breaker latched: nothing is written",
            "A mass rewrite or too many failed writes tripped the breaker. dike-slurm breaker status says why; "
            "dike-slurm breaker reset once understood."),
        AlertRule(
            "DikeSlurmWriteErrors", f"max_over_time(dike_slurm_errors[{ERRORS_WINDOW}]) > 0", "", "warning",
            f"dike-slurm: Slurm refused writes in the last {ERRORS_WINDOW}",
            "Failed updates, requeues or signals; dike-slurm audit --since 1h shows Slurm's messages."),
        AlertRule(
            "DikeSlurmHeldBackWritesGrowing",
            f"{held} > 0 and deriv(({held})[{HELD_BACK_FOR}:{_seconds(interval)}]) > 0",
            HELD_BACK_FOR, "warning",
            "dike-slurm: {{ $value }} writes held back, and growing for " + HELD_BACK_FOR,
            "Writes the write budget, max_changes_per_cycle or the breaker leave for later cycles keep growing: "
            "slurmctld is slow or the queue churns faster than the engine writes "
            "(dike_slurm_oldest_held_write_age_seconds says for how long)."),
        AlertRule(
            "DikeSlurmRequeueRate", f"increase(dike_slurm_requeues_total[1h]) > {REQUEUES_PER_HOUR}", "", "warning",
            'dike-slurm requeued {{ $value | printf "%.0f" }} jobs in the last hour',
            f"Preemptions above {REQUEUES_PER_HOUR} an hour; dike_slurm_requeue_gpu_hours_lost_total estimates the "
            "work they cost."),
        AlertRule(
            "DikeSlurmWastedPreemptions", 'increase(dike_slurm_preemptions_total{outcome="wasted"}[1h]) > 0', "",
            "warning", 'dike-slurm: {{ $value | printf "%.0f" }} preemption(s) wasted in the last hour',
            "Jobs were requeued for a job that then ran elsewhere or kept waiting; dike-slurm audit shows "
            "the preemption rows with why."),
    )


def prometheus_rule_values(config: Config) -> list[dict[str, str]]:
    """The values of each rule as templates/prometheus-rules.yml.j2 takes them."""
    return [{"name": rule.name, "expr": rule.expr, "for_": rule.for_, "severity": rule.severity,
             # a JSON string is a YAML double-quoted one
             "summary": json.dumps(rule.summary, ensure_ascii=False),
             "description": json.dumps(rule.description, ensure_ascii=False)} for rule in alert_rules(config)]


# (title, panel type, unit, ((expression, legend), ...)); a row of four panels of width 6
_PANELS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Since the last cycle", "stat", "s", (("time() - dike_slurm_cycle_timestamp_seconds", "seconds"),)),
    ("Paused / breaker latched", "stat", "short", (("dike_slurm_paused", "paused"),
                                                  ("dike_slurm_breaker_latched", "breaker"))),
    ("Failed cycles in a row", "stat", "short", (("dike_slurm_cycle_failures_in_a_row", "in a row"),)),
    ("Oldest held-back write", "stat", "s", (("dike_slurm_oldest_held_write_age_seconds", "age"),)),
    ("Pending jobs per level", "timeseries", "short", (
        ("sum by (level) (dike_slurm_pending_jobs)", "level {{level}}"),
        ("dike_slurm_pending_jobs_beyond_head_window", "beyond the head window"))),
    ("Pending wait per level: median and p95", "timeseries", "s",
     (("dike_slurm_pending_wait_seconds", "level {{level}} q{{quantile}}"),)),
    ("Pending jobs per partition", "timeseries", "short",
     (("sum by (partition) (dike_slurm_pending_jobs)", "{{partition}}"),)),
    ("Managed jobs per level", "timeseries", "short", (("dike_slurm_jobs", "level {{level}}"),)),
    ("Jobs the engine leaves alone", "timeseries", "short", (
        ("dike_slurm_jobs_exempt", "exempt: {{reason}}"), ("dike_slurm_jobs_left_alone", "left to the {{reason}}"),
        ("increase(dike_slurm_left_alone_total[1h])", "found in the last hour"))),
    ("Writes per cycle", "timeseries", "short", (
        ("dike_slurm_writes_planned", "planned"), ("dike_slurm_changes_written", "written"),
        ("dike_slurm_writes_skipped", "skipped"), ("dike_slurm_writes_held_back", "held back: {{reason}}"))),
    ("Errors", "timeseries", "short", (("dike_slurm_errors", "last cycle"),
                                      ("increase(dike_slurm_write_errors_total[1h])", "last hour"))),
    ("Requeues and grace signals per hour", "timeseries", "short", (
        ("increase(dike_slurm_requeues_total[1h])", "requeues"),
        ("increase(dike_slurm_grace_signals_total[1h])", "grace signals"))),
    ("GPU-hours lost to requeues per hour (upper bound)", "timeseries", "short",
     (("increase(dike_slurm_requeue_gpu_hours_lost_total[1h])", "GPU-hours"),)),
    ("Preemptions settled per hour", "timeseries", "short",
     (("increase(dike_slurm_preemptions_total[1h])", "{{outcome}}"),)),
    ("Cycle time by phase", "timeseries", "s", (("dike_slurm_cycle_phase_seconds", "{{phase}}"),
                                               ("dike_slurm_cycle_seconds", "whole cycle"))),
    ("Slurm calls per cycle, cycles and failures per hour", "timeseries", "short", (
        ("dike_slurm_slurm_calls", "Slurm calls"), ("increase(dike_slurm_cycles_total[1h])", "cycles"),
        ("increase(dike_slurm_cycle_failures_total[1h])", "failed cycles"))),
    ("Preemption in the last cycle", "timeseries", "short", (
        ("dike_slurm_requeues_last_cycle", "requeued"), ("dike_slurm_grace_signals_last_cycle", "signalled"),
        ("dike_slurm_requeue_gpu_hours_lost_last_cycle", "GPU-hours lost"),
        ("dike_slurm_preemptions", "settled: {{outcome}}"))),
    ("Engine", "stat", "short", (
        ("dike_slurm_policy_info", "{{policy}} / {{strategy}}"), ("dike_slurm_applied", "applied"),
        ("dike_slurm_head_window_jobs", "head window"))),
    ("Since the last failed cycle", "stat", "s", (
        ("time() - (dike_slurm_last_failure_timestamp_seconds > 0)", "seconds"),)),
    ("Service prior: attained / predicted", "timeseries", "short", (
        ("dike_slurm_prior_ratio", "ratio q{{quantile}}"), ("dike_slurm_prior_error_factor", "off by q{{quantile}}"),
        ("dike_slurm_prior_jobs_judged", "jobs judged"))),
)


def grafana_dashboard(config: Config) -> str:
    """A Grafana dashboard (JSON, import it as is; it asks for the Prometheus data source)."""
    panels = []
    for index, (title, kind, unit, targets) in enumerate(_PANELS):
        panels.append({
            "id": index + 1,
            "title": title,
            "type": kind,
            "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
            "gridPos": {"h": 4 if kind == "stat" else 8, "w": 6, "x": (index % 4) * 6, "y": (index // 4) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}}
                        for n, (expr, legend) in enumerate(targets)],
        })
    dashboard = {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "uid": DASHBOARD_UID,
        "title": "dike-slurm",
        "description": f"The dike-slurm engine (policy {config.engine.policy}, a cycle every "
                       f"{config.engine.interval_s:g} s): docs/engine.md, Metrics",
        "tags": ["slurm", "dike-slurm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "1m",
        "time": {"from": "now-24h", "to": "now"},
        "panels": panels,
    }
    return json.dumps(dashboard, indent=2) + "\n"


def dashboard_expressions(text: str) -> list[str]:
    """Every query expression of a dashboard's JSON."""
    return [target["expr"] for panel in json.loads(text)["panels"] for target in panel.get("targets", [])]


# PromQL words that are not metric names: functions are followed by "(", these are not
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_NAMES = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)\b(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (labels, strings, durations and functions left out)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _GROUPINGS.sub("", text)
    text = _RANGES.sub("", text)
    return {name for name in _NAMES.findall(text) if name.lower() not in _PROMQL_WORDS}

