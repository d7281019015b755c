"""Running Slurm's commands: an argv list without a shell, in its own process group, killed whole
on timeout; read (`run_command`, `read_output`) or fed text on its standard input (`feed_command`)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dike_slurm.errors import DikeError, SlurmError


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], Mapping[str, str], float], CommandResult]


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> CommandResult:
    """Run argv without a shell; missing commands and timeouts become SlurmError.

    The command runs in its own process group, which is killed whole on timeout: a hanging
    wrapper that spawned children cannot keep the pipes (and so the engine) waiting. Output
    that is not UTF-8 (job names are bytes to Slurm) is decoded with replacement characters.
    """
    result = _communicate(argv, env, None, timeout)
    if result.killed_after is not None:
        raise SlurmError(f"{shlex.join(argv)} timed out after {timeout:.3g}s")
    return CommandResult(result.returncode, result.stdout, result.stderr)


def read_output(argv: list[str], env: Mapping[str, str], timeout: float) -> str:
    """A read-only command's stdout; a command that fails is a DikeError in one line (`failure`)."""
    result = run_command(argv, env, timeout)
    if result.returncode != 0:
        raise failure(argv, result.returncode, result.stderr)
    return result.stdout


def failure(argv: Sequence[str], returncode: int, stderr: str) -> DikeError:
    """A failed command as one line: its last two messages, without the `NAME: error:` prefix
    (sacctmgr names the host and port first, then what it was doing)."""
    lines = [re.sub(r"^\S+: error: ", "", line.strip()) for line in stderr.splitlines() if line.strip()]
    return DikeError(f"{shlex.join(argv)} failed: {'; '.join(lines[-2:]) or f'exit {returncode}'}")


@dataclass(frozen=True)
class FedResult:
    """A command fed text on stdin: its exit code (None when killed), output, and after how many
    seconds it was killed (None: it ended by itself)."""

    returncode: int | None
    stdout: str
    stderr: str
    killed_after: float | None = None


Feeder = Callable[[Sequence[str], Mapping[str, str], str, float], FedResult]


def feed_command(argv: Sequence[str], env: Mapping[str, str], stdin: str, timeout: float) -> FedResult:
    """Run argv without a shell with `stdin` on its standard input; killed (its whole process
    group) after `timeout` seconds, keeping what it printed until then."""
    return _communicate(argv, env, stdin, timeout)


def _communicate(argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout: float) -> FedResult:
    timeout = min(timeout, 7 * 86400.0)  # subprocess cannot wait longer than a C long of milliseconds
    try:
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, start_new_session=True,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: command not found (set slurm.bin_dir)") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror}") from None
    data = None if stdin is None else stdin.encode("utf-8")
    killed_after = None
    try:
        stdout, stderr = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        killed_after = timeout
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child left the group and holds the pipes: give up on them
            proc.kill()
            stdout, stderr = b"", b""
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return FedResult(
        None if killed_after is not None else proc.returncode,
        (stdout or b"").decode("utf-8", errors="replace"),
        (stderr or b"").decode("utf-8", errors="replace"),
        killed_after,
    )
