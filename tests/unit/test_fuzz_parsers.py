"""Property-based fuzzing of the text parsers: any input gives a value or our own InputError.

The example budget is fixed (FUZZ_EXAMPLES per parser) so that CI time is predictable.
"""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dike_slurm.config import load_config
from dike_slurm.errors import InputError
from dike_slurm.parsing.durations import parse_duration, parse_timestamp
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.tres import parse_gres_gpus, parse_tres
from dike_slurm.slurm.slurm_conf import parse_slurm_conf, parse_topology_conf

FUZZ_EXAMPLES = 300
fuzz = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SLURMISH = st.text(alphabet=string.ascii_letters + string.digits + "[]-,=:/._ \t\n#\\|$;'\"()", max_size=200)
ANY_TEXT = st.one_of(SLURMISH, st.text(max_size=200))


def value_or_input_error(parse, text):
    try:
        return parse(text)
    except InputError:
        return None


@fuzz
@given(ANY_TEXT)
def test_hostlist_never_crashes(text):
    result = value_or_input_error(expand_hostlist, text)
    assert result is None or all(isinstance(h, str) and h for h in result)


@fuzz
@given(ANY_TEXT)
def test_tres_never_crashes(text):
    result = value_or_input_error(parse_tres, text)
    assert result is None or result.gpus >= 0


@fuzz
@given(ANY_TEXT)
def test_gres_never_crashes(text):
    assert parse_gres_gpus(text) >= 0


@fuzz
@given(ANY_TEXT)
def test_duration_never_crashes(text):
    result = value_or_input_error(parse_duration, text)
    assert result is None or result >= 0


@fuzz
@given(st.integers(0, 10_000), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_duration_round_trips(days, hours, minutes, seconds):
    text = f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"
    assert parse_duration(text) == ((days * 24 + hours) * 60 + minutes) * 60 + seconds


@fuzz
@given(ANY_TEXT)
def test_timestamp_never_crashes(text):
    value_or_input_error(parse_timestamp, text)


LINE = st.one_of(
    st.builds(lambda n, g: f"NodeName={n} Gres={g} CPUs=8", SLURMISH, SLURMISH),
    st.builds(lambda p, n: f"PartitionName={p} Nodes={n}", SLURMISH, SLURMISH),
    SLURMISH,
)


@fuzz
@given(st.lists(LINE, max_size=8))
def test_slurm_conf_never_crashes(lines):
    value_or_input_error(parse_slurm_conf, "\n".join(lines))


@fuzz
@given(st.lists(st.one_of(st.builds(lambda s, n: f"SwitchName={s} Nodes={n}", SLURMISH, SLURMISH), st.builds(lambda s, c: f"SwitchName={s} Switches={c}", SLURMISH, SLURMISH), SLURMISH), max_size=8))
def test_topology_conf_never_crashes(lines):
    value_or_input_error(parse_topology_conf, "\n".join(lines))


TOML_VALUE = st.one_of(st.integers(-5, 10**7), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.text(max_size=10), st.lists(st.floats(0, 100, allow_nan=False), max_size=4))
KEYS = st.sampled_from(["interval_s", "policy", "levels", "thresholds_gpuh", "priority_strategy", "partitions", "bogus", "comm_gpus", "max_wait_s"])
SECTIONS = st.sampled_from(["engine", "scope", "slurm", "accounting", "replay", "policies.dike", "policies.tiresias", "nope"])


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    return repr(value)


@fuzz
@given(st.lists(st.tuples(SECTIONS, KEYS, TOML_VALUE), max_size=6), st.binary(max_size=40))
def test_config_gives_a_config_or_a_config_error(tmp_path_factory, entries, garbage):
    folder = tmp_path_factory.mktemp("cfg")
    text = "".join(f"[{section}]\n{key} = {toml_literal(value)}\n" for section, key, value in entries)
    for payload in (text.encode(), garbage):
        path = folder / "c.toml"
        path.write_bytes(payload)
        try:
            load_config(path, environ={})
        except InputError as exc:
            assert str(path) in str(exc)
