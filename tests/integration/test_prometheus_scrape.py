"""A real scrape: Debian's node-exporter reads the engine's textfile after cycles on the lab, and
a real Prometheus scrapes it, loads the rendered alert rules, and answers on its HTTP API.

Both run on free ports of 127.0.0.1 with their own temporary folders (never the packages'
services). The test waits for the scrape that follows a cycle (a sample whose value is that
cycle's timestamp), with a deadline that fails naming what it waited for; `make test` installs
the packages as root (the `prometheus` target), elsewhere the test skips and says so.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_engine import LabEngine

from prometheus_client.parser import text_string_to_metric_families

NODE_EXPORTER = shutil.which("prometheus-node-exporter")
PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.scenario, pytest.mark.skipif(
    NODE_EXPORTER is None or PROMETHEUS is None,
    reason="prometheus or prometheus-node-exporter not found: install Debian's packages (make test does, as root)")]

SCRAPE_DEADLINE_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """A private Prometheus over a private node-exporter whose textfile collector reads `textfiles`."""

    def __init__(self, folder: Path, textfiles: Path, rules: Path) -> None:
        self.folder = folder
        self.node_port, self.port = free_port(), free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{self.node_port}"]}]}],
        }
        (folder / "prometheus.yml").write_text(json.dumps(config))
        self.processes = [
            self._start("node-exporter", [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{self.node_port}",
                                          "--collector.disable-defaults", "--collector.textfile",
                                          f"--collector.textfile.directory={textfiles}"]),
            self._start("prometheus", [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={folder / 'data'}",
                                       f"--web.listen-address=127.0.0.1:{self.port}"]),
        ]

    def _start(self, name: str, argv: list[Any]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        return subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, cwd=self.folder)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def query(self, expr: str) -> list[dict]:
        """The instant vector `expr` gives now."""
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for(self, what: str, predicate) -> Any:
        """Poll until `predicate()` is truthy; fail naming `what` after SCRAPE_DEADLINE_S."""
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        while True:
            for process in self.processes:
                assert process.poll() is None, f"{process.args[0]} exited {process.returncode}\n{self.logs()}"
            try:
                value = predicate()
            except OSError:  # not listening yet
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {SCRAPE_DEADLINE_S:g} s waiting for {what}\n{self.logs()}")
            time.sleep(0.2)

    def wait_for_cycle(self, timestamp: float) -> None:
        """Until Prometheus holds a scrape of the textfile the cycle at `timestamp` wrote."""
        self.wait_for(f"a scrape holding dike_slurm_cycle_timestamp_seconds {timestamp}", lambda: any(
            float(r["value"][1]) == timestamp for r in self.query("dike_slurm_cycle_timestamp_seconds")))


def textfile(path: Path) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(path.read_text()) for s in family.samples}


def values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result]


@pytest.fixture
def engine(slurm_lab: Any, tmp_path: Path) -> LabEngine:
    (tmp_path / "metrics").mkdir()
    return LabEngine(slurm_lab, tmp_path, DIKE_ENGINE__METRICS_FILE=str(tmp_path / "metrics" / "dike.prom"),
                     DIKE_ENGINE__INTERVAL_S="60")


@pytest.fixture
def prometheus(engine: LabEngine, tmp_path: Path) -> Iterator[Prometheus]:
    rules = tmp_path / "rules.yml"
    proc = engine.run("render", "prometheus-rules", "--out", str(rules), timeout=60)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "prometheus").mkdir()
    server = Prometheus(tmp_path / "prometheus", tmp_path / "metrics", rules)
    try:
        server.wait_for("Prometheus to be ready and its rules loaded", lambda: len(
            [r for g in server.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]) == 8)
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_the_engine_metrics_through_node_exporter(slurm_lab, engine, prometheus):
    lab = slurm_lab
    blocker = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 300")
    lab.wait_for(lambda: lab.job_state(blocker) == "RUNNING", 60, f"job {blocker} to run")
    waiting = [lab.sbatch("--gres=gpu:1", "--wrap", "sleep 5", user=user)
               for user in ("dikeuser1", "dikeuser1", "dikeuser2")]
    lab.wait_for(lambda: all(lab.job_state(j) == "PENDING" for j in waiting), 30, "the jobs to be pending")

    proc = engine.run("run", "--once", "--apply", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics_file = engine.dir / "metrics" / "dike.prom"
    written = textfile(metrics_file)
    stamp = written["dike_slurm_cycle_timestamp_seconds", ()]
    pending = sum(v for (name, _), v in written.items() if name == "dike_slurm_pending_jobs")
    assert pending == 3 and written["dike_slurm_changes_written", ()] >= 3
    assert written["dike_slurm_paused", ()] == 0 and written["dike_slurm_cycles_total", ()] == 1

    prometheus.wait_for_cycle(stamp)
    assert values(prometheus.query("sum(dike_slurm_pending_jobs)")) == [3]
    medians = prometheus.query('dike_slurm_pending_wait_seconds{quantile="0.5"}')
    assert medians and all(r["metric"]["job"] == "node" and "level" in r["metric"] for r in medians)
    assert values(prometheus.query("dike_slurm_changes_written")) == [written["dike_slurm_changes_written", ()]]
    assert {r["metric"]["phase"] for r in prometheus.query("dike_slurm_cycle_phase_seconds")} == {
        "read", "decide", "diff", "write"}
    assert prometheus.query("dike_slurm_paused == 1") == []

    # paused: the next cycle writes nothing and says so; the alert's expression finds it, and the
    # rule Prometheus loaded from `render prometheus-rules` goes pending (it fires after an hour)
    assert engine.run("pause", "--reason", "scrape test", timeout=60).returncode == 0
    proc = engine.run("run", "--once", "--apply", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stamp = textfile(metrics_file)["dike_slurm_cycle_timestamp_seconds", ()]
    prometheus.wait_for_cycle(stamp)
    assert values(prometheus.query("dike_slurm_paused == 1")) == [1]
    assert values(prometheus.query("dike_slurm_changes_written")) == [0]
    prometheus.wait_for("the DikeSlurmPausedLong alert to be pending", lambda: prometheus.query(
        'ALERTS{alertname="DikeSlurmPausedLong", alertstate="pending"}'))
    # cycling on time: the not-cycling alert's expression finds nothing
    assert prometheus.query("time() - dike_slurm_cycle_timestamp_seconds > 180") == []
