"""The engine's lock: an advisory lock file, so that two engines never write the same cluster at once."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dike_slurm.errors import StateError


class LockHeld(StateError):
    """Another engine (a running service, a cycle of the timer or cron) holds the lock."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path, self.pid = path, pid
        super().__init__(f"another dike-slurm engine holds {path}" + (f" (pid {pid})" if pid else ""))


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an advisory lock so that two engines never write the same cluster at once."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StateError(f"cannot open lock file {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(path, _read_pid(handle)) from None
        # flock dies with its process: a lock file left by a dead engine is simply taken over.
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(handle)


def _read_pid(handle: int) -> int | None:
    try:
        text = os.pread(handle, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
