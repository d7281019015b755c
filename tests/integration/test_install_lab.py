"""An admin's install on the real lab (issue 54, item 4): a wheel of this checkout installed into a
prefix of its own by the documented command (scripts/install-prefix, which `make install` runs),
`doctor` and a dry run as the service user, then the unit `render systemd` writes, run as its
service would run it, writing to the lab's jobs.

No systemd runs on the project's test machines (PID 1 is another init), so `systemd-run` has no
manager to ask. The unit is checked with `systemd-analyze verify`, and its ExecStart runs under
tests/integration/unit_sandbox.py: its User, Group, Environment, UMask, no capabilities and no new
privileges, and in a mount namespace of its own ProtectSystem=strict with its ReadWritePaths and
StateDirectory, PrivateTmp and ProtectHome, as the rendered [Service] section says. A unit whose
ExecStart or Python lived under /tmp or /root would fail here as it would under systemd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_engine_live import fill_cluster, site_factors, sprio_lists
from unit_sandbox import last, sandboxed, service_section

pytestmark = pytest.mark.scenario

SlurmLab = Any
REPO = Path(__file__).resolve().parents[2]
SERVICE_USER = "dike-slurm"  # docs/deployment.md, step 1


def run(*argv: str | Path, timeout: float = 600, check: bool = True, **options: Any) -> subprocess.CompletedProcess:
    options.setdefault("cwd", "/")  # never this checkout: `python -c` would import its source folder
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **options)
    assert "Traceback" not in result.stderr, result.stderr
    if check:
        assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def service_user(slurm_lab: SlurmLab):
    """The service account an admin makes (docs/deployment.md, step 1): a system user with
    AdminLevel=Admin in the lab's slurmdbd. What this fixture adds, it removes again."""
    lab = slurm_lab
    made_user = subprocess.run(["id", "-u", SERVICE_USER], capture_output=True).returncode != 0
    if made_user:
        run("useradd", "--system", "--user-group", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
            SERVICE_USER)
    made_slurm_user = not lab.run("sacctmgr", "-nP", "list", "user", SERVICE_USER, "format=user").stdout.strip()
    if made_slurm_user:
        lab.run("sacctmgr", "-i", "add", "user", SERVICE_USER, "account=root")
    lab.run("sacctmgr", "-i", "modify", "user", SERVICE_USER, "set", "adminlevel=Admin")
    lab.wait_for(lambda: "AdminLevel=Administrator" in lab.run(
        "scontrol", "show", "assoc_mgr", f"users={SERVICE_USER}", "flags=users").stdout, 30,
        "slurmctld to know the service user's AdminLevel")
    yield SERVICE_USER
    if made_slurm_user:
        lab.run("sacctmgr", "-i", "delete", "user", SERVICE_USER, check=False)
    if made_user:
        run("userdel", SERVICE_USER, check=False)


@pytest.fixture
def prefix():
    """/opt/dike-slurm-test-XXXX: where an admin would install (never /tmp: the unit hides it)."""
    folder = Path(tempfile.mkdtemp(dir="/opt", prefix="dike-slurm-test-"))
    folder.chmod(0o755)
    name = folder.name
    yield folder
    for path in (folder, Path("/var/lib") / name, Path("/var/lib") / f"{name}-metrics"):
        shutil.rmtree(path, ignore_errors=True)


def admin_config(lab: SlurmLab, prefix: Path) -> Path:
    """The lab's dike.toml with an admin's state layout: the state in the unit's StateDirectory
    (/var/lib/NAME), the metrics in a folder of their own (/var/lib/NAME-metrics)."""
    text = Path(lab.env["DIKE_CONFIG"]).read_text(encoding="utf-8")
    state = Path("/var/lib") / prefix.name / "state.sqlite"
    metrics = Path("/var/lib") / f"{prefix.name}-metrics" / "dike_slurm.prom"
    text = re.sub(r'(?m)^state_db = ".*"$', f'state_db = "{state}"', text)
    text = re.sub(r'(?m)^metrics_file = ".*"$', f'metrics_file = "{metrics}"', text)
    assert f'"{state}"' in text and f'"{metrics}"' in text, text
    config = prefix / "etc" / "dike.toml"
    config.parent.mkdir(mode=0o755)
    config.write_text(text, encoding="utf-8")
    config.chmod(0o644)
    return config


def test_the_wheel_installed_into_its_prefix_runs_the_rendered_unit_and_passes_doctor(slurm_lab, service_user,
                                                                                       prefix, tmp_path):
    lab = slurm_lab
    if lab.in_chroot or lab.engine_backend != "cli":
        pytest.skip("the install runs on the host's lab (command-line backend); the pyslurm extra builds against "
                    "the 25.11 chroot's Slurm for minutes, and the install path is the same")
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (make test installs Debian's systemd as root)")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}  # an admin's root shell
    for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT"):
        if key in os.environ:  # the machine's package index, as the admin's pip would use it
            env[key] = os.environ[key]

    # 1. install: the one documented command (make install runs it), a wheel of this checkout
    installed = run(sys.executable, REPO / "scripts" / "install-prefix", prefix, "--dist", tmp_path / "dist", env=env)
    (wheel,) = (tmp_path / "dist").glob("dike_slurm-*-py3-none-any.whl")
    assert f"installed dike-slurm " in installed.stdout and str(wheel) in installed.stdout
    dike = prefix / "bin" / "dike-slurm"
    python = Path(os.path.realpath(prefix / "bin" / "python"))
    assert not any(python.is_relative_to(p) for p in ("/root", "/home", "/tmp", "/var/tmp")), python
    # a release: dike_slurm and its templates are inside the prefix, not in this checkout
    where = run(prefix / "bin" / "python", "-c", "import dike_slurm.templates as t; print(t.__file__)", env=env)
    assert Path(where.stdout.strip()).is_relative_to(prefix), where.stdout

    # 2. render: the lab's own configuration (metrics beside the state, in a folder the lab makes) is
    # accepted, as doctor and config check accept it
    lab_unit = run(dike, "render", "systemd", "--config", lab.env["DIKE_CONFIG"], env=env)
    assert f"ExecStart={dike} run --apply --config {lab.env['DIKE_CONFIG']}" in lab_unit.stdout
    config = admin_config(lab, prefix)
    unit = tmp_path / "dike-slurm.service"
    rendered = run(dike, "render", "systemd", "--config", config, "--out", unit, env=env)
    assert "warning:" not in rendered.stderr and "WARNING" not in unit.read_text(), rendered.stderr
    service = service_section(unit.read_text())
    assert last(service, "ExecStart") == f"{dike} run --apply --config {config}"
    assert (last(service, "User"), last(service, "StateDirectory")) == (service_user, prefix.name)
    assert last(service, "ReadWritePaths") == f"/var/lib/{prefix.name}-metrics"
    verified = run("systemd-analyze", "verify", unit, check=False, env=env)
    assert verified.returncode == 0, verified.stderr

    # 3. the folders the unit's comment says to make (systemd makes the StateDirectory at start;
    # doctor and the dry run come first, so the admin makes it as docs/deployment.md step 1 says)
    prepare = re.findall(r"install -d -o \S+ -g \S+ -m \d+ [^\s;,)]+", unit.read_text())
    assert prepare == [f"install -d -o {service_user} -g {service_user} -m 0755 /var/lib/{prefix.name}-metrics"]
    for line in prepare + [f"install -d -o {service_user} -g {service_user} -m 0750 /var/lib/{prefix.name}"]:
        run(*line.split(), env=env)

    # 4. doctor and a dry run, as the service user (sudo -u dike-slurm ...)
    as_service = ["runuser", "-u", service_user, "--"]
    doctor = run(*as_service, dike, "doctor", "--json", "--config", config, check=False, env=env)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert doctor.returncode == 0, [c for c in checks.values() if c["verdict"] != "ok"]
    assert checks["install"]["verdict"] == "ok" and checks["install"]["found"].startswith(f"{dike} (a release")
    assert checks["privileges"]["found"] == f"{service_user}: AdminLevel=Administrator"
    assert checks["metrics file placement"]["verdict"] == "ok"
    dry = run(*as_service, dike, "run", "--once", "--config", config, env=env)
    assert "configuration: " in dry.stdout

    # 5. deploy: the unit's ExecStart as its service runs it, until it has written to a waiting job
    fill_cluster(lab, "dikeuser1")
    job = lab.sbatch("--gres=gpu:8", "--job-name=waits", "--wrap", "sleep 5", user="dikeuser2")
    assert sprio_lists(lab, job)[job][0] == 0
    bind_back = tuple(p for p in (lab.lab_dir,) if p.is_relative_to("/tmp") or p.is_relative_to("/var/tmp"))
    log = tmp_path / "service.log"
    with log.open("w") as output:
        process = subprocess.Popen(sandboxed(service, bind_back=bind_back), stdout=output, stderr=subprocess.STDOUT,
                                   env=env, cwd="/")
    try:
        lab.wait_for(lambda: site_factors(lab).get(job, (0, 0))[0] != 0 or process.poll() is not None, 120,
                     "the service to write the waiting job's SiteFactor")
        assert process.poll() is None, log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)  # systemctl stop
        code = process.wait(timeout=120)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and "Read-only file system" not in text and "Permission denied" not in text, text
    state = Path("/var/lib") / prefix.name / "state.sqlite"
    metrics = Path("/var/lib") / f"{prefix.name}-metrics" / "dike_slurm.prom"
    owner = state.stat()
    assert (owner.st_uid, stat.S_IMODE(owner.st_mode)) == (int(run("id", "-u", service_user).stdout), 0o600)
    assert stat.S_IMODE(metrics.stat().st_mode) & stat.S_IROTH  # node-exporter reads it
    assert "dike_slurm_" in metrics.read_text()
    status = run(*as_service, dike, "status", "--json", "--config", config, env=env)
    assert json.loads(status.stdout)["last_cycle"]["applied"] is True
