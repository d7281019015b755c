"""A TOML file read whole, every failure one InputError that names the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError


def read_toml_file(path: Path, error: type[InputError] = InputError, *, missing: str = "no such file",
                   unreadable: str = "cannot read") -> dict[str, Any]:
    """The file's tables; a missing, unreadable, non-TOML or non-UTF-8 file raises `error` with
    `missing` or `unreadable` (and the system's reason), or what is wrong with the text."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise error(missing, source=source) from None
    except OSError as exc:
        raise error(f"{unreadable}: {exc.strerror}", source=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"not valid TOML: {exc}", source=source) from None
    except UnicodeDecodeError as exc:
        raise error(f"not UTF-8 text (byte {exc.start})", source=source) from None
