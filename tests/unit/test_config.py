"""Configuration: validation with named keys and the file < environment < CLI precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from dike_slurm.config import environment_overrides, load_config
from dike_slurm.errors import ConfigError
from dike_slurm.policies.dike import DikeParams

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dike.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dike.toml"
    path.write_text(text)
    return path


def test_documented_example_is_valid_and_matches_defaults():
    config = load_config(EXAMPLE, environ={})
    params = config.policy_params("dike")
    assert isinstance(params, DikeParams)
    assert params.model_dump(exclude={"comm_rules"}) == DikeParams().model_dump(exclude={"comm_rules"})
    assert params.comm_rules[0].name_pattern == "*-pretrain-*"
    assert config.engine.interval_s == 60 and config.engine.priority_strategy == "site_factor"


def test_every_dike_knob_is_documented_in_the_example():
    text = EXAMPLE.read_text()
    for key in DikeParams.model_fields:
        assert f"{key} =" in text or f"# {key} =" in text or f"policies.dike.{key}" in text, key


def test_precedence_file_then_environment_then_cli(tmp_path):
    path = write(tmp_path, "[engine]\ninterval_s = 10\npolicy = 'fifo'\n")
    assert load_config(path, environ={}).engine.interval_s == 10
    env = {"DIKE_ENGINE__INTERVAL_S": "20", "DIKE_SCOPE__PARTITIONS": '["gpu", "a100"]'}
    config = load_config(path, environ=env)
    assert config.engine.interval_s == 20 and config.scope.partitions == ["gpu", "a100"]
    config = load_config(path, environ=env, overrides={"engine": {"interval_s": 30}})
    assert config.engine.interval_s == 30 and config.engine.policy == "fifo"


def test_dike_config_variable_names_the_file(tmp_path):
    path = write(tmp_path, "[engine]\npolicy = 'tiresias'\n")
    assert load_config(environ={"DIKE_CONFIG": str(path)}).engine.policy == "tiresias"


def test_environment_overrides_parse_toml_literals():
    env = {"DIKE_ENGINE__ADMIN_COMMENT": "false", "DIKE_POLICIES__DIKE__LEVELS": "4", "DIKE_CONFIG": "x", "OTHER": "1"}
    assert environment_overrides(env) == {"engine": {"admin_comment": False}, "policies": {"dike": {"levels": 4}}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engine]\nintervl_s = 5\n", r"engine\.intervl_s: unknown key"),
        ("[engine]\ninterval_s = 'soon'\n", r"engine\.interval_s: Input should be a valid number"),
        ("[engine]\ninterval_s = -1\n", r"engine\.interval_s: Input should be greater than 0"),
        ("[engine]\npolicy = 'lottery'\n", r"engine\.policy: unknown policy 'lottery'"),
        ("[policies.dike]\nthresholds_gpuh = [8.0, 1.0]\n", r"policies\.dike: Value error, thresholds_gpuh must be strictly ascending"),
        ("[policies.dike]\nlevls = 3\n", r"policies\.dike\.levls: unknown key"),
        ("[policies.nosuch]\nx = 1\n", r"policies\.nosuch: unknown policy 'nosuch'"),
        ("[engine\n", r"not valid TOML"),
    ],
)
def test_bad_config_names_the_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(path, environ={})
    assert str(path) in str(raised.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.toml", environ={})


def test_every_setting_is_documented_in_the_example():
    import re

    from dike_slurm.config import Config

    text = EXAMPLE.read_text()
    for section in ("engine", "scope", "slurm", "accounting", "replay"):
        model = Config.model_fields[section].annotation
        for key in model.model_fields:
            documented = re.search(rf"^#? ?{key} =", text, re.M) or f"[{section}.{key}]" in text
            assert documented, f"{section}.{key} missing from examples/dike.toml"


def test_an_environment_variable_error_names_the_variable_not_the_file(tmp_path):
    path = write(tmp_path, "[engine]\ninterval_s = 30\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={"DIKE_ENGINE__INTERVAL_S": "abc"})
    assert str(error.value).startswith("environment variable DIKE_ENGINE__INTERVAL_S: engine.interval_s:")
    assert str(path) not in str(error.value)
    with pytest.raises(ConfigError, match=r"^environment variable DIKE_POLICIES__DIKE__LEVELS: policies\.dike\.levels"):
        load_config(path, environ={"DIKE_POLICIES__DIKE__LEVELS": "many"})
    with pytest.raises(ConfigError, match=r"^environment variable DIKE_ENGINE__POLICY: engine\.policy: unknown policy"):
        load_config(path, environ={"DIKE_ENGINE__POLICY": "nope"})
    bad_file = write(tmp_path, "[engine]\ninterval_s = 0\n")
    with pytest.raises(ConfigError, match=rf"^{bad_file}: engine\.interval_s"):
        load_config(bad_file, environ={})


def test_the_source_says_file_env_or_defaults_and_offline_ignores_dike_config(tmp_path):
    from dike_slurm.config import load_with_source

    path = write(tmp_path, "[engine]\npolicy = 'fifo'\n")
    env = {"DIKE_CONFIG": str(path), "DIKE_ENGINE__SEED": "3"}
    assert load_with_source(path, environ={})[1].describe() == f"configuration: {path} (--config)"
    config, source = load_with_source(None, environ=env)
    assert config.engine.policy == "fifo"
    assert source.describe() == f"configuration: {path} ($DIKE_CONFIG) + DIKE_ENGINE__SEED"
    config, source = load_with_source(None, environ=env, offline=True)
    assert config.engine.policy == "dike" and config.engine.seed == 3
    assert source.as_dict() == {"kind": "defaults", "path": None, "variables": ["DIKE_ENGINE__SEED"]}


def test_accounting_since_bounds_the_window_from_a_toml_date_or_unix_seconds(tmp_path):
    """The window is the later of `lookback_days` before now and `since`; a date-time without a zone is UTC."""
    path = write(tmp_path, "[accounting]\nlookback_days = 1\nsince = 2026-01-01T00:00:00\n")
    accounting = load_config(path, environ={}).accounting
    new_year = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    assert accounting.window_start(new_year + 3600) == new_year
    assert accounting.window_start(new_year + 2 * 86400) == new_year + 86400
    from_env = load_config(path, environ={"DIKE_ACCOUNTING__SINCE": str(int(new_year) + 60)}).accounting
    assert from_env.window_start(new_year + 3600) == new_year + 60
    assert load_config(None, environ={}).accounting.window_start(new_year) == new_year - 30 * 86400
