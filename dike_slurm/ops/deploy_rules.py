"""The rules a deployment follows, one set for `render`, `doctor` and `config check`.

`layout_checks`: the engine's files as the configuration places them (paths a unit file or crontab
reads as they are; the metrics file where node-exporter can read it). `install_checks`: the
`dike-slurm` these commands run from, which is what a rendered unit starts (an installed release,
reachable by the service user, outside what the unit hides). `render` refuses a FAIL and says a
WARN; `doctor` and `config check` list both and exit 1 on a FAIL.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dike_slurm.ops.doctor_checks import FAIL, OK, WARN, Check

if TYPE_CHECKING:
    from dike_slurm.config import Config

# Paths and names go into unit files and crontabs verbatim: no spaces, quotes, `%` or `$`.
PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./+@:-]+$")
STATE_DIRECTORY_ROOT = Path("/var/lib")  # a state folder right under it is the unit's StateDirectory
DEFAULT_PREFIX = "/opt/dike-slurm"
INSTALL_COMMAND = f"make install PREFIX={DEFAULT_PREFIX}"
# What the rendered unit hides from the service (PrivateTmp=yes, ProtectHome=yes)
HIDDEN_FROM_THE_UNIT = {
    Path("/tmp"): "the unit gives the service a /tmp of its own (PrivateTmp=yes)",
    Path("/var/tmp"): "the unit gives the service a /var/tmp of its own (PrivateTmp=yes)",
    Path("/root"): "the unit hides the home folders (ProtectHome=yes)",
    Path("/home"): "the unit hides the home folders (ProtectHome=yes)",
    Path("/run/user"): "the unit hides the home folders (ProtectHome=yes)",
}


def lock_path(config: Config) -> Path:
    return config.engine.lock_file or Path(f"{config.engine.state_db}.lock")


def state_directory(config: Config) -> str:
    """The unit's StateDirectory= (a folder right under /var/lib, which systemd makes and keeps at
    mode 0750), or "" when the state folder is another one, which the admin makes."""
    folder = config.engine.state_db.parent
    return str(folder.relative_to(STATE_DIRECTORY_ROOT)) if folder.parent == STATE_DIRECTORY_ROOT else ""


def layout_checks(config: Config, config_path: Path | None = None) -> list[Check]:
    """The engine's files as placed by the configuration: one row for the paths, one for the metrics file."""
    engine = config.engine
    paths = [("config file", config_path), ("engine.state_db", engine.state_db),
             ("engine.lock_file", lock_path(config)), ("engine.metrics_file", engine.metrics_file)]
    misread = [f"{name} {str(path)!r}" for name, path in paths if path is not None and not PLAIN_PATH.match(str(path))]
    if misread:
        checks = [Check("unit paths", f"{', '.join(misread)} has characters a unit file or crontab would misread",
                        FAIL, "use a plain path (letters, digits and _ . / + @ : -): no spaces, quotes, % or $")]
    else:
        checks = [Check("unit paths", "plain: a unit file and a crontab read them as they are", OK)]
    if engine.metrics_file is not None:
        checks.append(metrics_placement(config))
    return checks


def metrics_placement(config: Config) -> Check:
    """Where the metrics file sits, against the state folder: node-exporter (another user) must
    read it. In the unit's StateDirectory it cannot (systemd keeps that folder 0750); in a state
    folder the admin made, it can while that folder lets others in (the state file is 0600 anyway)."""
    engine = config.engine
    metrics, state_folder = engine.metrics_file, engine.state_db.parent
    assert metrics is not None
    name = "metrics file placement"
    own = f"{state_folder}-metrics/{metrics.name}"
    if metrics in (engine.state_db, lock_path(config), Path(f"{engine.state_db}-wal"), Path(f"{engine.state_db}-shm")):
        return Check(name, f"engine.metrics_file {metrics} is one of the engine's own state files", FAIL,
                     f'give the metrics a file of their own: engine.metrics_file = "{own}"')
    if metrics.parent != state_folder:
        return Check(name, f"{metrics}: a folder of its own, not the state folder", OK)
    if state_directory(config):
        return Check(name, f"engine.metrics_file {metrics} is in the state folder {state_folder}, which the systemd "
                           "unit makes its StateDirectory, private to the service (systemd resets it to mode 0750 "
                           "at every start): node-exporter, another user, cannot read it there", FAIL,
                     f'give the metrics a folder of their own, that node-exporter reads through a link: '
                     f'engine.metrics_file = "{own}"')
    closed = _closed_to_others(metrics, file_bits=stat.S_IROTH)
    if closed is not None:
        return Check(name, f"engine.metrics_file {metrics} is in the state folder, and {closed} is closed to other "
                           "users: node-exporter cannot read it", WARN,
                     f"chmod o+rx {closed} (the state file itself stays mode 0600), or give the metrics a folder of "
                     f'their own: engine.metrics_file = "{own}"')
    return Check(name, f"{metrics}: in the state folder {state_folder}, which the admin makes (not systemd's "
                       "StateDirectory): it stays open to node-exporter, and the state file itself is mode 0600", OK)


def _closed_to_others(path: Path, file_bits: int) -> Path | None:
    """The first folder on the way to `path` that other users cannot enter, or `path` itself when
    it exists without `file_bits` for others; None when every user gets there (or nothing exists yet)."""
    for folder in [*reversed(path.parents), path]:
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            return None  # made later (by the admin's install -d or the engine), with the modes it documents
        except OSError:
            return folder
        wanted = stat.S_IXOTH if folder != path else file_bits
        if mode & wanted != wanted:
            return folder
    return None


def _hidden(path: Path) -> str:
    """Why the rendered unit does not see `path`, or ""."""
    for root, why in HIDDEN_FROM_THE_UNIT.items():
        if path == root or root in path.parents:
            return f"is under {root}: {why}"
    return ""


def source_checkout() -> Path | None:
    """The source tree this environment runs dike_slurm from (an editable install), None for an
    installed release: a unit should run a release, not a working copy someone edits."""
    package = Path(__file__).resolve().parent.parent
    if package.is_relative_to(Path(sys.prefix).resolve()):
        return None
    return package


def install_problems(script: Path, interpreter: Path) -> list[str]:
    """Why a unit running `script` (with its Python, `interpreter`) would not start: paths the unit
    hides, folders the service user cannot enter."""
    problems = []
    for what, path in (("the dike-slurm script", script), ("its Python", interpreter)):
        hidden = _hidden(path)
        if hidden:
            problems.append(f"{what} {path} {hidden}")
            continue
        closed = _closed_to_others(path, file_bits=stat.S_IROTH | stat.S_IXOTH)
        if closed is not None:
            problems.append(f"{what} {path}: {closed} is closed to other users, so the service user cannot run it")
    return problems


def install_checks() -> list[Check]:
    """The dike-slurm this process runs from, as a unit would start it: `sys.prefix`/bin/dike-slurm
    with this environment's Python (followed through its links)."""
    script = Path(sys.prefix) / "bin" / "dike-slurm"
    if not script.is_file():
        return [Check("install", f"no dike-slurm script in {sys.prefix}/bin", FAIL,
                      f"install a release into a prefix of its own ({INSTALL_COMMAND}, docs/deployment.md) and run "
                      f"it from there ({DEFAULT_PREFIX}/bin/dike-slurm)")]
    interpreter = Path(os.path.realpath(sys.executable))
    problems = install_problems(script, interpreter)
    tree = source_checkout()
    if tree is not None:
        checkout = tree.parent if (tree.parent / "setup.cfg").is_file() else tree
        found = f"{script} runs dike_slurm from the source tree {tree} (an editable install)"
        if problems:
            found += "; a unit running it would not start: " + "; ".join(problems)
        return [Check("install", found, WARN,
                      f"install a release into a prefix of its own: {INSTALL_COMMAND} (in {checkout}), then "
                      f"{DEFAULT_PREFIX}/bin/dike-slurm render systemd --config FILE (docs/deployment.md)")]
    if problems:
        return [Check("install", "; ".join(problems), FAIL,
                      f"install into a prefix every user can reach, outside /tmp and the home folders: "
                      f"{INSTALL_COMMAND} (docs/deployment.md)")]
    return [Check("install", f"{script} (a release, Python {interpreter})", OK)]


def deployment_checks(config: Config, config_path: Path | None = None) -> list[Check]:
    """Every rule above: what `render systemd`, `doctor` and `config check` all apply."""
    return layout_checks(config, config_path) + install_checks()


def failures(checks: list[Check]) -> str:
    """The FAIL rows as one message: each with what to change."""
    return "; ".join(f"{c.name}: {c.found} ({c.advice})" for c in checks if c.verdict == FAIL)
