"""Fixtures for the integration tests: they run against the real Slurm lab.

Start the lab first (as root): ``scripts/slurm-lab up`` (Slurm 22.05 on the host), or
``scripts/slurm-lab --slurm 24.11 up`` and ``DIKE_LAB_SLURM=24.11`` for the chroot lab of
another version. When it is not up, every test here fails loudly, unless ``DIKE_SKIP_SLURM=1``
is set, which turns the failure into a skip. The tests take the lab over: each one starts
and ends with an empty queue (every job in the lab is cancelled).

Tests that read Slurm's JSON themselves do it through dike_slurm's own readers
(``SlurmLab.cluster``, ``SlurmLab.sacct_records``), never with their own idea of its shape.
dike_slurm is imported only there, from the installed package.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LAB_SCRIPT = REPO / "scripts" / "slurm-lab"

T = TypeVar("T")


# The test matrix (docs/slurm-lab.md, "Which test runs where"): every integration test declares
# what it exercises, so that `make test` knows where to run it.
MATRIX_MARKERS = {
    "adapter": "what differs between Slurm versions (reads, writes and reverts of each field, accounting, "
               "the priority model, PrivateData, GPU types, Switches): runs on every version",
    "scenario": "the engine's behaviour, the same on every version (faults, preemption scenarios, the "
                "service, the CLI): runs on one version per backend",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the real Slurm lab cluster (scripts/slurm-lab up)")
    for name, text in MATRIX_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_report_header(config: pytest.Config) -> str:
    return f"Slurm lab: {os.environ.get('DIKE_LAB_SLURM', '22.05')} (scripts/slurm-lab --slurm VERSION)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items: mark only the ones under this folder.
    undeclared = []
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slurm)
            declared = [name for name in MATRIX_MARKERS if item.get_closest_marker(name)]
            if len(declared) != 1:
                undeclared.append(f"{item.nodeid} ({' and '.join(declared) or 'neither'})")
    if undeclared:
        raise pytest.UsageError(
            "every integration test is marked either adapter or scenario (tests/integration/conftest.py, "
            "MATRIX_MARKERS; docs/slurm-lab.md):\n  " + "\n  ".join(undeclared))


class SlurmLab:
    """Handle on the running lab: environment, paths and a few helpers.

    Every command runs as an argv list (never through a shell) with ``env``.
    """

    def __init__(self, env: dict[str, str], lab_dir: Path) -> None:
        self.env = env
        self.lab_dir = lab_dir
        self.slurm_conf = Path(env["SLURM_CONF"])
        self.version = env.get("DIKE_LAB_SLURM", "22.05")
        self.bin_dir = Path(env.get("DIKE_LAB_BIN", "/usr/bin"))  # the lab's Slurm commands
        # Slurm commands reach a chroot lab through its wrappers (a user's through DIKE_LAB_USER);
        # tests run inside the chroot (`slurm-lab --slurm 25.11 run pytest`) call them directly
        self.in_chroot = self.bin_dir != Path("/usr/bin")
        self.submitted: set[int] = set()  # jobs sbatch'ed since the queue was last emptied

    @property
    def engine_backend(self) -> str:
        """The backend the lab's dike.toml gives the engine: "cli", or "pyslurm" on the 25.11 lab."""
        import tomllib

        path = Path(self.env.get("DIKE_CONFIG", ""))
        if not path.is_file():
            return "cli"
        return str(tomllib.loads(path.read_text(encoding="utf-8")).get("slurm", {}).get("backend", "cli"))

    def run(self, *argv: str, user: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command (as ``user`` when given) and capture its output.

        On the host lab a user's command goes through ``runuser``; a chroot lab's command
        wrappers run it as that user themselves (``DIKE_LAB_USER``: chroot needs root).
        """
        cmd = list(argv)
        env = self.env
        if user is not None and self.in_chroot:
            env = {**self.env, "DIKE_LAB_USER": user}
        elif user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        proc = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{shlex.join(cmd)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def backend(self) -> Any:
        """The engine's command-line backend on this lab, whatever Slurm version it runs."""
        from dike_slurm.config import SlurmSettings
        from dike_slurm.slurm.backends.cli import SlurmCliBackend

        settings = SlurmSettings(slurm_conf=self.slurm_conf, bin_dir=self.bin_dir)
        return SlurmCliBackend(settings, environ=self.env)

    def cluster(self) -> Any:
        """The cluster as the engine's command-line backend reads it (jobs, nodes, admin comments)."""
        return self.backend().read_cluster()

    def pyslurm_backend(self) -> Any:
        """The engine's pyslurm backend on this lab (the 25.11 lab, inside its chroot)."""
        from dike_slurm.config import SlurmSettings
        from dike_slurm.slurm.backends.pyslurm import PyslurmBackend

        return PyslurmBackend.create(SlurmSettings(slurm_conf=self.slurm_conf, bin_dir=self.bin_dir))

    def sacct_records(self, *argv: str) -> dict[int, list[Any]]:
        """`sacct --json ARGV` read by dike_slurm's own reader: job id -> its runs (AccountingRecord)."""
        from dike_slurm.slurm.accounting_json import read_sacct_json

        result = read_sacct_json(self.run("sacct", "--json", *argv).stdout, "sacct --json")
        assert result.skipped == {}, result.skipped
        records: dict[int, list[Any]] = {}
        for record in result.records:
            records.setdefault(record.job_id, []).append(record)
        return records

    def sbatch(self, *args: str, user: str | None = None) -> int:
        """Submit a batch job and return its id.

        ``args`` are sbatch arguments (e.g. ``"-N2", "--gres=gpu:8", "--wrap", "sleep 30"``).
        Output goes to /dev/null and the job runs in /tmp unless ``args`` say otherwise.
        ``user`` submits as that Unix user (``runuser -u USER -- sbatch``), so the job is
        really theirs (munge credential, association, fairshare).
        """
        argv = ["sbatch", "--parsable"]
        if not any(a in ("-o", "--output") or a.startswith("--output=") for a in args):
            argv.append("--output=/dev/null")
        if not any(a in ("-D", "--chdir") or a.startswith("--chdir=") for a in args):
            argv.append("--chdir=/tmp")
        out = self.run(*argv, *args, user=user).stdout.strip()
        job_id = int(out.split(";", 1)[0])
        self.submitted.add(job_id)
        return job_id

    def job_ids(self) -> list[int]:
        """Ids of all jobs the controller still lists (pending, running, completing)."""
        out = self.run("squeue", "-h", "-o", "%A").stdout
        return sorted({int(x) for x in out.split()})

    def scancel_all(self, timeout: float = 30) -> None:
        """Cancel every job in the lab, wait until squeue lists none, then until accounting holds
        the end of every job the test submitted or left behind.

        slurmctld sends job ends to slurmdbd asynchronously: a job can leave squeue a moment
        before sacct shows it ended. A next test whose engine reads that late end between two
        cycles sees its history change under it (seen in CI on 22.05: a quiet second cycle
        rewrote a SiteFactor because a finished job joined the service prior's history).
        """
        ids = self.job_ids()
        if ids:
            self.run("scancel", *map(str, ids), check=False)
            self.wait_for(lambda: not self.job_ids(), timeout, f"jobs {ids} still listed after scancel")
        left = sorted(self.submitted | set(ids))
        if left:
            self.wait_for(lambda: not self.unended(left), 60, f"accounting to record the end of jobs {left}")
        self.submitted.clear()

    def wait_indexed(self, job_ids: list[int], timeout: float = 60) -> None:
        """Wait until slurmdbd holds a record of every job: slurmctld has its database index.

        slurmctld asks slurmdbd for new jobs' indexes out of band (a thread that wakes every 5 s);
        until it has one, and while a request is out (after a restart too, for every job still
        without one), `scontrol update` of the job answers "try again in a bit" (job_mgr.c,
        ESLURM_JOB_SETTING_DB_INX). A job whose record sacct lists was indexed by that request.
        """
        wanted = set(job_ids)
        self.wait_for(lambda: wanted <= set(self.sacct_records("--allusers", "-j", ",".join(map(str, job_ids)))),
                      timeout, f"slurmdbd to index jobs {sorted(wanted)}")

    def unended(self, job_ids: list[int]) -> list[int]:
        """Those of ``job_ids`` whose end sacct does not show yet: no record, or a run (an array
        task's, for an array) not ended."""
        from dike_slurm.domain.model import JobState

        live = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)  # a REQUEUED run has ended
        records = [r for runs in self.sacct_records("--allusers", "-j", ",".join(map(str, job_ids))).values()
                   for r in runs]
        ended = {job: True for job in job_ids}
        seen = set()
        for record in records:
            for job in (record.job_id, record.array_job_id):
                if job in ended:
                    seen.add(job)
                    ended[job] = ended[job] and record.end is not None and record.state not in live
        return [job for job in job_ids if job not in seen or not ended[job]]

    def wait_for(self, predicate: Callable[[], T], timeout: float = 30, message: str = "",
                 interval: float = 0.25) -> T:
        """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout} s: {message or predicate}")
            time.sleep(interval)

    @staticmethod
    def at(moment: float) -> None:
        """Return at the wall-clock `moment` (time.time()): an experiment's own schedule (submissions
        spread over seconds, an update at a set point of a job's wait), never a wait for Slurm's state,
        which `wait_for` polls."""
        time.sleep(max(0.0, moment - time.time()))

    def scheduler_passes(self) -> tuple[int, int]:
        """The main scheduler's and the backfill scheduler's passes so far (sdiag's "Total cycles" of
        each; `sdiag -r` resets them)."""
        out = self.run("sdiag").stdout
        counts = []
        for section in ("Main schedule statistics", "Backfilling stats"):
            if section not in out:
                raise AssertionError(f"no {section!r} in sdiag:\n{out}")
            match = re.search(r"^\s*Total cycles:\s*(\d+)", out.split(section, 1)[1], re.MULTILINE)
            if match is None:
                raise AssertionError(f"no 'Total cycles' under {section!r} in sdiag:\n{out}")
            counts.append(int(match[1]))
        return counts[0], counts[1]

    def wait_scheduler_passes(self, passes: int = 2, *, backfill: bool = True, timeout: float = 60) -> None:
        """Wait until the main scheduler (and the backfill one) has run ``passes`` more passes: with
        two, one began after this call, so what it saw, Slurm has acted on. Backfill counts no pass
        while no job is eligible (a job waiting for its begin time): then ``backfill=False``."""
        before = self.scheduler_passes()
        wanted = (before[0] + passes, before[1] + passes if backfill else 0)
        self.wait_for(lambda: all(now >= want for now, want in zip(self.scheduler_passes(), wanted)), timeout,
                      f"{passes} main{' and backfill' if backfill else ''} scheduler passes after {before} "
                      f"(main, backfill)")

    def run_time(self, job_id: int) -> int:
        """Seconds a job has run (squeue's TIME, `%M`, read as dike_slurm reads Slurm durations); 0
        when it is not listed or has not started."""
        from dike_slurm.parsing.durations import parse_duration

        text = self.run("squeue", "-h", "-j", str(job_id), "-o", "%M", check=False).stdout.strip()
        return (parse_duration(text) or 0) if ":" in text else 0

    def wait_run_time(self, job_id: int, seconds: float, timeout: float = 60) -> None:
        """Wait until a running job has run `seconds` (so that GPUs x seconds passes a level threshold)."""
        self.wait_for(lambda: self.run_time(job_id) >= seconds, timeout, f"job {job_id} to run {seconds} s",
                      interval=0.5)

    def job_state(self, job_id: int) -> str:
        """State of a job as the controller sees it ('' once it has left squeue)."""
        return self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()

    def job_nodes(self, job_id: int) -> list[str]:
        """Nodes of a running job, expanded (n[1-2] -> [n1, n2])."""
        hostlist = self.run("squeue", "-h", "-j", str(job_id), "-o", "%N").stdout.strip()
        if not hostlist:
            return []
        return self.run("scontrol", "show", "hostnames", hostlist).stdout.split()


def _lab_env() -> dict[str, str]:
    """os.environ plus the exports printed by ``scripts/slurm-lab env``."""
    env = dict(os.environ)
    out = subprocess.run([str(LAB_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            env[key] = value
    return env


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    skip = os.environ.get("DIKE_SKIP_SLURM") == "1"
    env = _lab_env()
    status = subprocess.run([str(LAB_SCRIPT), "status"], env=env, capture_output=True, text=True)
    if status.returncode != 0:
        message = (f"the Slurm lab is not up: run `sudo scripts/slurm-lab up` first "
                   f"(or set DIKE_SKIP_SLURM=1 to skip these tests).\n{status.stdout}{status.stderr}")
        if skip:
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    lab = SlurmLab(env, Path(env["SLURM_CONF"]).parent.parent)
    yield lab
    lab.scancel_all()


@pytest.fixture(autouse=True)
def _empty_queue(slurm_lab: SlurmLab) -> Iterator[None]:
    """Every integration test needs the lab, and starts and ends with no job in it."""
    slurm_lab.scancel_all()
    yield
    slurm_lab.scancel_all()
