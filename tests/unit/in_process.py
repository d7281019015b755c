"""`dike-slurm ARGS` run in this process with typer's CliRunner, as a new process would see it.

Starting a new Python for each command pays its imports again (pandas, numpy, matplotlib for the
offline commands); a test that reads only a command's exit code and output runs it here instead,
against `dike_slurm.cli.app`. The result is a subprocess.CompletedProcess (returncode, stdout,
stderr apart: CliRunner keeps them apart from typer 0.24 on, setup.cfg's test extra), so the
assertions read as before.

What a fresh process would have to itself is set for the command and restored after it, so tests
stay independent of each other and of their order:
- the environment, given whole (as subprocess.run's `env=`), or this one; the working folder;
  sys.argv (`eval` records its command line from it);
- logging as a fresh interpreter has it: no handler on the root logger, so a warning goes to stderr
  (logging's last resort), not to pytest's capture; the "dike_slurm" logger's handlers and level
  (`run` installs a stderr handler);
- the SIGTERM, SIGINT and SIGHUP handlers (`run` installs them);
- the consoles' width: piped output's (dike_slurm.cli.group decides it once, at import, from the terminal).
An exception that the command did not turn into an exit code is written to stderr as the traceback
Python prints (exit code 1), so `"Traceback" not in result.stderr` still fails on one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from unittest import mock

from typer.testing import CliRunner

from dike_slurm import cli
from dike_slurm.cli import group

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _fresh_process_state(argv: list[str], cwd: Path | None) -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("dike_slurm")
    saved_logging = (root.handlers[:], root.level, ours.handlers[:], ours.level, ours.propagate)
    saved_signals = {number: signal.getsignal(number) for number in _SIGNALS}
    saved_argv = sys.argv
    root.handlers[:], ours.handlers[:] = [], []
    root.setLevel(logging.WARNING)
    ours.setLevel(logging.NOTSET)
    ours.propagate = True
    sys.argv = argv
    try:
        with contextlib.chdir(cwd or os.getcwd()), \
                mock.patch.object(group.console, "_width", group.PIPE_WIDTH), \
                mock.patch.object(group.err_console, "_width", group.PIPE_WIDTH):
            yield
    finally:
        sys.argv = saved_argv
        for number, handler in saved_signals.items():
            signal.signal(number, handler)
        root.handlers[:], root_level, ours.handlers[:], ours_level, ours.propagate = saved_logging
        root.setLevel(root_level)  # setLevel, not .level: it clears the loggers' cached levels
        ours.setLevel(ours_level)


def dike_slurm(*args: str, env: Mapping[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`dike-slurm *args` with this environment (whole; None: this process's) in this folder."""
    argv = ["dike-slurm", *map(str, args)]
    with _environment(env), _fresh_process_state(argv, cwd):
        result = CliRunner().invoke(cli.app, argv[1:], prog_name="dike-slurm")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, stderr)
