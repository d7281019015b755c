"""The command-line backend: Slurm's own commands, read as JSON or fixed formats, written with scontrol.

Every call is an argv list run without a shell, with a timeout, with `SLURM_CONF` from the
configuration and `TZ=UTC` (so that sacct prints, and reads -S/-E, in UTC like the rest of
the engine). Job names, comments and accounts are data only: they never reach a command line
except as the value of our own fields, which is a single argv element.

Read once when the engine starts (and after a reload), not every cycle: the site's own priority
settings (`priority_model`, backends/site_priority.py). The commands run through
backends/commands.py.

Reads per cycle, the lean way (the default; dike_slurm.slurm.backends.squeue_format): `squeue -O` with
the 29 fields the engine uses (jobs by id), `squeue -o %A%x` (ExcNodeList, which -O lacks), `sprio`
(SiteFactor, which `scontrol show job` does not print in 22.05), `sinfo -N -O` (nodes), `sacct
--parsable2` with explicit -S/-E, and `scontrol show topology` unless a topology.conf is
configured. When squeue refuses a field of that format ("Invalid job format specification") or
exits non-zero, the cycle reads the JSON instead (and fails with the JSON read's error if that
fails too, e.g. slurmctld down): `squeue --json`, `squeue -O` (Switches, which the JSON of 22.05
lacks), sprio, the nodes (`sinfo --json` on 22.05; `scontrol show nodes --json` from 23.11 on,
where sinfo groups nodes). Writes: `update JobId=N Key=Value...` lines fed to one `scontrol` per
batch (`apply_many`, backends/scontrol_stdin.py), or one `scontrol update` process for an update
that cannot be a line.

The JSON format (Slurm 22.05's v0.0.38, or the v0.0.40+ family of 23.11 to 26.05) is taken from
the `meta` block of squeue's output every cycle; dike_slurm.slurm.formats adapts each family to
the one domain model. Every entry Slurm printed is read, deliberately left out (a finished job)
or an error: an unknown format, a missing list, an unknown job state or an entry that cannot be
read stops the cycle before any write, with one line that names the command.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from dike_slurm.slurm.accounting import ReadResult, read_sacct_parsable2
from dike_slurm.slurm.backends import scontrol_stdin, squeue_format
from dike_slurm.slurm.backends.base import Backend, ClusterState, ReadMemory, WriteOutcome
from dike_slurm.domain.fields import FieldValue, JobField, JobUpdate, SwitchRequest
from dike_slurm.slurm.backends.commands import CommandResult, Feeder, Runner, feed_command, run_command
from dike_slurm.slurm.backends.scontrol_stdin import JOB_GONE, refused, value_text
from dike_slurm.slurm.backends.site_priority import read_priority_model
from dike_slurm.slurm.backends.squeue_json import _text, job_from_squeue, node_from_sinfo
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import ConfigError, InputError, SlurmError
from dike_slurm.domain.model import Job, Node, Topology
from dike_slurm.parsing.durations import format_timestamp, parse_duration
from dike_slurm.slurm.slurm_conf import parse_topology_conf
from dike_slurm.slurm.formats import FormatError, ReadCount, SlurmFormat, detect, entries, slurm_release
from dike_slurm.domain.slurm_priority import SlurmPriorityModel

log = logging.getLogger("dike_slurm.backends.cli")
_T = TypeVar("_T")

SACCT_FORMAT = (
    "JobID,JobIDRaw,JobName,User,Account,Partition,QOS,State,Submit,Eligible,Start,End,"
    "ElapsedRaw,Timelimit,NNodes,NCPUS,AllocTRES,ReqTRES,NodeList"
)
SWITCH_FORMAT = "JobID:|,ReqSwitch:|,Wait4Switch:|"
SPRIO_FORMAT = "%i|%S|%Y"
_FORMAT_REFUSED = "Invalid job format specification"  # squeue's words for a -O field it does not know


def topology_from_scontrol(text: str) -> Topology:
    """`scontrol show topology`: upper switches list every node below them; keep only leaves' nodes."""
    lines = []
    for line in text.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "SwitchName" not in words:
            continue
        if words.get("Switches"):
            lines.append(f"SwitchName={words['SwitchName']} Switches={words['Switches']}")
        elif words.get("Nodes"):
            lines.append(f"SwitchName={words['SwitchName']} Nodes={words['Nodes']}")
    return parse_topology_conf("\n".join(lines), source="scontrol show topology") if lines else Topology()


def _json_error(errors: Any) -> str:
    """The first entry of a JSON `errors` list in one line ("Failed while looking for jobs (slurm_load_jobs)")."""
    first = errors[0] if isinstance(errors, list) and errors else errors
    if isinstance(first, dict):
        text = str(first.get("description") or first.get("error") or "unknown error")
        source = first.get("source")
        text += f" ({source}: {first.get('error')})" if source else ""
        if str(source).startswith("slurm_load"):
            text += "; is slurmctld up?"
        return " ".join(text.split())
    return " ".join(str(first).split())


def _reason(exc: Exception) -> str:
    """A skip reason in one short line (the message may quote Slurm's data)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def field_argument(key: JobField, value: FieldValue) -> str:
    """`Key=Value` for scontrol update; the value is one argv element, never shell text."""
    return f"{key.value}={value_text(value)}"


class _LeanRefused(Exception):
    """squeue could not print the lean format (the reason); the cycle reads the JSON instead."""


def _sprio_factors(text: str) -> Mapping[int, int]:
    """`sprio -h -o SPRIO_FORMAT`: each listed job's SiteFactor."""
    factors = {}
    for line in text.splitlines():
        parts = line.split("|", 2)  # the job id and SiteFactor; the rest is not read
        if len(parts) >= 2:
            job_id, factor = parts[0].strip(), parts[1].strip()
            if job_id.isdigit() and factor.removeprefix("-").isdigit():  # one sign at most ("--0" is no number)
                factors[int(job_id)] = int(factor)
    return MappingProxyType(factors)


class SlurmCliBackend(Backend):
    """Slurm through its commands (the default backend; tested against a real Slurm 22.05)."""

    name = "cli"

    def __init__(
        self,
        settings: SlurmSettings,
        *,
        runner: Runner = run_command,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
        job_read: str = "lean",
        token: squeue_format.TokenSource = squeue_format.new_token,
        feeder: Feeder | None = None,
    ) -> None:
        """`job_read`: "lean" (squeue -O, JSON when squeue refuses it) or "json" (always the JSON);
        `token`: the source of the per-call field terminator of the lean read; `feeder` runs the
        one scontrol that `apply_many` feeds lines (by default the real one; a backend given its own
        `runner` and no feeder writes one process per update through that runner)."""
        if job_read not in ("lean", "json"):
            raise ValueError(f"job_read must be 'lean' or 'json', not {job_read!r}")
        self.settings = settings
        self.job_read = job_read
        self.token = token
        self.lean_refused: str | None = None  # why squeue refused the lean read (then the JSON is read)
        self.runner = runner
        self.feeder = feeder if feeder is not None else feed_command if runner is run_command else None
        self.clock = clock
        env = dict(os.environ if environ is None else environ)
        env["TZ"] = "UTC"
        # A caller's SLURM_TIME_FORMAT (an admin's shell with %s, say) changes how sacct and scontrol
        # print times: sacct's rows would then all be skipped as bad timestamps, and the prior and
        # fair share would see no finished job. Our readers read Slurm's standard format.
        env.pop("SLURM_TIME_FORMAT", None)
        if settings.slurm_conf is not None:
            if not Path(settings.slurm_conf).is_file():
                raise ConfigError(f"slurm.slurm_conf: no such file {settings.slurm_conf}")
            env["SLURM_CONF"] = str(settings.slurm_conf)
        self.env = MappingProxyType(env)
        # The lean read: times as epoch seconds, and no SQUEUE_*/SINFO_* defaults of the caller
        # (SQUEUE_ARRAY would list every task of a pending array, SQUEUE_SORT reorder nothing we need).
        lean = {k: v for k, v in env.items() if not k.startswith(("SQUEUE_", "SINFO_"))}
        lean["SLURM_TIME_FORMAT"] = "%s"
        self.lean_env = MappingProxyType(lean)
        self._reads_until: float | None = None  # monotonic time: see limit_reads
        self.slurm_format: SlurmFormat | None = None  # of the last squeue read
        self.slurm_release: str | None = None
        self.last_counts: tuple[ReadCount, ...] = ()  # what the last read_cluster printed and read
        self.kept = ReadMemory()  # the engine's, once it asks (keep_reads_in)

    def keep_reads_in(self, memory: ReadMemory) -> None:
        self.kept = memory

    def _command(self, name: str) -> str:
        return str(self.settings.bin_dir / name) if self.settings.bin_dir is not None else name

    def limit_reads(self, seconds: float | None) -> None:
        self._reads_until = None if seconds is None else time.monotonic() + seconds

    def _run(self, *argv: str, timeout: float | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        self.calls += 1
        timeout = self.settings.command_timeout_s if timeout is None else timeout
        return self.runner(argv, self.env if env is None else env, timeout)

    def _read(self, *argv: str, env: Mapping[str, str] | None = None) -> str:
        result = self._read_result(*argv, env=env)
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise SlurmError(f"{shlex.join(argv)} failed (exit {result.returncode}): {detail}")
        return result.stdout

    def _read_result(self, *argv: str, env: Mapping[str, str] | None = None) -> CommandResult:
        # Reads also stop at the cycle deadline (limit_reads); writes keep their whole timeout,
        # as a write cut short leaves Slurm's state unknown.
        timeout = self.settings.command_timeout_s
        if self._reads_until is not None:
            left = self._reads_until - time.monotonic()
            if left <= 0:
                raise SlurmError(f"{shlex.join(argv)} not started: the cycle deadline has passed")
            timeout = min(timeout, left)
        try:
            return self._run(*argv, timeout=timeout, env=env)
        except SlurmError as exc:
            if timeout < self.settings.command_timeout_s:
                raise SlurmError(f"{exc}: what was left of the cycle deadline") from None
            raise

    def _json(self, *argv: str) -> dict[str, Any]:
        text = self._read(*argv)
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{shlex.join(argv)} printed invalid JSON: {exc.msg}") from None
        if not isinstance(document, dict):
            raise SlurmError(f"{shlex.join(argv)} printed JSON that is not an object")
        errors = document.get("errors") or []
        if errors:
            raise SlurmError(f"{shlex.join(argv)} failed: {_json_error(errors)}")
        return document

    # ---------------------------------------------------------------- reads

    def read_cluster(self) -> ClusterState:
        now = self.clock()
        if self.job_read == "json":
            return self._read_json(now)
        try:
            return self._read_lean(now)
        except _LeanRefused as refused:
            # squeue could not do the -O read: the JSON read then either works (a Slurm whose
            # squeue refuses a field or option: warn once) or fails with its own message (slurmctld
            # down: no warning, one error)
            cluster = self._read_json(now)
            if self.lean_refused is None:
                log.warning("squeue -O refused (%s): reading squeue --json instead", refused)
            self.lean_refused = str(refused)
            return cluster

    def _read_lean(self, now: float) -> ClusterState:
        """squeue -O, squeue -o (ExcNodeList), sprio, sinfo -N -O; _LeanRefused when squeue exits
        non-zero or names a field it does not know."""
        token = self.token()  # each call draws its own
        squeue = self._command("squeue")
        argv = (squeue, "-a", "--sort=i", "-O", squeue_format.job_format(token))  # by job id: the same order every cycle
        result = self._read_result(*argv, env=self.lean_env)
        # squeue names a field it does not know on stderr, prints it empty and exits 0
        refused = [line for line in result.stderr.splitlines() if _FORMAT_REFUSED in line]
        if refused:
            raise _LeanRefused(" ".join(refused[0].split()))
        if result.returncode != 0:
            detail = " ".join((result.stderr.strip().splitlines() or ["no message"])[-1].split())
            raise _LeanRefused(f"exit {result.returncode}: {detail}")
        self.lean_refused = None
        excluded_token = self.token()
        excluded = self._read(squeue, "-a", "-o", squeue_format.excluded_format(excluded_token), env=self.lean_env)
        lean = squeue_format.read_jobs(result.stdout, token, "squeue -O", excluded, excluded_token, "squeue -o %A%x",
                                       known=self.kept.jobs)
        self.kept.jobs = lean.by_record
        site_factors = self.site_factors()
        node_token = self.token()
        text = self._read(self._command("sinfo"), "-N", "-O", squeue_format.node_format(node_token), env=self.lean_env)
        nodes, node_count = squeue_format.read_nodes(text, node_token, "sinfo -N -O")
        self.last_counts = (lean.count, node_count)
        self.slurm_format = self.slurm_release = None
        return ClusterState(
            time=now,
            jobs=lean.jobs,
            nodes=tuple(nodes.values()),
            topology=self._topology(),
            site_factors=site_factors,
            admin_comments=MappingProxyType(lean.admin_comments),
        )

    def _read_json(self, now: float) -> ClusterState:
        command = "squeue --json"
        queue = self._json(self._command("squeue"), "--json")
        fmt = detect(queue, command)
        self.slurm_format, self.slurm_release = fmt, slurm_release(queue)
        items = entries(queue, "jobs", command)
        switches = self._switch_requests()
        site_factors = self.site_factors()
        jobs: list[Job] = []
        admin_comments: dict[int, str] = {}
        job_count = ReadCount(command, printed=len(items))
        for entry in items:
            try:
                if not isinstance(entry, dict):
                    raise ValueError("entry is not an object")
                job = job_from_squeue(entry, switches)
            except (ValueError, TypeError, OverflowError, InputError) as exc:
                job_count.skip(_reason(exc))
                continue
            if not job.state.is_active:  # finished jobs stay in squeue for MinJobAge
                job_count.left_out += 1
            elif job.job_id in admin_comments:
                job_count.skip("job id listed twice")
            else:
                jobs.append(job)
                admin_comments[job.job_id] = _text(entry.get("admin_comment"))
                job_count.read += 1
        job_count.check("jobs")
        nodes, node_count = self._nodes(fmt)
        self.last_counts = (job_count, node_count)
        log.debug("read: %s", "; ".join(
            f"{c.command}: {c.printed} printed, {c.read} read, {c.left_out} left out" for c in self.last_counts))
        return ClusterState(
            time=now,
            jobs=tuple(jobs),
            nodes=tuple(nodes.values()),
            topology=self._topology(),
            site_factors=site_factors,
            admin_comments=MappingProxyType(admin_comments),
        )

    def _nodes(self, fmt: SlurmFormat) -> tuple[dict[str, Node], ReadCount]:
        """One record per node: `sinfo --json` (v0.0.38) or `scontrol show nodes --json` (v0.0.40+,
        where sinfo groups nodes that share a state)."""
        argv = (self._command(fmt.nodes_command), *fmt.nodes_argv)
        command = shlex.join((fmt.nodes_command, *fmt.nodes_argv))
        document = self._json(*argv)
        if detect(document, command) is not fmt:
            raise FormatError(f"{command}: prints another JSON format than squeue --json on the same cluster")
        items = entries(document, "nodes", command)
        if not items:
            raise FormatError(f"{command}: Slurm printed no nodes")
        count = ReadCount(command, printed=len(items))
        nodes: dict[str, Node] = {}
        for entry in items:
            try:
                if not isinstance(entry, dict):
                    raise ValueError("entry is not an object")
                node = node_from_sinfo(entry)
            except (ValueError, TypeError, OverflowError, InputError) as exc:
                count.skip(_reason(exc))
                continue
            if node.name in nodes:  # listed once per partition
                count.left_out += 1
            else:
                nodes[node.name] = node
                count.read += 1
        count.check("nodes")
        return nodes, count

    def _switch_requests(self) -> dict[int, SwitchRequest]:
        """Switches=COUNT@WAIT of pending jobs (squeue -O; numbers only, nothing user-typed)."""
        text = self._read(self._command("squeue"), "-h", "-a", "-t", "PD", "-O", SWITCH_FORMAT)
        requests = {}
        for line in text.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
                continue
            try:
                wait = parse_duration(parts[2])
            except InputError:
                wait = None
            requests[int(parts[0])] = SwitchRequest(int(parts[1]), wait)
        return requests

    def _parsed(self, kind: str, text: str, parse: Callable[[str], _T]) -> _T:
        """`parse(text)`, or the same value as last time when Slurm printed the same text (sprio
        and the topology of a quiet cluster: nothing may change what is handed out)."""
        parsed = self.kept.parsed
        last = parsed.get(kind)
        if last is not None and last[0] == text:
            return last[1]  # type: ignore[return-value]
        value = parse(text)
        parsed[kind] = (text, value)
        return value

    def site_factors(self) -> Mapping[int, int]:
        """SiteFactor of eligible pending jobs (sprio lists no others)."""
        return self._parsed("sprio", self._read(self._command("sprio"), "-h", "-o", SPRIO_FORMAT), _sprio_factors)

    def _topology(self) -> Topology:
        path = self.settings.topology_conf
        if path is not None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                raise SlurmError(f"cannot read topology file {path}: {exc.strerror}") from None
            return self._parsed("topology.conf", text, functools.partial(parse_topology_conf, source=str(path)))
        return self._parsed("scontrol show topology", self._read(self._command("scontrol"), "show", "topology"),
                            topology_from_scontrol)

    def priority_model(self) -> SlurmPriorityModel:
        """The site's PriorityWeight* settings, partitions and QOS priorities (three reads: the
        engine asks at start and after a reload); a failed read raises SlurmError naming the command."""
        return read_priority_model(lambda argv: self._read(*argv), self._command)

    def accounting(self, start: float, end: float) -> ReadResult:
        text = self._read(
            self._command("sacct"), "--allusers", "--allocations", "--duplicates", "--parsable2",
            f"--format={SACCT_FORMAT}", "-S", format_timestamp(start), "-E", format_timestamp(end),
        )
        if not text.strip():
            return ReadResult((), 0, {}, "sacct")
        return read_sacct_parsable2(text, "sacct")

    # ---------------------------------------------------------------- writes

    def update_commands(self, update: JobUpdate) -> list[list[str]]:
        """The argv lists that apply this update (Priority back to Slurm: hold then release)."""
        scontrol = self._command("scontrol")
        job = str(update.job_id)
        arguments = [field_argument(k, v) for k, v in update.values if not (k is JobField.PRIORITY and v is None)]
        commands = [[scontrol, "update", f"JobId={job}", *arguments]] if arguments else []
        if any(k is JobField.PRIORITY and v is None for k, v in update.values):
            commands += [[scontrol, "hold", job], [scontrol, "release", job]]
        return commands

    def describe(self, update: JobUpdate) -> str:
        return " && ".join(shlex.join(argv) for argv in self.update_commands(update))

    def apply(self, update: JobUpdate) -> WriteOutcome:
        why = refused(update)
        if why is not None:
            return WriteOutcome(False, self.describe(update), why)
        return self._write(self.update_commands(update))

    def apply_many(self, updates: Sequence[JobUpdate], timeout: float | None = None) -> list[WriteOutcome]:
        """One `scontrol` fed a line per update (backends/scontrol_stdin.py), a round per job's
        first, second, ... update; an update that cannot be a line, and a line whose outcome
        scontrol left unclear, go one process each. `timeout` bounds each fed scontrol (at least
        command_timeout_s); once one was killed, nothing more is sent."""
        results: list[WriteOutcome | None] = [None] * len(updates)
        sendable = []
        for i, update in enumerate(updates):
            why = refused(update)
            if why is not None:
                results[i] = WriteOutcome(False, self.describe(update), why)
            else:
                sendable.append(i)
        killed = None
        for part in scontrol_stdin.rounds([updates[i] for i in sendable]):
            fed = [sendable[i] for i in part.fed]
            alone = [sendable[i] for i in part.alone]
            if killed is None and len(fed) > 1 and self.feeder is not None:
                answers, killed = self._feed([updates[i] for i in fed], part.lines, timeout)
                for i, answer in zip(fed, answers):
                    results[i] = answer
                alone = sorted(alone + [i for i, answer in zip(fed, answers) if answer is None])
            else:
                alone = sorted(alone + fed)
            for i in alone:
                results[i] = self.apply(updates[i]) if killed is None else WriteOutcome(
                    False, self.describe(updates[i]), f"not sent: the scontrol fed before it was killed after {killed:.3g}s")
        done = [r for r in results if r is not None]
        assert len(done) == len(updates)
        return done

    def _feed(self, updates: Sequence[JobUpdate], lines: Sequence[str],
              timeout: float | None) -> tuple[list[WriteOutcome | None], float | None]:
        """The lines fed to one scontrol: each update's outcome (None: unclear), and after how many
        seconds scontrol was killed (None: it ended by itself)."""
        assert self.feeder is not None
        scontrol = self._command("scontrol")
        self.calls += 1
        try:
            result = self.feeder((scontrol,), self.env, scontrol_stdin.stdin_text(lines),
                                 max(timeout or 0.0, self.settings.command_timeout_s))
        except SlurmError as exc:  # scontrol could not be started: nothing was sent
            return [WriteOutcome(False, self.describe(u), str(exc)) for u in updates], None
        answers = scontrol_stdin.outcomes([u.job_id for u in updates], lines, scontrol, result.returncode,
                                          result.stderr, result.killed_after)
        return answers, result.killed_after

    def requeue(self, job_id: int) -> WriteOutcome:
        return self._write([[self._command("scontrol"), "requeue", str(job_id)]])

    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        # --batch: the batch shell and its children, as `sbatch --signal=B:SIG@...` does
        return self._write([[self._command("scancel"), "--batch", f"--signal={signal}", str(job_id)]])

    def _write(self, commands: list[list[str]]) -> WriteOutcome:
        text = " && ".join(shlex.join(argv) for argv in commands)
        for argv in commands:
            try:
                result = self._run(*argv)
            except SlurmError as exc:
                return WriteOutcome(False, text, str(exc))
            if result.returncode != 0:
                message = " ".join(result.stderr.split()) or f"exit {result.returncode}"
                return WriteOutcome(False, text, message, job_gone=any(m in message for m in JOB_GONE))
        return WriteOutcome(True, text)
