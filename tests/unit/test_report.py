"""The replay report's computed values: ratios to fifo, the headline, colours, time units, the
thresholds a policy used, and the rendered page's sections."""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import in_process

from dike_slurm.config import load_config
from dike_slurm.policies import dike as dike_module
from dike_slurm.sim.kernel.replay import load_input, run_policy, sim_settings
from dike_slurm.sim.kernel.trace import case_name
from dike_slurm.sim.eval.report import (
    derived_thresholds,
    describe_source,
    preemption_text,
    render_report,
    thresholds_at,
    thresholds_used,
)
from dike_slurm.sim.eval.report_compare import METRICS, comparison, compare, compared, headline
from dike_slurm.sim.eval.report_plots import (
    LEVEL_RAMP,
    POLICY_COLOURS,
    SPARE_COLOURS,
    build_plots,
    filled_levels,
    level_colours,
    policy_colours,
    time_unit,
    user_label,
)

REPO = Path(__file__).resolve().parents[2]
METRIC = {metric.key: metric for metric in METRICS}


def summary(**values: float) -> dict:
    """A summary.json policy entry: every metric 1.0 (jobs 10, no worst user) unless given."""
    base = {metric.key: 1.0 for metric in METRICS}
    base.update(jobs=10, worst_user="")
    base.update(values)
    return base


def test_compare_gives_the_factor_and_which_way_is_better():
    assert compare(METRIC["avg_jct_s"], 100.0, 290.0).text == "2.90x better"
    assert compare(METRIC["p99_jct_s"], 180.0, 100.0).text == "1.80x worse"
    assert compare(METRIC["user_jain_index"], 0.12, 0.33).text == "2.75x worse"
    assert compare(METRIC["gpu_utilization"], 0.9, 0.6).text == "1.50x better"
    assert compare(METRIC["avg_jct_s"], 100.2, 100.0).text == "same"  # within half a percent
    assert compare(METRIC["jobs"], 5, 10).text == "same"  # a count that is neither better nor worse
    assert compare(METRIC["preemptions"], 12, 0).text == "worse"  # no factor against 0
    assert compare(METRIC["preemptions"], 0, 12).text == "better"


def test_the_verdict_names_each_worse_metric_with_both_values():
    fifo = summary(avg_jct_s=2.9 * 3600, p99_jct_s=10.0, user_jain_index=0.33)
    dike = summary(avg_jct_s=3600.0, p99_jct_s=18.0, user_jain_index=0.12)
    sentence, some_worse = headline("dike", dike, fifo, "fifo")
    assert sentence == (
        "dike cuts average JCT 2.9x against fifo, but 2 metrics are worse by 0.5% or more: "
        "p99 JCT 0.01 h against 0.00 h (1.8x) and user Jain index 0.120 against 0.330."
    )
    assert some_worse


def test_the_verdict_hides_no_small_change_and_states_its_threshold():
    fifo = summary(avg_jct_s=7200.0, p95_jct_s=100.0)
    tiresias = summary(avg_jct_s=3600.0, p95_jct_s=104.0)  # 4% worse: named (a 5% threshold once hid it)
    sentence, some_worse = headline("tiresias", tiresias, fifo, "fifo")
    assert sentence == ("tiresias cuts average JCT 2x against fifo, but 1 metric is worse by 0.5% or more: "
                        "p95 JCT 0.03 h against 0.03 h (1.04x).")
    assert some_worse
    within, some_worse = headline("a", summary(avg_jct_s=3600.0, p95_jct_s=100.4), fifo, "fifo")  # 0.4%: same
    assert within == "a cuts average JCT 2x against fifo, and no metric is worse by 0.5% or more." and not some_worse
    slower, _ = headline("x", summary(avg_jct_s=9000.0, p95_slowdown=2.0), fifo, "fifo")
    assert slower == ("x raises average JCT 1.25x against fifo, and 1 other metric is worse by 0.5% or more: "
                      "p95 slowdown 2.00 against 1.00 (2x).")
    alone, some_worse = headline("z", summary(avg_jct_s=9000.0), fifo, "fifo")
    assert alone == "z raises average JCT 1.25x against fifo, and no other metric is worse by 0.5% or more." and some_worse
    level, _ = headline("y", summary(avg_jct_s=7210.0, worst_user_slowdown=1.006), fifo, "fifo")
    assert level == ("y leaves average JCT as fifo has it (2.00 h), and 1 metric is worse by 0.5% or more: "
                     "worst user slowdown 1.01 against 1.00 (1.006x).")


def test_the_verdict_names_utilisation_makespan_slowdown_and_fairness_and_lists_them_apart():
    base = summary(avg_jct_s=7200.0, gpu_utilization=0.664, makespan_s=3600.0 * 300, avg_slowdown=59.7,
                   user_jain_index=0.5, max_wait_s=3600.0, worst_user_slowdown=10.0, preemptions=0,
                   avg_jct_light_s=3600.0)
    worse = summary(avg_jct_s=3600.0, gpu_utilization=0.579, makespan_s=3600.0 * 321, avg_slowdown=208.6,
                    user_jain_index=0.4, max_wait_s=7200.0, worst_user_slowdown=12.0, preemptions=482,
                    avg_jct_light_s=5400.0)
    sentence, _ = headline("dike", worse, base, "multifactor")
    assert sentence == (
        "dike cuts average JCT 2x against multifactor, but 8 metrics are worse by 0.5% or more: "
        "longest wait 2.00 h against 1.00 h (2x); makespan 321.00 h against 300.00 h (1.07x); "
        "useful GPU utilisation 57.9% against 66.4%; average slowdown 208.60 against 59.70 (3.5x); "
        "user Jain index 0.400 against 0.500; worst user slowdown 12.00 against 10.00 (1.2x); "
        "preemptions 482 against 0; and average JCT, light jobs 1.50 h against 1.00 h (1.5x)."
    )


def named_in(sentence: str, item) -> bool:  # noqa: ANN001
    """Whether the verdict names this metric as worse: average JCT in its opening, any other by its
    name and both values."""
    if item.metric.key == "avg_jct_s":
        return " raises average JCT" in sentence
    return f"{item.metric.name} {item.metric.text(item.value)} against {item.metric.text(item.base)}" in sentence


def test_on_constructed_summaries_the_verdict_names_exactly_what_the_table_marks_worse():
    """2,000 random summaries, many values near the baseline's, some 0: every row the table marks
    worse is named in the verdict, and no other."""
    rng = np.random.default_rng(54)
    near = (0.99, 0.995, 0.996, 1.0, 1.004, 1.005, 1.006, 1.01, 1.04, 1.2, 0.0)
    for _ in range(2000):
        base = summary(**{m.key: float(rng.uniform(0.1, 100.0)) for m in METRICS if m.key != "jobs"})
        other = summary(**{key: base[key] * float(rng.choice(near)) for key in base if key not in ("jobs", "worst_user")})
        rows = comparison({"base": base, "other": other}, "base")
        sentence, some_worse = headline("other", other, base, "base")
        marked = {row.label for row in rows if row.cells[1].verdict == "worse"}
        named = {item.metric.label for item in compared(other, base) if named_in(sentence, item)}
        assert named == marked, sentence
        assert some_worse == bool(marked)


def test_comparison_rows_mark_the_best_value_and_leave_the_baseline_without_a_change():
    rows = comparison(
        {
            "fifo": summary(avg_jct_s=7200.0, user_jain_index=0.5, preemptions=0, worst_user_slowdown=9.0, worst_user="ann"),
            "dike": summary(avg_jct_s=3600.0, user_jain_index=0.4, preemptions=3),
            "tiresias": summary(avg_jct_s=3600.0, user_jain_index=0.45, preemptions=5),
        },
        "fifo",
    )
    by_label = {row.label: row for row in rows}
    assert [row.label for row in rows] == [metric.label for metric in METRICS]
    jct = by_label["average JCT (h)"]
    assert [c.text for c in jct.cells] == ["2.00", "1.00", "1.00"]
    assert [c.best for c in jct.cells] == [False, True, True]  # ties are all marked
    assert [c.change for c in jct.cells] == ["", "2.00x better", "2.00x better"]
    assert [c.verdict for c in jct.cells] == ["", "better", "better"]
    assert jct.better == "lower is better"
    jain = by_label["user Jain index"]
    assert [c.best for c in jain.cells] == [True, False, False] and jain.cells[1].verdict == "worse"
    assert [c.best for c in by_label["preemptions"].cells] == [True, False, False]
    assert by_label["worst user slowdown"].cells[0].text == "9.00 (ann)"
    assert not any(c.best for c in by_label["jobs"].cells)  # neither better nor worse: no best
    assert not any(c.best for c in by_label["p95 JCT (h)"].cells)  # all equal: nothing to choose


def test_a_row_within_half_a_percent_has_no_best_and_near_ties_are_all_best():
    rows = {row.label: row for row in comparison(
        {"fifo": summary(avg_jct_s=1000.0, p99_jct_s=100.0), "a": summary(avg_jct_s=1003.0, p99_jct_s=50.0),
         "b": summary(avg_jct_s=999.0, p99_jct_s=50.2)},
        "fifo",
    )}
    assert [c.best for c in rows["average JCT (h)"].cells] == [False, False, False]
    assert [c.best for c in rows["p99 JCT (h)"].cells] == [False, True, True]


def test_every_policy_has_one_colour_and_levels_use_none_of_them():
    assert policy_colours(["dike", "fifo"]) == {"dike": POLICY_COLOURS["dike"], "fifo": POLICY_COLOURS["fifo"]}
    assert policy_colours(["fifo", "mine", "other"])["mine"] == SPARE_COLOURS[0]
    assert len(set(policy_colours(["a", "b", "c", "fifo"]).values())) == 4
    assert not set(LEVEL_RAMP) & (set(POLICY_COLOURS.values()) | set(SPARE_COLOURS))
    assert level_colours(3)[0] == LEVEL_RAMP[0] and level_colours(8) == list(LEVEL_RAMP)
    assert len(set(level_colours(3))) == 3


@pytest.mark.parametrize(
    ("span_s", "unit"), [(600.0, "minutes"), (3 * 3600.0, "minutes"), (86400.0, "hours"), (20 * 86400.0, "days")]
)
def test_time_axes_use_a_unit_that_suits_the_span(span_s, unit):
    assert time_unit(span_s)[1] == unit


def test_level_gaps_between_cycles_hold_the_last_value_and_nothing_is_drawn_outside():
    nan = float("nan")
    assert filled_levels([nan, 2.0, nan, nan, 3.0, nan]).tolist() == [0.0, 2.0, 2.0, 2.0, 3.0, 0.0]
    assert filled_levels([nan, nan]).tolist() == [0.0, 0.0]


def user_jobs(replay_input) -> dict[str, int]:  # noqa: ANN001
    counts: dict[str, int] = {}
    for job in replay_input.trace.jobs:
        counts[job.user] = counts.get(job.user, 0) + 1
    return counts


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trace")
    result = in_process.dike_slurm("trace", "generate", "--out", str(folder), "--jobs", "150", "--nodes", "4",
                                   "--nodes-per-leaf", "2", "--seed", "5", "--load", "0.9",
                                   cwd=REPO, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return folder


def test_derived_thresholds_are_the_ones_dike_computed_at_its_cycles(trace, monkeypatch):
    """Every threshold set Dike computed in a replay, recomputed from the metrics at the same time."""
    config = load_config(None, environ={}, overrides={"policies": {"dike": {"min_history_jobs": 20}}})
    replay_input = load_input(trace / "sacct.txt", trace / "slurm.conf", None)
    settings = sim_settings(config, replay_input.conf)
    used: list[tuple[float, list[float], str]] = []
    original = dike_module.thresholds_gpu_s

    def recording(snapshot, params):  # noqa: ANN001
        values, origin = original(snapshot, params)
        used.append((snapshot.time, values, origin))
        return values, origin

    monkeypatch.setattr(dike_module, "thresholds_gpu_s", recording)
    run = run_policy("dike", replay_input, config, settings)
    params = config.policy_params("dike")
    assert {origin.split()[0] for _, _, origin in used} == {"fallback", "derived"}
    for at, values, origin in used:
        assert thresholds_at(params, run.metrics, at, settings.history_window_s) == (values, origin)
    monkeypatch.undo()
    series = derived_thresholds(params, run.metrics, settings.history_window_s)
    assert len(series) == sum(1 for cycles in run.metrics.cycles_per_bin if cycles) > 0
    shown = thresholds_used("dike", params, run.metrics, settings.history_window_s)
    last = [v for _, v, origin in series if origin.startswith("derived")][-1]
    assert shown.values[0].startswith(f"{last[0] / 3600:.2f} GPU-h at the end (")
    assert "quantiles 0.5, 0.75" in shown.rule and "while fewer than 20 had finished" in shown.rule


def test_configured_thresholds_are_shown_as_configured(trace):
    config = load_config(None, environ={}, overrides={"policies": {"dike": {"thresholds_gpuh": [2, 16]}}})
    metrics = None  # not read for configured thresholds
    shown = thresholds_used("dike", config.policy_params("dike"), metrics, 86400.0)
    assert shown.rule == "configured (thresholds_gpuh)" and shown.values == ["2.00 GPU-h", "16.00 GPU-h"]
    tiresias = thresholds_used("tiresias", config.policy_params("tiresias"), metrics, 86400.0)
    assert tiresias.values == ["1.00 GPU-h"]
    assert thresholds_used("fifo", config.policy_params("fifo"), metrics, 86400.0) is None


def test_the_page_has_the_headline_ratios_parameters_thresholds_and_configuration(trace, tmp_path):
    config_file = tmp_path / "site.toml"
    config_file.write_text("[policies.dike]\nmin_history_jobs = 20\npromote_knob = 6.0\n", encoding="utf-8")
    config = load_config(config_file, environ={})
    replay_input = load_input(trace / "sacct.txt", trace / "slurm.conf", None)
    settings = sim_settings(config, replay_input.conf, preemptible=1.0)  # so that the policies differ from fifo
    runs = [(name, run_policy(name, replay_input, config, settings).metrics) for name in ("fifo", "tiresias", "dike")]
    html = render_report(
        case=replay_input.case,
        input_section=replay_input.input_summary(), unfinished="",
        settings={"history_window_days": settings.history_window_s / 86400.0, "seed": settings.seed,
                  "preemptible": settings.preemptible_choice, "preemptible_jobs": len(replay_input.trace.jobs)},
        runs=runs, user_jobs=user_jobs(replay_input), penalty_rows=[], penalty_headers=[], timings={"fifo": 1.0},
        params={name: config.policy_params(name) for name, _ in runs}, config_source={"kind": "file", "path": str(config_file), "variables": ["DIKE_REPLAY__SEED"]},
    )
    headline_block = re.search(r'<div class="headline" id="headline">(.*?)</div>', html, re.S).group(1)
    assert headline_block.count("<p") == 2 and "tiresias" in headline_block and "dike" in headline_block
    assert html.count('<span class="change">') == 2 * len(METRICS)  # every metric of tiresias and dike against fifo
    assert 'class="better best"' in html or 'class="worse best"' in html or 'class="same best"' in html
    parameters = re.search(r'<table id="parameters">(.*?)</table>', html, re.S).group(1)
    assert "<td>promote_knob</td><td>unset</td><td>6.0</td>" in parameters  # tiresias's default, dike's from the file
    assert "No parameters: fifo." in html
    thresholds = re.search(r'<table id="thresholds">(.*?)</table>', html, re.S).group(1)
    assert "configured (thresholds_gpu_s)" in thresholds and "derived at every cycle" in thresholds
    assert f"<code>{config_file} (--config) + DIKE_REPLAY__SEED</code>" in html and "promote_knob = 6.0" in html
    for name in ("fifo", "tiresias", "dike"):
        assert f'style="background: {POLICY_COLOURS[name]}"></span>{name}' in html
    assert html.count("data:image/svg+xml;base64,") == 5


def test_without_the_configuration_the_page_says_the_parameters_were_not_passed(trace):
    config = load_config(None, environ={})
    replay_input = load_input(trace / "sacct.txt", trace / "slurm.conf", None)
    metrics = run_policy("fifo", replay_input, config, sim_settings(config, replay_input.conf)).metrics
    html = render_report(
        case=replay_input.case, input_section=replay_input.input_summary(), unfinished="",
        settings={"history_window_days": 30.0, "preemptible": "live", "preemptible_jobs": 0}, runs=[("fifo", metrics)],
        user_jobs=user_jobs(replay_input), penalty_rows=[], penalty_headers=[], timings={},
    )
    assert f"<h1>Replay of {trace.name} (sacct.txt): preemptible by the engine&#39;s opt-in rule (0 of " in html
    assert "The replay did not pass the policies' parameters to the report." in html
    assert "The replay did not say where its configuration came from." in html
    assert 'id="headline"' not in html  # one policy: nothing to compare with
    assert np.isfinite(metrics.finished_end).all() and len(metrics.finished_end) == metrics.summary["jobs"]


def test_the_configuration_source_reads_as_the_cli_says_it():
    assert describe_source({"kind": "defaults", "path": None, "variables": []}) == "built-in defaults (no file)"
    assert describe_source({"kind": "env", "path": "/etc/d.toml", "variables": ["DIKE_A__B"]}) == "/etc/d.toml ($DIKE_CONFIG) + DIKE_A__B"


def test_user_labels_are_plain_text_cut_to_a_readable_length(trace):
    assert user_label("$x$", 2) == r"\$x\$ (2)"  # not mathtext
    assert user_label("a-very-long-user-name-from-ldap", 1) == "a-very-long-user-name-f\u2026 (1)"
    assert user_label("achen", 641) == "achen (641)"
    config = load_config(None, environ={})
    replay_input = load_input(trace / "sacct.txt", trace / "slurm.conf", None)
    metrics = run_policy("fifo", replay_input, config, sim_settings(config, replay_input.conf)).metrics
    names = {"cost$center": 3, "$x$": 2, "a-very-long-user-name-from-ldap": 1}
    plots = build_plots([("fifo", replace(metrics, user_slowdown={name: 1.5 for name in names}))], names, "fifo")
    users = next(plot for plot in plots if plot.title == "Per-user slowdown")
    assert base64.b64decode(users.data_uri.split(",", 1)[1]).startswith(b"<?xml")
    assert "Mean slowdown of the 3 users" in users.caption


def _report_marks_and_verdicts(html_text: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    """From a rendered report: per policy, the labels of the rows its cell marks worse, and its verdict."""
    table = re.search(r'<table id="comparison">(.*?)</table>', html_text, re.S).group(1)
    head, body = table.split("</thead>")
    names = [html.unescape(n) for n in re.findall(r'</span>([^<]*)</th>', head)]
    marked: dict[str, set[str]] = {name: set() for name in names}
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        label = html.unescape(re.match(r"<td>([^<]*)</td>", row).group(1))
        classes = re.findall(r'<td class="([^"]*)"><span class="value">', row)
        assert len(classes) == len(names)
        for name, cls in zip(names, classes):
            if "worse" in cls.split():
                marked[name].add(label)
    block = re.search(r'<div class="headline" id="headline">(.*?)</div>', html_text, re.S).group(1)
    sentences = [html.unescape(s) for s in re.findall(r"<p[^>]*>(.*?)</p>", block, re.S)]
    verdicts = {name: next(s for s in sentences if s.startswith(f"{name} ")) for name in names if any(
        s.startswith(f"{name} ") for s in sentences)}
    return marked, verdicts


@pytest.fixture(scope="module")
def real_replays(trace, tmp_path_factory) -> list[tuple[Path, str]]:
    """Two real replays of the small trace through the CLI, each (its folder, what it printed): with
    no job preemptible (multifactor, fifo and dike: fifo raises average JCT and makes other metrics
    worse, dike cuts it but makes some worse: both forms of the verdict), and with every job
    preemptible. (The bundled sample showed the same two forms at seven times the replay time.)"""
    runs = []
    for folder, policies, preemptible in ((trace, "multifactor,fifo,dike", "none"),
                                          (trace, "fifo,tiresias,dike", "all")):
        out = tmp_path_factory.mktemp("real") / "out"
        result = in_process.dike_slurm(
            "replay", str(folder / "sacct.txt"), "--slurm-conf", str(folder / "slurm.conf"), "-p", policies,
            "--preemptible", preemptible, "--out", str(out), cwd=REPO, env={"PATH": "/usr/bin:/bin", "COLUMNS": "100"})
        assert result.returncode == 0, result.stderr
        runs.append((out, result.stdout))
    return runs


def test_on_real_replays_the_verdict_names_every_metric_the_report_marks_worse(real_replays):
    """The report page's red cells against its verdicts, and the console's verdict lines against the
    page's: every row marked worse is named (with both values, as summary.json has them), no other."""
    checked, sentences = 0, []
    for out, stdout in real_replays:
        page = (out / "report.html").read_text(encoding="utf-8")
        marked, verdicts = _report_marks_and_verdicts(page)
        sentences += verdicts.values()
        summaries = json.loads((out / "summary.json").read_text(encoding="utf-8"))["policies"]
        baseline = next(name for name in marked if name not in verdicts)
        assert set(verdicts) == set(marked) - {baseline}
        for name, sentence in verdicts.items():
            assert sentence in stdout.splitlines()  # the console says what the page says, on one line
            named = {item.metric.label for item in compared(summaries[name], summaries[baseline])
                     if named_in(sentence, item)}
            assert named == marked[name], (name, sentence)
            checked += len(marked[name])
    assert checked >= 5  # the replays do make metrics worse: the check is not empty
    # both forms of the verdict were checked: a policy that raises average JCT, and one that cuts it
    assert any(" raises average JCT " in s for s in sentences) and any(" cuts average JCT " in s for s in sentences)


def test_report_titles_name_the_case_and_the_preemption_setting(real_replays, trace):
    titles = [re.search(r"<h1>(.*?)</h1>", (out / "report.html").read_text(encoding="utf-8")).group(1)
              for out, _ in real_replays]
    assert titles == [f"Replay of {trace.name} (sacct.txt): no job preemptible",
                      f"Replay of {trace.name} (sacct.txt): every job preemptible"]
    assert preemption_text(0.5, 1107, 2229) == "a share of 0.5 preemptible (1,107 of 2,229 jobs)"
    assert preemption_text("live", 3, 2229) == "preemptible by the engine's opt-in rule (3 of 2,229 jobs)"
    assert case_name(Path("examples/corpus/philly-b436b2-s3/sacct.txt")) == "philly-b436b2-s3"
    assert case_name(Path("/var/tmp/lab-dump.txt")) == "lab-dump"
