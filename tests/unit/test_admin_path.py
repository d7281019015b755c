"""An admin's path (issue 54, item 4): `render`, `doctor` and `config check` apply one set of
deployment rules (dike_slurm.ops.deploy_rules), and the messages an admin meets name the fix:
`config check` reads $DIKE_CONFIG and lists every problem, `render` says what to do from a source
checkout, `revert --apply` says to stop the service that holds the lock, and `pause` names who may."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from in_process import dike_slurm
from test_doctor import answers
from unprivileged import as_user

from dike_slurm.config import load_config
from dike_slurm.ops import deploy_rules
from dike_slurm.ops.doctor import gather
from dike_slurm.ops.doctor_checks import FAIL, OK, WARN

REPO = Path(__file__).resolve().parents[2]


def dike(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    if config is not None:
        env["DIKE_CONFIG"] = str(config)
    return dike_slurm(*args, env=env, cwd=REPO)


def write_config(path: Path, engine: str) -> Path:
    path.write_text(f"[engine]\n{engine}")
    return path


def test_config_check_reads_dike_config_and_lists_every_problem(tmp_path):
    bad = write_config(tmp_path / "bad.toml", "interval_s = 0\nbogus = 1\n[policies.dike]\nlevels = 1\n"
                                              "[policies.tiresias]\nfoo = 2\n")
    result = dike("config", "check", config=bad)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: {bad}: 4 problems:",
        "  engine.interval_s: Input should be greater than 0",
        "  engine.bogus: unknown key",
        "  policies.dike.levels: Input should be greater than or equal to 2",
        "  policies.tiresias.foo: unknown key",
    ]
    good = write_config(tmp_path / "good.toml", f'state_db = "{tmp_path}/state/state.sqlite"\n')
    checked = dike("config", "check", config=good)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[0] == f"configuration: {good} ($DIKE_CONFIG)"
    assert f"ok: {good} (policy 'dike')" in checked.stdout
    none = dike("config", "check")
    assert none.returncode == 2
    assert none.stderr.strip() == "error: config check needs a file: FILE, --config FILE or $DIKE_CONFIG"


# (engine keys, the verdict of the metrics file's placement): the three commands must agree on each
LAYOUTS = {
    # the lab's own layout: the metrics file in a state folder the admin makes (not systemd's)...
    "state folder of the admin's": ('state_db = "/srv/dike-lab/dike/state.sqlite"\n'
                                    'metrics_file = "/srv/dike-lab/dike/metrics.prom"\n', OK),
    # ... where node-exporter cannot get in (pytest's folders are root's alone, mode 0700)
    "a state folder closed to others": ('state_db = "{t}/dike/state.sqlite"\nmetrics_file = "{t}/dike/m.prom"\n', WARN),
    "a folder of its own": ('state_db = "/var/lib/dike-slurm/state.sqlite"\n'
                            'metrics_file = "/var/lib/dike-slurm-metrics/dike_slurm.prom"\n', OK),
    # systemd keeps a StateDirectory 0750: node-exporter could not read the metrics there
    "the unit's StateDirectory": ('state_db = "/var/lib/dike-slurm/state.sqlite"\n'
                                  'metrics_file = "/var/lib/dike-slurm/dike_slurm.prom"\n', FAIL),
    "the state file itself": ('state_db = "{t}/dike/state.sqlite"\nmetrics_file = "{t}/dike/state.sqlite"\n', FAIL),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_render_doctor_and_config_check_apply_the_same_rules(tmp_path, layout):
    engine, verdict = LAYOUTS[layout]
    config = write_config(tmp_path / "dike.toml", engine.format(t=tmp_path))
    runner, _ = answers("22.05")
    doctor = {c.name: c for c in gather(load_config(config, environ={}), "root", runner, config_path=config)}
    assert doctor["metrics file placement"].verdict == verdict, doctor["metrics file placement"]
    checked = dike("config", "check", str(config))
    rendered = dike("render", "systemd", "--config", str(config))
    assert "Traceback" not in checked.stderr + rendered.stderr
    line = next(row for row in checked.stdout.splitlines() if "metrics file placement: " in row)
    found = doctor["metrics file placement"].found
    if verdict == OK:
        assert line == f"metrics file placement: {found}"
        assert rendered.returncode == 0 and "ExecStart=" in rendered.stdout, rendered.stderr
    elif verdict == WARN:
        assert line.startswith(f"warn: metrics file placement: {found} (chmod o+rx ")
        assert checked.returncode == 0 and rendered.returncode == 0 and "ExecStart=" in rendered.stdout
        assert f"warning: metrics file placement: {found}. What to do: chmod o+rx " in rendered.stderr
        assert f"# WARNING: metrics file placement: {found}." in rendered.stdout
    else:
        assert line.startswith(f"FAIL: metrics file placement: {found} (")
        assert checked.returncode == 1 and "the deployment rules fail (metrics file placement" in checked.stderr
        assert rendered.returncode == 2 and rendered.stdout == ""
        assert f"error: render systemd: metrics file placement: {found}" in rendered.stderr
    assert doctor["unit paths"].verdict == OK


def test_every_rule_that_fails_is_named_in_one_refusal(tmp_path):
    config = write_config(tmp_path / "dike.toml", 'state_db = "/var/lib/dike slurm/state.sqlite"\n'
                                                  'metrics_file = "/var/lib/dike slurm/m.prom"\n')
    rendered = dike("render", "systemd", "--config", str(config))
    assert rendered.returncode == 2 and len(rendered.stderr.strip().splitlines()) == 2  # the source line, the error
    error = rendered.stderr.strip().splitlines()[-1]
    assert "unit paths: engine.state_db '/var/lib/dike slurm/state.sqlite', engine.lock_file" in error
    assert "metrics file placement: engine.metrics_file /var/lib/dike slurm/m.prom is in the state folder" in error


def test_where_a_unit_could_not_start_its_install():
    problems = deploy_rules.install_problems(Path("/tmp/c/.venv/bin/dike-slurm"),
                                             Path("/root/.pyenv/versions/3.11.7/bin/python3.11"))
    assert problems == [
        "the dike-slurm script /tmp/c/.venv/bin/dike-slurm is under /tmp: the unit gives the service a /tmp of its "
        "own (PrivateTmp=yes)",
        "its Python /root/.pyenv/versions/3.11.7/bin/python3.11 is under /root: the unit hides the home folders "
        "(ProtectHome=yes)",
    ]
    assert deploy_rules.install_problems(Path("/opt/dike-slurm/bin/dike-slurm"), Path("/usr/bin/python3.11")) == []


def test_render_from_a_source_checkout_says_what_to_do_instead(tmp_path):
    config = write_config(tmp_path / "dike.toml", f'state_db = "{tmp_path}/state/state.sqlite"\n')
    rendered = dike("render", "systemd", "--config", str(config))
    assert rendered.returncode == 0, rendered.stderr  # this test runs from the project's editable install
    warning = next(line for line in rendered.stderr.splitlines() if line.startswith("warning: install: "))
    assert "(an editable install)" in warning
    assert f"What to do: install a release into a prefix of its own: make install PREFIX=/opt/dike-slurm (in {REPO})" \
        in warning and "then /opt/dike-slurm/bin/dike-slurm render systemd --config FILE" in warning
    assert "# WARNING: install: " in rendered.stdout


def test_render_refuses_a_release_the_service_user_cannot_run(tmp_path, monkeypatch):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    script = prefix / "bin" / "dike-slurm"
    script.write_text("#!/bin/sh\n")
    prefix.chmod(0o700)  # as a venv made under umask 077: no other user enters it
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(deploy_rules, "source_checkout", lambda: None)  # a release installed there
    config = write_config(tmp_path / "dike.toml", f'state_db = "{tmp_path}/state/state.sqlite"\n')
    rendered = dike("render", "systemd", "--config", str(config))
    assert rendered.returncode == 2 and rendered.stdout == ""
    error = rendered.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: render systemd: install: the dike-slurm script {script}"), error
    assert "(install into a prefix every user can reach, outside /tmp and the home folders: make install " \
           "PREFIX=/opt/dike-slurm" in error


def test_revert_apply_while_the_service_holds_the_lock_says_to_stop_it(tmp_path):
    from dike_slurm.store.lock import exclusive_lock

    config = write_config(tmp_path / "dike.toml", f'state_db = "{tmp_path}/state.sqlite"\n')
    with exclusive_lock(tmp_path / "state.sqlite.lock"):  # what a running service holds
        result = dike("revert", "--apply", config=config)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: another dike-slurm engine holds {tmp_path}/state.sqlite.lock (pid {os.getpid()}): "
                            "revert --apply changes the jobs that engine manages: stop the service first (systemctl "
                            "stop dike-slurm.service; a timer: systemctl stop dike-slurm.timer; cron: remove "
                            "/etc/cron.d/dike-slurm), then revert --apply."), error
    assert "To keep its changes and only stop its writes: dike-slurm pause" in error


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run pause as another user (nobody)")
def test_pause_as_a_user_who_may_not_write_the_state_names_who_may():
    base = Path(tempfile.mkdtemp(prefix="dike-pause-"))
    try:
        base.chmod(0o755)
        config = write_config(base / "dike.toml", f'state_db = "{base}/state/state.sqlite"\n')
        assert dike("pause", "--config", str(config)).returncode == 0  # the state file, made 0600
        state = base / "state" / "state.sqlite"
        (base / "state").chmod(0o755)
        shutil.chown(state, "daemon", "daemon")  # the service user's, as the unit's StateDirectory makes it
        argv = as_user("nobody", [sys.executable, "-m", "dike_slurm", "resume", "--config", str(config)],
                       read_anything=True)
        result = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=120,
                                env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"})
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "unable to open database file" not in result.stderr
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: resume writes the state file {state}, which this user (nobody) may not write ({state} is not "
            f"writable): run it as root or as the service user that owns it: sudo -u daemon dike-slurm resume "
            f"--config {config}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
