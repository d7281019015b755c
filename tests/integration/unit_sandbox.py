"""Run a systemd service unit's ExecStart as systemd would set it up, on a host without systemd.

The project's test machines boot no systemd (PID 1 is another init), so `systemd-run` and
`systemctl start` have no manager to talk to. This stands in for the parts of the unit that decide
whether the engine can start and write, read from the rendered [Service] section:
- `User=`, `Group=` (with the user's groups), `Environment=`, `UMask=`, WorkingDirectory `/`, and
  the environment systemd gives a system service (PATH, HOME, USER, LOGNAME, SHELL);
- `NoNewPrivileges=yes` and `CapabilityBoundingSet=` (empty: no capability), through setpriv;
- in a mount namespace of its own (unshare): `ProtectSystem=strict` (every mount read-only but
  /proc, /sys and /dev), `ReadWritePaths=` and `StateDirectory=` (made as systemd makes it: owned
  by User and Group, `StateDirectoryMode=`) writable, `PrivateTmp=yes` (an empty /tmp and /var/tmp)
  and `ProtectHome=yes` (/root, /home and /run/user inaccessible).
Not reproduced: the system call filter, address families, PrivateDevices and the kernel
protections (seccomp and device cgroups need systemd itself); `systemd-analyze verify` checks
their syntax.

`sandboxed(service, argv)` gives the command line; it runs this file as a program, as root.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import subprocess
import sys
from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's, for a merged /usr
API_MOUNTS = (Path("/proc"), Path("/sys"), Path("/dev"))
HOMES = (Path("/root"), Path("/home"), Path("/run/user"))


def service_section(unit_text: str) -> dict[str, list[str]]:
    """The [Service] section: each key with its values in order (systemd lets keys repeat)."""
    section, values = "", {}
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section == "Service" and "=" in line:
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def last(service: dict[str, list[str]], key: str, default: str = "") -> str:
    return service.get(key, [default])[-1]


def sandboxed(service: dict[str, list[str]], argv: list[str] | None = None,
              bind_back: tuple[Path, ...] = ()) -> list[str]:
    """The command that runs `argv` (default: the unit's ExecStart) as the unit's service would run.
    `bind_back`: folders under /tmp or /var/tmp the service must still see (a unit would say
    BindReadOnlyPaths=), such as a lab that lives in /var/tmp."""
    user = last(service, "User")
    environment = {}
    for assignments in service.get("Environment", []):
        for word in shlex.split(assignments):
            key, _, value = word.partition("=")
            environment[key] = value
    state = last(service, "StateDirectory")
    spec = {
        "user": user,
        "group": last(service, "Group", user),
        "environment": environment,
        "umask": last(service, "UMask", "0022"),
        "read_write": [p for paths in service.get("ReadWritePaths", []) for p in paths.split()],
        "state_directory": f"/var/lib/{state}" if state else "",
        "state_directory_mode": last(service, "StateDirectoryMode", "0755"),
        "private_tmp": last(service, "PrivateTmp") == "yes",
        "protect_home": last(service, "ProtectHome") == "yes",
        "protect_system_strict": last(service, "ProtectSystem") == "strict",
        "no_new_privileges": last(service, "NoNewPrivileges") == "yes",
        "bind_back": [str(p) for p in bind_back],
        "argv": argv if argv is not None else shlex.split(last(service, "ExecStart")),
    }
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, __file__, json.dumps(spec)]


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"unit_sandbox: mount {' '.join(args)}: {result.stderr.strip()}")


def _mount_points() -> list[Path]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if not any(point == api or api in point.parents for api in API_MOUNTS):
            points.append(point)
    return points


def _bind_descriptor(descriptor: int, target: str) -> None:
    """Bind the folder open as `descriptor` (taken before a mount covered it) onto `target`. mount(2)
    itself: mount(8) would resolve /proc/self/fd/N to a path name, which now names the covering mount."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind = 4096
    if libc.mount(f"/proc/self/fd/{descriptor}".encode(), target.encode(), None, ms_bind, None) != 0:
        raise SystemExit(f"unit_sandbox: bind {target}: {os.strerror(ctypes.get_errno())}")


def _writable(path: Path) -> None:
    _mount("--bind", str(path), str(path))
    _mount("-o", "remount,bind,rw", str(path))


def main(spec: dict) -> None:
    entry = pwd.getpwnam(spec["user"])
    gid = grp.getgrnam(spec["group"]).gr_gid
    if spec["state_directory"]:  # systemd makes it, owned by the service, before it starts the process
        state = Path(spec["state_directory"])
        state.mkdir(exist_ok=True)
        os.chown(state, entry.pw_uid, gid)
        state.chmod(int(spec["state_directory_mode"], 8))
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in spec["bind_back"]}  # before PrivateTmp
    if spec["protect_system_strict"]:
        for point in _mount_points():
            subprocess.run(["mount", "-o", "remount,bind,ro", str(point)], capture_output=True)  # some are ro already
    for path in spec["read_write"] + ([spec["state_directory"]] if spec["state_directory"] else []):
        if not Path(path).is_dir():
            raise SystemExit(f"unit_sandbox: ReadWritePaths={path} does not exist (systemd would not start the unit)")
        _writable(Path(path))
    if spec["private_tmp"]:
        for tmp in ("/tmp", "/var/tmp"):
            _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", tmp)
        for path, descriptor in kept.items():
            Path(path).mkdir(parents=True, exist_ok=True)
            _bind_descriptor(descriptor, path)
            _mount("-o", "remount,bind,ro", path)
    if spec["protect_home"]:
        for home in HOMES:
            if home.is_dir():
                _mount("-t", "tmpfs", "-o", "mode=000", "tmpfs", str(home))
    environment = {"PATH": SYSTEM_PATH, "HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name,
                   "SHELL": entry.pw_shell, **spec["environment"]}
    os.chdir("/")
    os.umask(int(spec["umask"], 8))
    privileges = ["--no-new-privs"] if spec["no_new_privileges"] else []
    os.execve("/usr/bin/setpriv", ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={gid}", "--init-groups",
                                   *privileges, "--bounding-set=-all", "--", *spec["argv"]], environment)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
