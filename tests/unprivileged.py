"""Run a command as a user without root, also when this Python lives where that user cannot go.

The project's venv may sit on a Python under /root (pyenv), which no other user can start. Then
the command runs through `setpriv` with the user's uid, gid and groups plus one capability,
CAP_DAC_READ_SEARCH: it may read any file and search any folder (so it reaches this Python and
its packages), and it may write nothing the user may not write. Slurm sees the user (munge reads
the uid), and a write to a read-only path fails as it would for the user.
"""

from __future__ import annotations

import functools
import os
import pwd
import subprocess
import sys

READ_ANYTHING = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


@functools.cache
def _runuser_starts_python(user: str) -> bool:
    probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "import dike_slurm"],
                           capture_output=True, cwd="/", timeout=60)
    return probe.returncode == 0


def as_user(user: str, argv: list[str], *, read_anything: bool = False) -> list[str]:
    """`argv` run as `user`; needs root (the caller checks os.geteuid() == 0). `read_anything`: always
    through setpriv with CAP_DAC_READ_SEARCH (a test that needs the user able to read root's files)."""
    assert os.geteuid() == 0, "only root can run a command as another user"
    if not read_anything and _runuser_starts_python(user):
        return ["runuser", "-u", user, "--", *argv]
    entry = pwd.getpwnam(user)
    groups = ["--init-groups"] if entry.pw_uid != 65534 else ["--clear-groups"]
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", *groups, *READ_ANYTHING, "--", *argv]
