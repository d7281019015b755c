"""The acceptance targets of the corpus evaluation: read from the corpus's targets.toml (which
criteria, on which rows, at which thresholds), then checked per case. This module knows how a
criterion of each kind is computed; the file names and parameterises them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError
from dike_slurm.parsing.toml_file import read_toml_file

TARGETS_FILE = "targets.toml"
CASE_GROUPS = {"as given": False, "with twins": None}  # cases_of's `twins`


@dataclass(frozen=True)
class Criterion:
    """One column of a targets table: how it is computed (`kind`) and on which rows."""

    key: str
    label: str
    kind: str
    policy: str
    setting: str
    params: dict[str, Any] = field(default_factory=dict)
    requires: tuple[tuple[str, str], ...] = ()  # (variant, setting) rows that must have run too

    def baseline_setting(self) -> str:
        return self.params.get("baseline_setting", self.setting)


@dataclass(frozen=True)
class TargetSet:
    """One targets table: its criteria, the cases it reads, the note under it."""

    key: str
    title: str
    cases: str
    note: str
    criteria: tuple[Criterion, ...]


# ---------------------------------------------------------------------------------------- cells


def _cell(passed: bool | None, value: str, detail: str = "") -> dict:
    status = "n/a" if passed is None else ("PASS" if passed else "FAIL")
    return {"status": status, "value": value, "detail": detail}


def _not_run(what: str) -> dict:
    return {"status": "not run", "value": "", "detail": f"{what} not run"}


def _row(case: dict, variant: str, setting: str) -> dict | None:
    return next((r for r in case["rows"] if r["variant"] == variant and r["setting"] == setting), None)


def _baselines(criterion: Criterion) -> list[str]:
    baseline = criterion.params["baseline"]
    return [baseline] if isinstance(baseline, str) else list(baseline)


def _rows_or_not_run(case: dict, wanted: Sequence[tuple[str, str]]) -> list[dict] | dict:
    """The rows of (variant, setting), or the cell saying which did not run."""
    rows = [_row(case, variant, setting) for variant, setting in wanted]
    missing = [f"{variant} ({setting})" for (variant, setting), row in zip(wanted, rows) if row is None]
    return _not_run(" and ".join(missing)) if missing else rows


def _policy_and_baseline(case: dict, c: Criterion) -> tuple[dict, dict] | dict:
    rows = _rows_or_not_run(case, [(c.policy, c.setting), (c.params["baseline"], c.baseline_setting())])
    return rows if isinstance(rows, dict) else (rows[0]["metrics"], rows[1]["metrics"])


def _versus(case: dict, c: Criterion, judge: Callable[[float, float, str], tuple[bool, str, str]],
            metric: str | None = None) -> dict:
    """The cell `judge(policy's, baseline's, metric)` gives as (passed, value, detail), `metric`
    being the criterion's own when not given; the `not run` cell when either row is missing."""
    rows = _policy_and_baseline(case, c)
    if isinstance(rows, dict):
        return rows
    metric = metric or c.params["metric"]
    return _cell(*judge(rows[0][metric], rows[1][metric], metric))


def _jct_at_most(case: dict, c: Criterion) -> dict:
    return _versus(case, c, lambda p, b, _: (
        p <= c.params["factor"] * b, f"{b / p:.3f}x", f"{c.params['baseline']}/{c.policy} avg JCT"), "avg_jct_s")


def _metric_at_most(case: dict, c: Criterion) -> dict:
    return _versus(case, c, lambda p, b, metric: (
        p <= c.params["factor"] * b, f"{p / b:.3f}x", f"{c.policy}/{c.params['baseline']} {metric}"))


def _no_worse(case: dict, c: Criterion) -> dict:
    return _versus(case, c, lambda p, b, metric: (
        p <= b, f"{p:.2f} vs {b:.2f}", f"{c.policy} vs {c.params['baseline']} {metric}"))


def _metric_bound(case: dict, c: Criterion) -> dict:
    rows = _rows_or_not_run(case, [(c.policy, c.setting)])
    if isinstance(rows, dict):
        return rows
    metric = c.params["metric"]
    value = rows[0]["metrics"][metric]
    return _cell(value <= c.params["at_most"], format(value, c.params["format"]), f"{c.policy} {metric}")


def _fifo_ratio_within(case: dict, c: Criterion) -> dict:
    row = _row(case, c.policy, c.setting)
    worst_seed = c.params.get("seeds") == "worst"
    ratio = None if row is None else (
        min(row["fifo_ratio_seeds"].values()) if worst_seed and row["fifo_ratio_seeds"] else
        None if worst_seed else row["fifo_ratio"])
    if ratio is None:
        return _not_run(f"{c.policy} ({c.setting}) or its fifo")
    return _cell(ratio >= 1 / c.params["factor"], f"{ratio:.3f}x",
                 f"{'worst seed' if worst_seed else 'fifo'}/{c.policy} avg JCT")


def _oracle_gain(case: dict, c: Criterion) -> float | None:
    oracle = _row(case, c.params["oracle"], c.baseline_setting())
    return oracle["fifo_ratio"] if oracle else None


def _no_oracle_target(c: Criterion, value: str) -> dict:
    return _cell(None, value, f"oracle gains < {c.params['oracle_min_gain'] - 1:.0%}: no target")


def _jct_gain_at_least(case: dict, c: Criterion) -> dict:
    policy = _row(case, c.policy, c.setting)
    if policy is None:
        return _not_run(f"{c.policy} ({c.setting})")
    if "oracle" in c.params:
        gain = _oracle_gain(case, c)
        if gain is not None and gain < c.params["oracle_min_gain"]:
            return _no_oracle_target(c, "")
        if gain is None:
            return _not_run(c.params["oracle"])
    rows = _rows_or_not_run(case, [(name, c.baseline_setting()) for name in _baselines(c)])
    if isinstance(rows, dict):
        return rows
    best = min(row["metrics"]["avg_jct_s"] for row in rows)
    over = best / policy["metrics"]["avg_jct_s"]
    return _cell(over >= c.params["at_least"], f"{over:.3f}x", f"{' or '.join(_baselines(c))} / {c.policy} avg JCT")


def _capture(case: dict, c: Criterion) -> dict:
    """The share of the oracle's gain over the baseline that the policy captures."""
    rows = _policy_and_baseline(case, c)
    if isinstance(rows, dict):
        return rows
    if case.get("twin_of"):
        return _cell(None, "twin", "a shuffled twin: no capture target")
    gain = _oracle_gain(case, c)
    if gain is None:
        return _not_run(c.params["oracle"])
    if gain < c.params["oracle_min_gain"]:
        return _no_oracle_target(c, f"oracle {gain:.3f}x")
    share = math.log(rows[1]["avg_jct_s"] / rows[0]["avg_jct_s"]) / math.log(gain)
    return _cell(share >= c.params["at_least"], f"{share:.0%}",
                 f"log(baseline/policy) / log(baseline/oracle), oracle {gain:.3f}x")


def _fairness_measures(c: Criterion) -> tuple[tuple[str, str, Callable[[float, float], bool]], ...]:
    """(summary key, short name, passes(policy, baseline)) per fairness measure."""
    wait, drop = c.params["longest_wait_factor"], c.params["jain_drop"]
    return (
        ("worst_user_slowdown", "worst user", lambda p, b: p <= b),
        ("avg_slowdown", "avg slowdown", lambda p, b: p <= b),
        ("max_wait_s", "longest wait", lambda p, b: p <= wait * b),
        ("user_jain_index", "Jain", lambda p, b: p >= b - drop),
    )


def _as_fair_as(case: dict, c: Criterion) -> dict:
    """Every fairness measure at least the baseline's; the value names what fails."""
    rows = _policy_and_baseline(case, c)
    if isinstance(rows, dict):
        return rows
    failed, parts = [], []
    for key, name, passes in _fairness_measures(c):
        p, b = rows[0].get(key), rows[1].get(key)
        if p is None or b is None:
            return _not_run(f"{name} (an older summary)")
        if key == "user_jain_index":
            parts.append(f"{name} {p - b:+.3f}")
        else:
            parts.append(f"{name} {p / b:.2f}x" if b else f"{name} {p:g} vs 0")
        if not passes(p, b):
            failed.append(name)
    return _cell(not failed, ", ".join(failed) if failed else "all four",
                 f"{c.policy} against {c.params['baseline']}: " + "; ".join(parts))


# kind: (the cell, its parameters besides key, label, kind, policy and setting: required, optional)
KINDS: dict[str, tuple[Callable[[dict, Criterion], dict], frozenset[str], frozenset[str]]] = {
    "jct_at_most": (_jct_at_most, frozenset({"baseline", "factor"}), frozenset({"baseline_setting"})),
    "metric_at_most": (_metric_at_most, frozenset({"baseline", "metric", "factor"}), frozenset({"baseline_setting"})),
    "no_worse": (_no_worse, frozenset({"baseline", "metric"}), frozenset({"baseline_setting"})),
    "metric_bound": (_metric_bound, frozenset({"metric", "at_most", "format"}), frozenset()),
    "fifo_ratio_within": (_fifo_ratio_within, frozenset({"factor"}), frozenset({"seeds"})),
    "jct_gain_at_least": (_jct_gain_at_least, frozenset({"baseline", "at_least"}),
                          frozenset({"baseline_setting", "oracle", "oracle_min_gain"})),
    "capture": (_capture, frozenset({"baseline", "oracle", "oracle_min_gain", "at_least"}), frozenset({"baseline_setting"})),
    "as_fair_as": (_as_fair_as, frozenset({"baseline", "longest_wait_factor", "jain_drop"}), frozenset({"baseline_setting"})),
}


def check_criterion(case: dict, c: Criterion) -> dict:
    """One cell: `not run` where a required row is missing, else its kind's."""
    missing = _rows_or_not_run(case, c.requires)
    return missing if isinstance(missing, dict) else KINDS[c.kind][0](case, c)


def check_set(target_set: TargetSet, cases: Sequence[dict]) -> dict:
    """PASS/FAIL per case and criterion, from the rows' numbers."""
    return {
        "title": target_set.title,
        "note": target_set.note,
        "criteria": [{"key": c.key, "label": c.label} for c in target_set.criteria],
        "cases": [{"case": case["name"], "cells": {c.key: check_criterion(case, c) for c in target_set.criteria}}
                  for case in cases],
    }


# ---------------------------------------------------------------------------------------- the file


def find_targets_file(folders: Sequence[Path], is_case: Callable[[Path], bool]) -> tuple[Path | None, list[Path]]:
    """The targets.toml of the corpus: in a corpus folder given, or in the folder holding a case
    folder given; the first found (None: none), and every place looked at."""
    looked = []
    for folder in folders:
        path = (folder.resolve().parent if is_case(folder) else folder) / TARGETS_FILE
        if path.is_file():
            return path, looked + [path]
        looked.append(path)
    return None, looked


def load_targets(path: Path, *, variants: Collection[str], settings: Collection[str]) -> tuple[TargetSet, ...]:
    """Read and check targets.toml; every error names the file and the key."""
    return targets_from_data(read_toml_file(path), source=str(path), variants=variants, settings=settings)


def _fail(source: str, key: str, message: str) -> InputError:
    return InputError(f"{key}: {message}", source=source)


def _text(table: dict, key: str, where: str, source: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise _fail(source, f"{where}.{key}", "expected a non-empty string")
    return value


def _tables(value: Any, where: str, source: str) -> list[dict]:
    if not isinstance(value, list) or not value or not all(isinstance(item, dict) for item in value):
        raise _fail(source, where, "expected one or more tables")
    return value


def targets_from_data(data: dict, *, source: str, variants: Collection[str],
                      settings: Collection[str]) -> tuple[TargetSet, ...]:
    """The checks of load_targets on already parsed TOML."""
    unknown = sorted(set(data) - {"set"})
    if unknown:
        raise _fail(source, unknown[0], "unknown key (known: set)")
    out, keys = [], set()
    for index, table in enumerate(_tables(data.get("set"), "set", source)):
        where = f"set[{index}]"
        unknown = sorted(set(table) - {"key", "title", "cases", "note", "requires", "criterion"})
        if unknown:
            raise _fail(source, f"{where}.{unknown[0]}", "unknown key (known: key, title, cases, note, requires, criterion)")
        requires = _requires(table, where, source, variants, settings)
        key = _text(table, "key", where, source)
        if key in keys:
            raise _fail(source, f"{where}.key", f"{key!r} is another set's key too")
        keys.add(key)
        cases = _text(table, "cases", where, source)
        if cases not in CASE_GROUPS:
            raise _fail(source, f"{where}.cases", f"expected one of: {', '.join(map(repr, CASE_GROUPS))}")
        criteria = [_criterion(item, f"{where}.criterion[{i}]", source, variants, settings, requires)
                    for i, item in enumerate(_tables(table.get("criterion"), f"{where}.criterion", source))]
        seen = [c.key for c in criteria]
        if len(set(seen)) != len(seen):
            raise _fail(source, f"{where}.criterion", f"two criteria have the key {next(k for k in seen if seen.count(k) > 1)!r}")
        out.append(TargetSet(key, _text(table, "title", where, source), cases, table.get("note", ""), tuple(criteria)))
    return tuple(out)


def _requires(table: dict, where: str, source: str, variants: Collection[str],
              settings: Collection[str]) -> tuple[tuple[str, str], ...]:
    """A `requires` list of "variant@setting" rows."""
    value = table.get("requires", [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item.count("@") == 1 for item in value):
        raise _fail(source, f"{where}.requires", 'expected a list of "policy@setting"')
    rows = tuple(tuple(item.split("@")) for item in value)
    for variant, setting in rows:
        if variant not in variants or setting not in settings:
            raise _fail(source, f"{where}.requires", f"unknown policy or setting in {variant}@{setting!r}")
    return rows


def _criterion(table: dict, where: str, source: str, variants: Collection[str], settings: Collection[str],
               set_requires: tuple[tuple[str, str], ...]) -> Criterion:
    kind = _text(table, "kind", where, source)
    if kind not in KINDS:
        raise _fail(source, f"{where}.kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    _, required, optional = KINDS[kind]
    params = {k: v for k, v in table.items() if k not in ("key", "label", "kind", "policy", "setting", "requires")}
    missing = sorted(required - set(params))
    if missing:
        raise _fail(source, f"{where}.{missing[0]}", f"missing (kind {kind} needs {', '.join(sorted(required))})")
    unknown = sorted(set(params) - required - optional)
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}", f"unknown key for kind {kind}")
    criterion = Criterion(_text(table, "key", where, source), _text(table, "label", where, source), kind,
                          _text(table, "policy", where, source), _text(table, "setting", where, source), params,
                          set_requires + _requires(table, where, source, variants, settings))
    _check_params(criterion, where, source, variants, settings)
    return criterion


def _check_params(c: Criterion, where: str, source: str, variants: Collection[str], settings: Collection[str]) -> None:
    baseline = c.params.get("baseline", [])
    if "baseline" in c.params and (not isinstance(baseline, (str, list)) or baseline == []):
        raise _fail(source, f"{where}.baseline", "expected a policy, or a list of them (the best of them)")
    names = [("policy", c.policy), *(("baseline", name) for name in ([baseline] if isinstance(baseline, str) else baseline))]
    if "oracle" in c.params:
        names.append(("oracle", c.params["oracle"]))
    for key, name in names:
        if not isinstance(name, str) or name not in variants:
            raise _fail(source, f"{where}.{key}", f"unknown policy {name!r} (known: {', '.join(variants)})")
    for key in ("setting", "baseline_setting"):
        value = c.setting if key == "setting" else c.params.get(key, c.setting)
        if value not in settings:
            raise _fail(source, f"{where}.{key}", f"unknown setting {value!r} (known: {', '.join(settings)})")
    for key, value in c.params.items():
        if key in ("factor", "at_most", "at_least", "oracle_min_gain", "longest_wait_factor", "jain_drop") and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0):
            raise _fail(source, f"{where}.{key}", "expected a finite number >= 0")
    if "oracle" in c.params and "oracle_min_gain" not in c.params:
        raise _fail(source, f"{where}.oracle_min_gain", "missing (an oracle needs the gain below which there is no target)")
    if c.params.get("seeds", "worst") != "worst":
        raise _fail(source, f"{where}.seeds", "expected \"worst\" (every seed must pass)")
    if "format" in c.params:
        try:
            format(1.0, c.params["format"])
        except (TypeError, ValueError):
            raise _fail(source, f"{where}.format", "expected a Python number format such as '.2%' or 'g'") from None
    if "metric" in c.params and not isinstance(c.params["metric"], str):
        raise _fail(source, f"{where}.metric", "expected the name of a summary metric")
