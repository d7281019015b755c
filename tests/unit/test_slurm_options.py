"""The one reader of `scontrol show config` and of its SchedulerParameters, on recorded output."""

from __future__ import annotations

from pathlib import Path

import pytest

from dike_slurm.errors import InputError
from dike_slurm.parsing.slurm_options import parse_show_config, scheduler_depth, scheduler_parameters

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_show_config_reads_each_recorded_version(version):
    options = parse_show_config((FIXTURES / f"slurm-{version}" / "scontrol-show-config.txt").read_text())
    assert options["prioritytype"] == "priority/multifactor"
    assert options["topologyplugin"] == "topology/tree"
    assert options["schedulerparameters"] == "bf_interval=5,sched_interval=5,bf_continue"
    assert options["authalttypes"] == ""  # Slurm prints (null) for an unset value
    assert all(key == key.lower() for key in options)


def test_show_config_keeps_slurm_conf_value_over_a_later_plugin_section():
    text = (FIXTURES / "slurm-24.11" / "scontrol-show-config.txt").read_text()
    assert parse_show_config(text)["pmixdebug"] == "0"  # a plugin section's option is read too
    repeated = text + "\nSome Plugin Configuration:\nPriorityType = priority/basic\n"
    assert parse_show_config(repeated)["prioritytype"] == "priority/multifactor"


def test_scheduler_parameters_are_looked_up_case_insensitively():
    parameters = scheduler_parameters(" bf_continue, MAX_SWITCH_WAIT=600 ,bf_max_job_test=1000")
    assert parameters == {"bf_continue": "", "max_switch_wait": "600", "bf_max_job_test": "1000"}
    assert scheduler_parameters("") == {}
    # given twice: the first value, as Slurm's search from the start of the string finds it
    assert scheduler_parameters("bf_max_job_test=100,bf_continue,BF_MAX_JOB_TEST=900")["bf_max_job_test"] == "100"
    assert scheduler_depth(parameters) == 1000
    with pytest.raises(InputError, match="bf_max_job_part"):
        scheduler_depth(scheduler_parameters("bf_max_job_part=-3"))
