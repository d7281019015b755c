"""`render prometheus-rules` and `render grafana` checked by Debian's promtool: the rules load and
fire on synthetic series as they should, every dashboard expression parses, and every expression
names only metrics the engine exports (metrics.exported_names(), from the code that writes them).

promtool comes with Debian's `prometheus` package, which `make test` installs as root (the
`prometheus` target); without it these tests skip and say so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dike_slurm.config import Config
from dike_slurm.ops.alerting import alert_rules, dashboard_expressions, metric_names
from dike_slurm.ops.metrics import exported_names
from dike_slurm.ops.render import render

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install Debian's prometheus package (make test does, as root)")

CONFIG = Config.model_validate({"engine": {"interval_s": 60}})


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    proc = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"promtool {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yml"
    path.write_text(render("prometheus-rules", CONFIG, tmp_path / "dike.toml"))
    return path


@needs_promtool
def test_promtool_checks_the_rendered_rules(rules_file):
    out = promtool("check", "rules", str(rules_file), cwd=rules_file.parent).stdout
    assert f"SUCCESS: {len(alert_rules(CONFIG))} rules found" in out


def alert(name: str, at: str, labels: dict[str, str] | None = None, summary: str | None = None) -> dict:
    """One promtool alert_rule_test: `name` fires at `at` with these labels and summary (None: it does not fire)."""
    rule = next(r for r in alert_rules(CONFIG) if r.name == name)
    fired = [] if summary is None else [{
        "exp_labels": {"severity": rule.severity, **(labels if labels is not None else {"instance": "a"})},
        "exp_annotations": {"summary": summary, "description": rule.description},
    }]
    return {"eval_time": at, "alertname": name, "exp_alerts": fired}


@needs_promtool
def test_the_rules_fire_on_synthetic_series(rules_file):
    series = {
        'dike_slurm_cycle_timestamp_seconds{instance="a"}': "0+60x10 600x20",  # cycles stop after 10 min
        'dike_slurm_cycle_failures_in_a_row{instance="a"}': "0 0 1 2 2",
        'dike_slurm_paused{instance="a"}': "1x90",
        'dike_slurm_breaker_latched{instance="a"}': "0 0 1 1 1",
        'dike_slurm_errors{instance="a"}': "0 0 3 0x40",
        'dike_slurm_writes_held_back{instance="a", reason="write_budget"}': "0+10x60",  # growing
        'dike_slurm_writes_held_back{instance="b", reason="write_budget"}': "50x60",  # many, but steady
        'dike_slurm_requeues_total{instance="a"}': "0+1x120",  # 60 an hour
        'dike_slurm_preemptions_total{instance="a", outcome="wasted"}': "0 0 0 1x10",
        'dike_slurm_preemptions_total{instance="a", outcome="landed"}': "0+1x10",
    }
    tests = [
        {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series.items()],
         "alert_rule_test": [
             alert("DikeSlurmNotCycling", "12m"),
             alert("DikeSlurmNotCycling", "15m", summary="dike-slurm has not completed a cycle for 5m 0s"),
             alert("DikeSlurmCyclesFailing", "2m"),
             alert("DikeSlurmCyclesFailing", "4m", summary="dike-slurm: 2 failed cycles in a row"),
             alert("DikeSlurmPausedLong", "30m"),
             alert("DikeSlurmPausedLong", "61m", summary="dike-slurm writes have been paused for over 1h"),
             alert("DikeSlurmBreakerLatched", "1m"),
             alert("DikeSlurmBreakerLatched", "3m", summary="dike-slurm circuit breaker latched: nothing is written"),
             alert("DikeSlurmWriteErrors", "5m", summary="dike-slurm: Slurm refused writes in the last 15m"),
             alert("DikeSlurmWriteErrors", "30m"),
             alert("DikeSlurmHeldBackWritesGrowing", "40m",
                   summary="dike-slurm: 400 writes held back, and growing for 15m"),
             alert("DikeSlurmRequeueRate", "90m", summary="dike-slurm requeued 60 jobs in the last hour"),
             alert("DikeSlurmWastedPreemptions", "10m",
                   labels={"instance": "a", "outcome": "wasted"},
                   summary="dike-slurm: 1 preemption(s) wasted in the last hour"),
         ]},
        {"interval": "1m", "input_series": [{"series": 'dike_slurm_paused{instance="a"}', "values": "0x5"}],
         "alert_rule_test": [  # no textfile at all (a dry run, or never started)
             alert("DikeSlurmNotCycling", "2m", labels={}, summary="dike-slurm has not completed a cycle for 1s")]},
    ]
    test_file = rules_file.parent / "rules_test.yml"
    test_file.write_text(json.dumps({"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests}))
    promtool("test", "rules", test_file.name, cwd=rules_file.parent)


@needs_promtool
def test_every_dashboard_expression_parses(tmp_path):
    expressions = dashboard_expressions(render("grafana", CONFIG, tmp_path / "dike.toml"))
    recording = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expression_{n}", "expr": expr} for n, expr in enumerate(expressions)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(recording))
    assert f"SUCCESS: {len(expressions)} rules found" in promtool("check", "rules", path.name, cwd=tmp_path).stdout


def test_every_expression_names_only_exported_metrics(tmp_path):
    exported = exported_names()
    dashboard = dashboard_expressions(render("grafana", CONFIG, tmp_path / "dike.toml"))
    rules = [rule.expr for rule in alert_rules(CONFIG)]
    assert len(dashboard) >= 20 and len(rules) == 8
    for expr in dashboard + rules:
        names = metric_names(expr)
        assert names and names <= exported, f"{expr!r} reads {sorted(names - exported)}, not exported"
    # every metric the engine exports is on the dashboard
    assert set().union(*map(metric_names, dashboard)) == exported


def test_metric_names_leaves_out_functions_labels_and_durations():
    assert metric_names('increase(a_total{outcome="x"}[1h]) > 2 and on (job) sum by (level) (b) or absent(c)') == {
        "a_total", "b", "c"}
    assert metric_names("deriv((sum without (reason) (held))[15m:60s]) > 0 and time() - ts > 1e3") == {"held", "ts"}
