"""What the commands share: the configuration and where it came from, tables, JSON, the engine."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from dike_slurm.cli.group import console

if TYPE_CHECKING:  # loaded by the commands that need them: `--help` needs none
    from dike_slurm.config import Config, ConfigSource
    from dike_slurm.cycle.engine import Engine
    from dike_slurm.store.state import StateStore

CONFIG_OPTION = typer.Option(None, "--config", "-c", help="TOML configuration (default: $DIKE_CONFIG)")
JSON_OPTION = typer.Option(False, "--json", help="print one JSON document (schema: docs/engine.md)")
_CONTROL = {c: " " for c in range(32)} | {127: " "}


def safe(value: object) -> Text:
    """Untrusted text (job names, comments) as plain text: no markup, no control characters."""
    return Text(str(value).translate(_CONTROL))


def table(title: str, columns: list[str], *, no_wrap: tuple[str, ...] = ()) -> Table:
    """A table whose cells fold instead of being cut with an ellipsis; piped, the console is wide
    enough that nothing folds either (dike_slurm.cli sets its width)."""
    result = Table(title=title)
    for column in columns:
        result.add_column(column, overflow="fold", no_wrap=column in no_wrap)
    return result


def load(path: Optional[Path], *, offline: bool = False, overrides: dict | None = None) -> tuple[Config, ConfigSource]:
    """The configuration and where it came from; `offline` commands never read $DIKE_CONFIG."""
    from dike_slurm.config import load_with_source

    return load_with_source(path, overrides=overrides, offline=offline)


def say_source(source: ConfigSource, as_json: bool = False) -> None:
    """The one line that says where the configuration came from (JSON output carries it instead)."""
    if not as_json:
        console.print(safe(source.describe()), highlight=False)


def emit_json(command: str, source: ConfigSource | None, document: dict[str, Any]) -> None:
    """One JSON document on stdout: {"command", "config" (where it came from), ...the command's keys}."""
    head: dict[str, Any] = {"command": command}
    if source is not None:
        head["config"] = source.as_dict()
    sys.stdout.write(json.dumps(head | document, indent=2, default=str) + "\n")


def store(config: Config, *, writing: bool) -> StateStore:
    from dike_slurm.store.state import StateStore

    return StateStore(config.engine.state_db, read_only=not writing, group=config.engine.state_group)


def open_engine(config: Config, *, writing: bool) -> Engine:
    from dike_slurm.ops.service import open_engine as open_on_backend

    return open_on_backend(config, store(config, writing=writing))


# What to do when a running engine holds the lock and a command needs it (`lock(..., fix=...)`)
STOP_THE_SERVICE = ("stop the service first (systemctl stop dike-slurm.service; a timer: systemctl stop "
                    "dike-slurm.timer; cron: remove /etc/cron.d/dike-slurm)")


@contextmanager
def lock(config: Config, *, fix: str = "") -> Iterator[None]:
    """The engine's lock; held by another engine, the error says `fix`: what to do about it."""
    from dike_slurm.errors import StateError
    from dike_slurm.store.lock import LockHeld, exclusive_lock

    held = ExitStack()
    try:
        held.enter_context(exclusive_lock(config.engine.lock_file or Path(f"{config.engine.state_db}.lock")))
    except LockHeld as exc:
        if not fix:
            raise
        raise StateError(f"{exc}: {fix}") from None
    with held:
        yield


def require_writable_state(config: Config, source: ConfigSource, command: str) -> None:
    """A command that writes the state file, run by a user who may not write it: one line that
    names who may (root, or the file's owner: the service user), with the command to run as them."""
    import getpass
    import pwd

    from dike_slurm.errors import StateError
    from dike_slurm.ops.doctor import writable

    path = config.engine.state_db
    ok, why = writable(path)
    if ok:
        return
    owner = ""
    for candidate in (path, *path.parents):
        try:
            owner = pwd.getpwuid(candidate.stat().st_uid).pw_name
            break
        except KeyError:  # a uid without a name
            break
        except OSError:  # not there, or not reachable: its folder's owner
            continue
    again = f"dike-slurm {command}" + (f" --config {source.path}" if source.path is not None else "")
    who = (f"run it as root or as the service user that owns it: sudo -u {owner} {again}" if owner and owner != "root"
           else f"run it as root: sudo {again}")
    raise StateError(f"{command} writes the state file {path}, which this user ({getpass.getuser()}) may not write "
                     f"({why}): {who}")


def state_file_text(config: Config) -> str:
    """The state file a command read, as it says so: the path, or that there is none yet."""
    path = config.engine.state_db
    try:
        exists = path.exists()
    except PermissionError:  # a private state folder (the unit's StateDirectoryMode=0750) seen by a user
        return f"state file: {path} (not readable by this user)"
    return f"state file: {path}" + ("" if exists else " (not created yet: no cycle has been applied)")
