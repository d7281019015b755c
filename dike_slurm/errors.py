"""The project's own exceptions: every known failure becomes one of these, with a clear message."""

from __future__ import annotations


class DikeError(Exception):
    """Base of every error the CLI turns into a one-line message (exit code 1)."""

    exit_code = 1


class InputError(DikeError):
    """Malformed input: names the source (file, line, job) and what is wrong."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        where = source or ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)


class ConfigError(InputError):
    """Invalid configuration: names the key. `problems`: each problem found (`key: message`), when
    the configuration was checked whole; `source_name`: the file (or "configuration")."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 problems: list[str] | tuple[str, ...] = (), source_name: str = ""):
        super().__init__(message, source=source, line=line)
        self.problems = tuple(problems)
        self.source_name = source_name


class PolicyError(DikeError):
    """A policy cannot decide on this snapshot (e.g. the oracle asked to run live)."""


class RegistryError(DikeError):
    """Policy registry problems: unknown or duplicate policy names."""


class SlurmError(DikeError):
    """A Slurm command failed, timed out or printed something we cannot read."""


class StateError(DikeError):
    """The state file cannot be opened, is from a newer version, or is locked."""
