"""Parsers of Slurm's own text formats, fed real-format strings."""

from __future__ import annotations

import pytest

from dike_slurm.errors import InputError
from dike_slurm.parsing.durations import format_duration, parse_duration, parse_timestamp
from dike_slurm.parsing.hostlists import compress_hostlist, expand_hostlist
from dike_slurm.slurm.slurm_conf import parse_slurm_conf, parse_topology_conf
from dike_slurm.parsing.tres import parse_gres_gpu_types, parse_gres_gpus, parse_tres


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[01-03]", ("n01", "n02", "n03")),
        ("n[01-03,10]", ("n01", "n02", "n03", "n10")),
        ("gpu[008-010],login1", ("gpu008", "gpu009", "gpu010", "login1")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("n1", ("n1",)),
        ("None assigned", ()),
        ("", ()),
    ],
)
def test_hostlist_expands_ranges_and_padding(text, hosts):
    assert expand_hostlist(text) == hosts


def test_hostlist_compresses_back():
    assert compress_hostlist(["n01", "n02", "n03", "n10"]) == "n[01-03,10]"


def test_bad_hostlist_is_an_input_error():
    with pytest.raises(InputError, match="bad hostlist"):
        expand_hostlist("n[01-")


def test_tres_with_typed_gpus_counts_once():
    tres = parse_tres("billing=8,cpu=8,gres/gpu=4,gres/gpu:a100=4,mem=32G,node=1")
    assert (tres.cpus, tres.gpus, tres.nodes, tres.mem_mb) == (8, 4, 1, 32768)
    assert tres.gpu_types == (("a100", 4),)


def test_tres_only_typed_gpus_are_summed():
    tres = parse_tres("cpu=16,gres/gpu:a100=4,gres/gpu:v100=2,node=2")
    assert tres.gpus == 6
    assert tres.nodes == 2


def test_tres_keeps_a_gpu_types_case_as_gres_does():
    """OpenB's models (T4, V100M16) as typed GRES: sacct prints the type as the site spells it, and
    a node's Gres=gpu:T4:2 keeps it; lowercasing one side made such jobs fit no node (issue 33)."""
    tres = parse_tres("billing=4,cpu=4,gres/gpu:T4=1,gres/gpu=1,mem=16G,node=1")
    assert (tres.gpus, tres.gpu_types) == (1, (("T4", 1),))
    assert parse_gres_gpu_types("gpu:T4:2") == ("T4",)


def test_tres_without_gpus_is_a_cpu_job():
    assert parse_tres("billing=2,cpu=2,mem=4000M,node=1").gpus == 0
    assert parse_tres("").gpus == 0


@pytest.mark.parametrize("bad", ["cpu", "cpu=x", "gres/gpu=-1", "mem=lots"])
def test_bad_tres_is_an_input_error(bad):
    with pytest.raises(InputError):
        parse_tres(bad)


@pytest.mark.parametrize(
    ("text", "gpus"),
    [("gpu:a100:8", 8), ("gpu:8", 8), ("gres:gpu:4", 4), ("gres/gpu=2", 2), ("gpu:a100:8(S:0-1)", 8), ("gpu", 1), ("mps:100", 0), ("", 0)],
)
def test_gres_gpu_counts(text, gpus):
    assert parse_gres_gpus(text) == gpus


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("03:04:05", 3 * 3600 + 4 * 60 + 5),
        ("04:05", 4 * 60 + 5),
        ("90", 90 * 60),
        ("1-00", 86400),
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),
        ("00:00:01.500", 2),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("INFINITE", None),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_duration_round_trip():
    assert format_duration(parse_duration("12-23:59:58")) == "12-23:59:58"
    assert format_duration(None) == "UNLIMITED"


@pytest.mark.parametrize("bad", ["1:2:3:4", "abc", "-5", "1-"])
def test_bad_duration(bad):
    with pytest.raises(InputError, match="not a Slurm duration"):
        parse_duration(bad)


def test_timestamps():
    assert parse_timestamp("2026-01-05T00:00:10") - parse_timestamp("2026-01-05T00:00:00") == 10
    assert parse_timestamp("Unknown") is None
    assert parse_timestamp("None") is None
    with pytest.raises(InputError):
        parse_timestamp("yesterday")


SLURM_CONF = """\
# comment line
ClusterName=lab
SelectType=select/cons_tres   # trailing comment
GresTypes=gpu
NodeName=DEFAULT CPUs=64 RealMemory=512000 Gres=gpu:a100:8 State=UNKNOWN
NodeName=n[01-04] Feature=leaf_s1
NodeName=n[05-06] Gres=gpu:4 Feature=leaf_s2,fast \\
   CPUs=32
NodeName=cpu01 CPUs=8 Gres=
PartitionName=gpu Nodes=n[01-06] Default=YES MaxTime=7-00:00:00 State=UP
PartitionName=all Nodes=ALL MaxTime=INFINITE
"""


def test_slurm_conf_nodes_and_partitions():
    conf = parse_slurm_conf(SLURM_CONF)
    by_name = {n.name: n for n in conf.nodes}
    assert len(by_name) == 7
    assert by_name["n01"].gpus == 8 and by_name["n01"].cpus == 64
    assert by_name["n05"].gpus == 4 and by_name["n05"].cpus == 32
    assert by_name["n05"].features == ("leaf_s2", "fast")
    assert by_name["cpu01"].gpus == 0
    assert by_name["n01"].partitions == ("gpu", "all")
    gpu = conf.partition("gpu")
    assert gpu.default and gpu.max_time_s == 7 * 86400 and len(gpu.nodes) == 6
    assert conf.partition("all").max_time_s is None
    assert conf.options["selecttype"] == "select/cons_tres"


def test_slurm_conf_errors_name_the_line():
    with pytest.raises(InputError, match=r"slurm.conf:2: .*CPUs='many'"):
        parse_slurm_conf("ClusterName=x\nNodeName=n1 CPUs=many\n")
    with pytest.raises(InputError, match=r"slurm.conf:2: partition 'p' names undefined nodes"):
        parse_slurm_conf("NodeName=n1\nPartitionName=p Nodes=n9\n")


TOPOLOGY = """\
SwitchName=s1 Nodes=n[01-02]
SwitchName=s2 Nodes=n[03-04]
SwitchName=s3 Nodes=n[05-06]
SwitchName=spine1 Switches=s[1-2]
SwitchName=top Switches=spine1,s3
"""


def test_topology_tree_paths_and_common_switch():
    topology = parse_topology_conf(TOPOLOGY)
    assert topology.leaf_of("n03") == "s2"
    assert topology.node_path("n01") == ("s1", "spine1", "top")
    assert topology.lowest_common_switch(["n01", "n02"]) == "s1"
    assert topology.lowest_common_switch(["n01", "n04"]) == "spine1"
    assert topology.lowest_common_switch(["n01", "n06"]) == "top"
    assert topology.leaves_spanned(["n01", "n02", "n03"]) == 2
    assert set(topology.leaves) == {"s1", "s2", "s3"}


def test_topology_errors():
    with pytest.raises(InputError, match="topology.conf:2: .*n1"):
        parse_topology_conf("SwitchName=a Nodes=n1\nSwitchName=b Nodes=n[1-2]\n")
    with pytest.raises(InputError, match="unknown switch 'zz'"):
        parse_topology_conf("SwitchName=a Switches=zz\n")
    with pytest.raises(InputError, match="switch loop"):
        parse_topology_conf("SwitchName=a Nodes=n1\nSwitchName=b Switches=c\nSwitchName=c Switches=b\n")


def test_scontrol_show_topology_output():
    text = (
        "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
        "SwitchName=s2 Level=0 LinkSpeed=1 Nodes=n[3-4]\n"
        "SwitchName=top Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=s[1-2]\n"
    )
    topology = parse_topology_conf(text, source="scontrol show topology")
    assert topology.leaf_of("n4") == "s2"
    assert topology.lowest_common_switch(["n1", "n3"]) == "top"
