"""The audit log as JSON lines: `audit --export` writes the whole file at once, and the retention
pass (StateStore.prune_audit) appends the rows it deletes, flushed to disk before the delete
commits."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from dike_slurm.errors import StateError
from dike_slurm.store.records import AuditEntry


def audit_json_line(entry: AuditEntry) -> str:
    """One audit entry as a JSON line (the fields of `audit --json`'s entries; the id is unique), in
    ASCII: any text, lone surrogates included, is escaped."""
    return json.dumps({
        "id": entry.id, "at": entry.at, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.at)),
        "cycle": entry.cycle, "job_id": entry.job_id, "user": entry.user, "action": entry.action,
        "change": entry.change, "command": entry.command, "undo": entry.undo, "ok": entry.ok, "message": entry.message,
        "reason": entry.reason,
    }) + "\n"


def append_audit_lines(path: Path, entries: list[AuditEntry], committed: int | None) -> int:
    """Append the entries to `path` and fsync; the file's new length. Bytes past `committed` (an
    export that a crash left without its delete) are cut off first. On failure (disk full) the file
    is cut back to where it was, and the OSError names the file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open audit export {path}: {exc.strerror}") from None
    try:
        length = os.fstat(handle).st_size
        if committed is not None and committed < length:
            os.ftruncate(handle, committed)
            length = committed
        try:
            data = "".join(audit_json_line(e) for e in entries).encode("ascii")
            view = memoryview(data)
            while view:
                view = view[os.write(handle, view):]
            os.fsync(handle)
        except OSError as exc:
            try:
                os.ftruncate(handle, length)
            except OSError:
                pass  # cut off by the next export (its committed length is `length`)
            raise OSError(exc.errno, f"cannot write audit export {path}: {exc.strerror}") from None
        return length + len(data)
    finally:
        os.close(handle)


def export_audit(entries: Iterable[AuditEntry], path: Path) -> int:
    """Write the entries as JSON lines to `path`, whole or not at all (a temporary file, flushed,
    then renamed over it); how many."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    count = 0
    try:
        with open(temporary, "w", encoding="ascii") as handle:
            for entry in entries:
                handle.write(audit_json_line(entry))
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise StateError(f"cannot write audit export {path}: {exc.strerror or exc}") from None
    return count
