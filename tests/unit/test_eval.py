"""`dike-slurm eval`: the corpus harness on two tiny generated cases, its tables, targets and errors."""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import in_process

from dike_slurm.errors import InputError
from dike_slurm.sim.eval import eval_report, evaluate, targets
from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec
from dike_slurm.sim.tracegen.generate import generate_sample
from dike_slurm.sim.tracegen.workload_model import WorkloadModel

ROOT = Path(__file__).resolve().parents[2]
TARGETS_FILE = ROOT / "examples" / "corpus" / "targets.toml"  # the corpus's, copied into each test corpus
TARGETS = targets.load_targets(TARGETS_FILE, variants=[v.label for v in evaluate.VARIANTS],
                               settings=[s.key for s in evaluate.SETTINGS])


def checked(result: dict, key: str) -> dict:
    """One target set of the corpus's file, checked on `result`."""
    result = dict(result)
    eval_report.check_targets(result, [target_set for target_set in TARGETS if target_set.key == key])
    return result[key]


def make_case(folder: Path, seed: int) -> None:
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, cpus_per_node=64, real_memory_mb=512000, gpu_type="a100",
                          nodes_per_leaf=2, switch_fanout=2, switch_levels=None)
    generate_sample(folder, 60, cluster, replace(WorkloadModel(), n_users=5, target_load=2.0), seed)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_case(root / "zeta", 1)
    make_case(root / "alpha", 2)
    (root / "cases.json").write_text(json.dumps([{"case": "zeta"}, {"case": "alpha"}]), encoding="utf-8")
    (root / "targets.toml").write_bytes(TARGETS_FILE.read_bytes())
    return root


@pytest.fixture(scope="module")
def progress_seen() -> list[tuple[int, int]]:
    return []


@pytest.fixture(scope="module")
def result(corpus, progress_seen) -> dict:
    plan = evaluate.make_plan([corpus], only=("tiresias", "dike"))
    return evaluate.evaluate(plan, evaluate.load_config(None), workers=1, command="test",
                             on_progress=lambda done, total: progress_seen.append((done, total)))


def test_the_progress_counts_every_replayed_job_once_and_ends_at_its_total(result, progress_seen):
    replayed = sum(run["summary"]["jobs"] for case in result["cases"] for run in case["runs"])
    assert progress_seen[-1] == (replayed, replayed)
    assert {total for _, total in progress_seen} == {replayed}
    done = [count for count, _ in progress_seen]
    runs = sum(len(case["runs"]) for case in result["cases"])
    assert done == sorted(done) and len(set(done)) == runs  # it moved with every replay that finished


def test_cases_follow_cases_json_and_a_case_folder_is_one_case(corpus):
    assert [c.name for c in evaluate.find_cases([corpus])] == ["zeta", "alpha"]
    assert [c.name for c in evaluate.find_cases([corpus / "alpha"])] == ["alpha"]


def test_runs_cover_every_setting_and_none_and_half_only_for_preemptive_policies(result):
    case = result["cases"][0]
    runs = {(r["variant"], r["setting"], r["seed"]) for r in case["runs"]}
    assert runs == {
        ("fifo", "pen0", 0), ("tiresias", "pen0", 0), ("dike", "pen0", 0),
        ("fifo", "pen1", 0), ("tiresias", "pen1", 0), ("dike", "pen1", 0),
        ("tiresias", "pen1_none", 0), ("dike", "pen1_none", 0),
        ("tiresias", "pen1_half", 0), ("tiresias", "pen1_half", 1), ("dike", "pen1_half", 0), ("dike", "pen1_half", 1),
    }
    half = [r for r in case["runs"] if r["setting"] == "pen1_half"]
    assert {r["preemptible"] for r in half} == {0.5} and {r["comm_penalty"] for r in half} == {1.0}
    none = [r for r in case["runs"] if r["setting"] == "pen1_none"]
    assert {r["preemptible"] for r in none} == {0.0} and all(r["summary"]["preemptions"] == 0 for r in none)
    used = case["sim_settings"]
    assert sorted(used) == ["preemptible=0 seed=0", "preemptible=0.5 seed=0", "preemptible=0.5 seed=1",
                            "preemptible=1 seed=0"]
    assert [used[k]["preemptible"] for k in sorted(used)] == [0.0, 0.5, 0.5, 1.0]
    assert [used[k]["seed"] for k in sorted(used)] == [0, 0, 1, 0]


def test_ratios_and_means_come_from_the_run_summaries(result):
    for case in result["cases"]:
        summary = {(r["variant"], r["setting"], r["seed"]): r["summary"] for r in case["runs"]}
        for row in case["rows"]:
            baseline = "pen1" if row["setting"] in ("pen1_half", "pen1_none") else row["setting"]
            fifo = summary[("fifo", baseline, 0)]["avg_jct_s"]
            seeds = [s for (v, st, s) in summary if v == row["variant"] and st == row["setting"]]
            mean = sum(summary[(row["variant"], row["setting"], s)]["avg_jct_s"] for s in seeds) / len(seeds)
            assert row["metrics"]["avg_jct_s"] == pytest.approx(mean)
            assert row["fifo_ratio"] == pytest.approx(fifo / mean)
            assert row["multifactor_ratio"] is None  # multifactor was not run here
        fifo_row = eval_report.row_of(case, "fifo", "pen1")
        assert fifo_row["fifo_ratio"] == 1.0


def test_every_one_type_case_has_a_shuffled_twin_with_the_same_jobs(result, corpus):
    assert [(c["name"], c["twin_of"]) for c in result["cases"]] == [
        ("zeta", None), ("zeta-shuffled", "zeta"), ("alpha", None), ("alpha-shuffled", "alpha")]
    assert [c.name for c in evaluate.make_plan([corpus], twins=False).cases] == ["zeta", "alpha"]
    case, twin = result["cases"][:2]
    assert twin["input"] == case["input"] and twin["avg_run_h"] == case["avg_run_h"]
    from dike_slurm.sim.eval.evaluate import Case, _case_inputs
    from dike_slurm.sim.kernel.replay import load_input

    reads = []

    def counted_load(*paths):
        reads.append(paths[0])
        return load_input(*paths)
    inputs = _case_inputs([Case("zeta", corpus / "zeta"), Case("zeta-shuffled", corpus / "zeta", twin_of="zeta")],
                          counted_load)
    assert reads == [corpus / "zeta" / "sacct.txt"]  # the twin shuffles its case's input: one read
    plain, shuffled = inputs["zeta"].trace.jobs, inputs["zeta-shuffled"].trace.jobs
    assert [(j.job_id, j.submit, j.duration_s, j.gpus) for j in shuffled] == [(j.job_id, j.submit, j.duration_s, j.gpus) for j in plain]
    assert [j.name for j in shuffled] != [j.name for j in plain] and sorted(j.name for j in shuffled) == sorted(j.name for j in plain)


def test_overall_is_the_geometric_mean_over_cases_per_setting(result):
    for twins, overall in ((False, result["overall"]), (True, result["twin_overall"])):
        cases = eval_report.cases_of(result, twins=twins)
        assert len(cases) == 2 and all((c["twin_of"] is not None) == twins for c in cases)
        for variant in ("tiresias", "dike"):
            for setting in ("pen1", "pen1_none"):
                ratios = [eval_report.row_of(c, variant, setting)["fifo_ratio"] for c in cases]
                expected = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                assert overall[variant][setting]["fifo"]["geomean"] == pytest.approx(expected)
                assert overall[variant][setting]["fifo"]["cases"] == 2
    # fifo never preempts: the NONE setting takes its pen 1 row
    assert result["overall"]["fifo"]["pen1_none"]["fifo"]["geomean"] == 1.0


def test_targets_follow_the_numbers(result):
    originals = eval_report.cases_of(result)
    assert [entry["case"] for entry in result["targets"]["cases"]] == [c["name"] for c in originals] == ["zeta", "alpha"]
    for entry, case in zip(result["targets"]["cases"], originals):
        fifo, dike = eval_report.row_of(case, "fifo", "pen1")["metrics"], eval_report.row_of(case, "dike", "pen1")["metrics"]
        cells = entry["cells"]
        assert cells["jct"]["status"] == ("PASS" if dike["avg_jct_s"] <= 1.01 * fifo["avg_jct_s"] else "FAIL")
        assert cells["p95"]["status"] == ("PASS" if dike["p95_jct_s"] <= 1.05 * fifo["p95_jct_s"] else "FAIL")
        assert cells["lost"]["status"] == ("PASS" if dike["lost_gpu_fraction"] <= 0.05 else "FAIL")
        # srtf_preemptive was not run, so the criteria that need it say so instead of passing.
        assert cells["capture"]["status"] == "not run"
        half = eval_report.row_of(case, "dike", "pen1_half")["fifo_ratio_seeds"]
        assert cells["half"]["status"] == ("PASS" if min(half.values()) >= 1 / 1.01 else "FAIL")
    for entry, case in zip(result["share_targets"]["cases"], originals):
        cells = entry["cells"]
        # multifactor and the non-preemptive oracle were not run: those criteria say so
        assert cells["none_jct"]["status"] == cells["half_multifactor"]["status"] == "not run"
        every, tiresias = eval_report.row_of(case, "dike", "pen1"), eval_report.row_of(case, "tiresias", "pen1")
        passed = tiresias["metrics"]["avg_jct_s"] >= every["metrics"]["avg_jct_s"]
        assert cells["all_tiresias"]["status"] == ("PASS" if passed else "FAIL")


def _share_fake(fifo: float, multifactor: float, oracle: float, none: float, half: float, every: float,
                tiresias: float, worst_none: float = 2.0) -> dict:
    def row(variant, setting, jct, worst=2.0):
        return {"variant": variant, "setting": setting, "fifo_ratio": fifo / jct,
                "metrics": {"avg_jct_s": jct, "worst_user_slowdown": worst}}
    rows = [row("fifo", "pen1", fifo), row("multifactor", "pen1", multifactor), row("srtf_oracle", "pen1", oracle),
            row("dike", "pen1_none", none, worst_none), row("dike", "pen1_half", half), row("dike", "pen1", every),
            row("tiresias", "pen1", tiresias)]
    return {"cases": [{"name": "x", "rows": rows}]}


def test_the_share_targets_hold_dike_at_none_half_and_every_job_preemptible():
    cells = checked(_share_fake(100, 90, 50, 80, 75, 60, 70), "share_targets")["cases"][0]["cells"]
    # 90 / 80 vs the better baseline (multifactor); log(100/80) / log(100/50) = 32% of the oracle's gain
    assert cells["none_jct"]["status"] == "PASS" and cells["none_jct"]["value"] == "1.125x"
    assert cells["none_capture"]["status"] == "FAIL" and cells["none_capture"]["value"] == "32%"
    assert cells["none_worst_user"]["status"] == "PASS"
    assert cells["half_vs_none"]["status"] == cells["half_multifactor"]["status"] == cells["all_tiresias"]["status"] == "PASS"
    worse = checked(_share_fake(100, 90, 98, 95, 96, 75, 70, worst_none=3.0), "share_targets")["cases"][0]["cells"]
    assert worse["none_jct"]["status"] == "FAIL"  # 90 / 95 < 0.99
    assert worse["none_capture"]["status"] == "n/a"  # the oracle gains under 5%
    assert worse["none_worst_user"]["status"] == "FAIL"
    assert worse["half_vs_none"]["status"] == "FAIL" and worse["all_tiresias"]["status"] == "FAIL"


def _fair_fake(twin_of: str | None = None, **dike_none) -> dict:
    """multifactor and fifo at pen1; dike at none (its metrics overridden), half and every;
    tiresias at half and every."""
    fair = {"worst_user_slowdown": 10.0, "avg_slowdown": 5.0, "max_wait_s": 1000.0, "user_jain_index": 0.5}

    def row(variant, setting, jct, **metrics):
        return {"variant": variant, "setting": setting, "fifo_ratio": 100 / jct,
                "metrics": {"avg_jct_s": jct, **fair, **metrics}}
    rows = [row("fifo", "pen1", 100), row("multifactor", "pen1", 90), row("srtf_oracle", "pen1", 50),
            row("dike", "pen1_none", 85, **dike_none), row("dike", "pen1_half", 70), row("dike", "pen1", 60),
            row("tiresias", "pen1_half", 69), row("tiresias", "pen1", 65)]
    return {"cases": [{"name": "x", "rows": rows, "twin_of": twin_of}]}


def test_the_fair_targets_compare_dike_with_multifactor_on_every_measure():
    cells = checked(_fair_fake(), "fair_targets")["cases"][0]["cells"]
    assert {c["key"] for c in checked(_fair_fake(), "fair_targets")["criteria"]} == set(cells)
    assert cells["none_jct"]["value"] == "1.059x" and cells["none_jct"]["status"] == "PASS"  # 90 / 85
    assert cells["none_capture"]["status"] == "FAIL"  # log(100/85) / log(100/50) = 23%
    assert cells["none_fair"]["status"] == cells["half_fair"]["status"] == cells["every_fair"]["status"] == "PASS"
    assert cells["half_tiresias"]["status"] == "FAIL" and cells["every_tiresias"]["status"] == "PASS"  # 69 < 70; 65 > 60
    # each measure fails on its own, at its own tolerance
    for metrics, failing in (({"worst_user_slowdown": 10.1}, "worst user"), ({"avg_slowdown": 5.01}, "avg slowdown"),
                             ({"max_wait_s": 1021.0}, "longest wait"), ({"user_jain_index": 0.489}, "Jain")):
        cell = checked(_fair_fake(**metrics), "fair_targets")["cases"][0]["cells"]["none_fair"]
        assert cell["status"] == "FAIL" and cell["value"] == failing
    within = {"max_wait_s": 1019.0, "user_jain_index": 0.491}
    assert checked(_fair_fake(**within), "fair_targets")["cases"][0]["cells"]["none_fair"]["status"] == "PASS"
    twin = checked(_fair_fake(twin_of="y"), "fair_targets")["cases"][0]["cells"]
    assert twin["none_capture"]["status"] == "n/a" and twin["none_jct"]["status"] == "PASS"


def test_the_pareto_table_marks_what_is_dominated():
    def row(variant, jct, worst):
        return {"variant": variant, "setting": "pen1", "metrics": {"avg_jct_s": jct, "worst_user_slowdown": worst}}
    result = {
        "settings": [{"key": "pen1", "label": "pen 1"}],
        "variants": [{"label": v, "preemptive": v != "multifactor"} for v in ("multifactor", "a", "b", "c")],
        "cases": [{"name": "x", "twin_of": None, "rows": [row("multifactor", 100, 10), row("a", 50, 20),
                                                           row("b", 60, 20), row("c", 120, 5)]}],
    }
    points = eval_report.pareto(result)["cases"]["pen1"]
    assert eval_report.pareto(result)["baseline"] == "multifactor"
    assert points["a"] == {"jct": 0.5, "worst_user": 2.0, "cases": 1, "dominated_by": []}
    assert points["b"]["dominated_by"] == ["a"]
    assert points["c"]["dominated_by"] == [] and points["multifactor"]["dominated_by"] == []
    assert "twins" not in eval_report.pareto(result)


def _fake(fifo: float, dike: float, oracle: float, tiresias: float) -> dict:
    base = {"p95_jct_s": 10.0, "worst_user_slowdown": 2.0, "lost_gpu_fraction": 0.01, "p99_preemptions_per_job": 1}
    rows = [{"variant": v, "setting": "pen1", "metrics": {**base, "avg_jct_s": jct}, "seeds": {}, "fifo_ratio": fifo / jct,
             "fifo_ratio_seeds": {}}
            for v, jct in (("fifo", fifo), ("dike", dike), ("srtf_preemptive", oracle), ("tiresias", tiresias))]
    return {"cases": [{"name": "x", "rows": rows}]}


def test_capture_and_tiresias_apply_only_where_the_oracle_gains_ten_percent():
    small = checked(_fake(100.0, 99.0, 95.0, 99.0), "targets")["cases"][0]["cells"]
    assert small["capture"]["status"] == "n/a" and small["tiresias"]["status"] == "n/a"
    # oracle 2x: dike 1.5x captures log 1.5 / log 2 = 58% (FAIL); tiresias/dike = 1.2 (PASS).
    big = checked(_fake(100.0, 100 / 1.5, 50.0, 80.0), "targets")["cases"][0]["cells"]
    assert big["capture"]["status"] == "FAIL" and big["capture"]["value"] == "58%"
    assert big["tiresias"]["status"] == "PASS"
    assert checked(_fake(100.0, 100 / 1.7, 50.0, 100 / 1.7 * 1.05), "targets")["cases"][0]["cells"]["capture"]["status"] == "PASS"
    assert checked(_fake(100.0, 100 / 1.7, 50.0, 100 / 1.7 * 1.05), "targets")["cases"][0]["cells"]["tiresias"]["status"] == "FAIL"
    assert checked(_fake(100.0, 102.0, 95.0, 99.0), "targets")["cases"][0]["cells"]["jct"]["status"] == "FAIL"


def test_files_tables_and_results_section(result, tmp_path):
    docs = tmp_path / "results.md"
    docs.write_text(f"# intro kept\n\n{eval_report.RESULTS_BEGIN}\nold\n{eval_report.RESULTS_END}\ntail kept\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old run", encoding="utf-8")
    table_list = eval_report.write_outputs(result, out, results_md=docs)
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "report.html", "results.md"]
    assert json.loads((out / "eval.json").read_text(encoding="utf-8"))["overall"] == json.loads(json.dumps(result["overall"]))
    text = docs.read_text(encoding="utf-8")
    assert text.startswith("# intro kept\n") and text.endswith("tail kept\n") and "\nold\n" not in text
    assert "Made by `test`" in text
    zeta = next(t for t in table_list if t.title == "case zeta")
    dike_row = next(r for r in zeta.rows if r[:2] == ["pen 1", "dike"])
    assert dike_row[-2:] == [f"{eval_report.row_of(result['cases'][0], 'dike', 'pen1')['fifo_ratio']:.3f}", "-"]
    overall_none = next(t for t in table_list if t.title.startswith("overall, pen 1 NONE"))
    assert [row[0] for row in overall_none.rows] == ["fifo", "tiresias", "dike"]
    assert any(t.title == "targets: dike at penalty 1 with none, half and every job preemptible" for t in table_list)
    fair = next(t for t in table_list if t.title.startswith("fair and never worse"))
    assert [row[0] for row in fair.rows] == ["zeta", "zeta-shuffled", "alpha", "alpha-shuffled"]
    assert any(t.title.startswith("shuffled twins, pen 1") for t in table_list)
    # multifactor did not run here: the frontier is against fifo
    assert any(t.title == "average JCT against worst-user slowdown, pen 1 NONE: geometric mean of policy/fifo"
               for t in table_list)
    assert "| " + " | ".join(dike_row) + " |" in text
    assert "<img src=\"data:image/svg+xml;base64," in (out / "report.html").read_text(encoding="utf-8")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return in_process.dike_slurm("eval", *args, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_a_case_missing_a_file_is_one_line_and_writes_nothing(corpus, tmp_path):
    broken = tmp_path / "corpus"
    make_case(broken / "good", 3)
    (broken / "bad").mkdir()
    (broken / "bad" / "sacct.txt").write_text((corpus / "alpha" / "sacct.txt").read_text(encoding="utf-8"))
    (broken / "bad" / "slurm.conf").write_text((corpus / "alpha" / "slurm.conf").read_text(encoding="utf-8"))
    with pytest.raises(InputError, match="missing topology.conf"):
        evaluate.find_cases([broken])
    out = tmp_path / "out"
    done = _cli(str(broken), "--quick", "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {broken / 'bad'}: case folder is missing topology.conf"]
    assert not out.exists()


def test_a_results_file_without_its_section_fails_before_any_replay(corpus, tmp_path):
    docs = tmp_path / "results.md"
    docs.write_text("# no markers\n", encoding="utf-8")
    out = tmp_path / "out"
    done = _cli(str(corpus / "alpha"), "--quick", "--out", str(out), "--results", str(docs))
    assert done.returncode == 2 and "has no generated section" in done.stderr
    assert not out.exists() and docs.read_text(encoding="utf-8") == "# no markers\n"


def test_the_targets_file_is_the_corpus_s_for_a_corpus_and_for_a_case_in_it(corpus):
    assert evaluate.make_plan([corpus], quick=True).targets_file == corpus / "targets.toml"
    assert evaluate.make_plan([corpus / "alpha"], quick=True).targets_file == (corpus / "targets.toml").resolve()
    assert evaluate.make_plan([corpus], quick=True).targets == TARGETS
    assert [t.key for t in TARGETS] == ["targets", "share_targets", "fair_targets"]


def test_without_a_targets_file_none_is_checked_and_it_says_so_and_a_missing_one_asked_for_is_one_line(
        corpus, tmp_path):
    bare = tmp_path / "bare"
    (bare / "alpha").mkdir(parents=True)
    for name in evaluate.CASE_FILES:
        (bare / "alpha" / name).write_bytes((corpus / "alpha" / name).read_bytes())
    plan = evaluate.make_plan([bare / "alpha"], quick=True)
    assert plan.targets == () and plan.targets_file is None
    assert plan.skipped[-1] == (f"targets: no targets.toml beside the cases ({bare / 'targets.toml'}): none checked "
                                "(--targets FILE names one)")
    named = evaluate.make_plan([bare / "alpha"], quick=True, targets=TARGETS_FILE)
    assert named.targets == TARGETS and named.targets_file == TARGETS_FILE
    out, missing = tmp_path / "out", tmp_path / "nowhere.toml"
    done = _cli(str(bare), "--quick", "--targets", str(missing), "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {missing}: no such file"]
    assert not out.exists()


@pytest.mark.parametrize(("text", "error"), [
    ("[[set]\n", "not valid TOML"),
    ("[[sets]]\n", "sets: unknown key (known: set)"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n', "set[0].criterion: expected one or more tables"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "all"\n', "set[0].cases: expected one of: 'as given', 'with twins'"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n[[set.criterion]]\nkey = "c"\nlabel = "c"\n'
     'kind = "faster"\npolicy = "dike"\nsetting = "pen1"\n', "set[0].criterion[0].kind: unknown kind 'faster'"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n[[set.criterion]]\nkey = "c"\nlabel = "c"\n'
     'kind = "jct_at_most"\npolicy = "dike"\nsetting = "pen1"\nbaseline = "fifo"\n',
     "set[0].criterion[0].factor: missing (kind jct_at_most needs baseline, factor)"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n[[set.criterion]]\nkey = "c"\nlabel = "c"\n'
     'kind = "jct_at_most"\npolicy = "dike"\nsetting = "pen2"\nbaseline = "fifo"\nfactor = 1.0\n',
     "set[0].criterion[0].setting: unknown setting 'pen2'"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n[[set.criterion]]\nkey = "c"\nlabel = "c"\n'
     'kind = "jct_at_most"\npolicy = "dike"\nsetting = "pen1"\nbaseline = "lifo"\nfactor = 1.0\n',
     "set[0].criterion[0].baseline: unknown policy 'lifo'"),
    ('[[set]]\nkey = "t"\ntitle = "t"\ncases = "as given"\n[[set.criterion]]\nkey = "c"\nlabel = "c"\n'
     'kind = "jct_at_most"\npolicy = "dike"\nsetting = "pen1"\nbaseline = "fifo"\nfactor = "1.01"\n',
     "set[0].criterion[0].factor: expected a finite number >= 0"),
])
def test_a_malformed_targets_file_is_one_line_naming_the_file_and_key(corpus, tmp_path, text, error):
    broken = tmp_path / "corpus"
    (broken / "alpha").mkdir(parents=True)
    for name in evaluate.CASE_FILES:
        (broken / "alpha" / name).write_bytes((corpus / "alpha" / name).read_bytes())
    (broken / "targets.toml").write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="^" + re.escape(f"{broken / 'targets.toml'}: {error}")):
        evaluate.make_plan([broken])
    done = _cli(str(broken), "--quick", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith(f"error: {broken / 'targets.toml'}: {error}")


def test_the_tables_follow_the_targets_file(result, tmp_path):
    text = TARGETS_FILE.read_text(encoding="utf-8").replace(
        'key = "jct"\nlabel = "avg JCT <= 1.01 fifo"', 'key = "jct"\nlabel = "avg JCT <= 0.5 fifo"').replace(
        "factor = 1.01\n", "factor = 0.5\n", 1)
    text += ('\n[[set]]\nkey = "added"\ntitle = "targets: a set added in the file"\ncases = "as given"\n'
             'note = "added"\n[[set.criterion]]\nkey = "lost"\nlabel = "lost GPU-h <= 100%"\nkind = "metric_bound"\n'
             'policy = "tiresias"\nsetting = "pen1"\nmetric = "lost_gpu_fraction"\nat_most = 1.0\nformat = ".1%"\n')
    (tmp_path / "targets.toml").write_text(text, encoding="utf-8")
    sets = targets.load_targets(tmp_path / "targets.toml", variants=[v.label for v in evaluate.VARIANTS],
                                settings=[s.key for s in evaluate.SETTINGS])
    again = json.loads(json.dumps(result))
    eval_report.check_targets(again, sets)
    assert [entry["cells"]["jct"]["status"] for entry in again["targets"]["cases"]] == ["FAIL", "FAIL"]
    assert [entry["cells"]["jct"]["value"] for entry in again["targets"]["cases"]] == [
        entry["cells"]["jct"]["value"] for entry in result["targets"]["cases"]]
    added = next(t for t in eval_report.tables(again) if t.title == "targets: a set added in the file")
    assert [row[0] for row in added.rows] == ["zeta", "alpha"] and all(row[1].startswith("PASS ") for row in added.rows)
    assert added.headers == ["case", "lost GPU-h <= 100%"] and added.notes == ["2 PASS, 0 FAIL. added"]


def test_quick_runs_penalty_one_with_the_three_policies(corpus, tmp_path):
    out = tmp_path / "out"
    done = _cli(str(corpus / "alpha"), "--quick", "--out", str(out), "--workers", "1", "--json")
    assert done.returncode == 0, done.stderr
    written = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    assert json.loads(done.stdout)["targets"] == written["targets"]
    labels = {(r["variant"], r["setting"]) for r in written["cases"][0]["runs"]}
    expected = {("fifo", "pen1"), ("dike", "pen1")}
    if not written["skipped_variants"]:
        expected.add(("srtf_preemptive", "pen1"))
    assert labels == expected
    assert written["command"].startswith("dike-slurm eval ") and "--quick" in written["command"]


def test_a_failing_report_keeps_the_numbers(result, tmp_path, monkeypatch):
    def broken(*_args):
        raise RuntimeError("no plot today")

    monkeypatch.setattr(eval_report, "render_html", broken)
    out = tmp_path / "out"
    eval_report.write_outputs(dict(result), out)
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "results.md"]
    written = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    assert written["html_error"] == "RuntimeError: no plot today"
    assert written["targets"] == json.loads(json.dumps(result["targets"]))


# ---------------------------------------------------------------------------------------- mixed GPU types


def make_mixed_case(folder: Path, seed: int) -> None:
    """A generated case on a cluster of two GPU types (n001 and n003 a100, n002 and n004 v100);
    the generator's jobs that ask for a100 may use only half of it."""
    make_case(folder, seed)
    conf = (folder / "slurm.conf").read_text(encoding="utf-8")
    nodes = "NodeName=n[001-004] Gres=gpu:a100:8 "
    assert nodes in conf
    (folder / "slurm.conf").write_text(conf.replace(
        nodes, "NodeName=n[002,004] Gres=gpu:v100:8 CPUs=64 RealMemory=512000 State=UNKNOWN\n"
               "NodeName=n[001,003] Gres=gpu:a100:8 "), encoding="utf-8")


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed")
    make_case(root / "plain", 4)
    make_mixed_case(root / "mixed", 4)
    (root / "targets.toml").write_bytes(TARGETS_FILE.read_bytes())
    return root


def test_mixed_gpu_cases_have_their_own_tables_and_the_invariant_is_counted(mixed_corpus):
    plan = evaluate.make_plan([mixed_corpus], quick=True)
    result = evaluate.evaluate(plan, evaluate.load_config(None), workers=1, command="test")
    mixed, plain, twin = result["cases"]  # folder order; only the one-type case has a twin
    assert (plain["name"], plain["heterogeneous"], plain["gpu_types"]) == ("plain", False, ["a100"])
    assert (twin["name"], twin["twin_of"], mixed["twin_of"]) == ("plain-shuffled", "plain", None)
    assert (mixed["name"], mixed["heterogeneous"], mixed["gpu_types"]) == ("mixed", True, ["a100", "v100"])
    # the overall means and the targets are the one-type cases'; the mixed ones have their own
    dike_plain = eval_report.row_of(plain, "dike", "pen1")["fifo_ratio"]
    dike_mixed = eval_report.row_of(mixed, "dike", "pen1")["fifo_ratio"]
    assert result["overall"]["dike"]["pen1"]["fifo"] == pytest.approx(
        {"geomean": dike_plain, "min": dike_plain, "max": dike_plain, "cases": 1})
    assert result["heterogeneous_overall"]["dike"]["pen1"]["fifo"]["geomean"] == pytest.approx(dike_mixed)
    assert [c["case"] for c in result["targets"]["cases"]] == [c["case"] for c in result["share_targets"]["cases"]] == [
        "plain"]
    invariant = result["gpu_type_invariant"]
    by_case = {c["case"]: c for c in invariant["cases"]}
    # the generator's a100 jobs are typed on either cluster: each of their starts was checked
    assert 0 < by_case["plain"]["typed_starts"] < by_case["plain"]["starts"]
    assert 0 < by_case["mixed"]["typed_starts"] <= by_case["mixed"]["starts"]
    assert by_case["mixed"]["starts"] == sum(r["starts"] for r in mixed["runs"]) and by_case["mixed"]["replays"] == len(
        mixed["runs"])
    assert invariant["violations"] == 0
    assert invariant["typed_starts"] == sum(case["typed_starts"] for case in by_case.values())
    titles = [t.title for t in eval_report.tables(result)]
    assert "mixed GPU generations, pen 1: geometric mean over the heterogeneous cases of baseline/policy avg " \
           "JCT (min-max)" in titles
    assert titles.index("case mixed") > titles.index(next(t for t in titles if t.startswith("invariant: no job runs on a GPU type")))
    overall_table = next(t for t in eval_report.tables(result) if t.title.startswith("overall, pen 1:"))
    assert overall_table.notes[0].startswith("1 cases;")
    # only mixed cases: no overall and no targets tables (they would be empty), the mixed ones and the invariant
    alone = dict(result, cases=[mixed], pareto=eval_report.pareto(dict(result, cases=[mixed])))
    eval_report.check_targets(alone, TARGETS)
    assert alone["pareto"] == {} and alone["fair_targets"]["cases"] == []
    alone["overall"] = eval_report.overall(alone)
    titles = [t.title for t in eval_report.tables(alone)]
    assert not [t for t in titles if t.startswith(("overall", "targets"))]
    assert titles[0].startswith("mixed GPU generations, pen 1:") and "case mixed" in titles


def test_the_evaluation_stops_when_the_simulator_breaks_the_invariant(mixed_corpus, monkeypatch):
    from dike_slurm.sim.kernel.cluster import SimCluster
    from dike_slurm.sim.kernel.cluster import WrongGpuType

    def ignore_types(self, partition, placement, gpu_types=()):
        return self.partition_masks.get(partition, self.all_nodes)  # a simulator that forgot the types

    monkeypatch.setattr(SimCluster, "allowed_mask", ignore_types)
    plan = evaluate.make_plan([mixed_corpus / "mixed"], only=("fifo",))
    with pytest.raises(WrongGpuType, match="asked for GPU types a100 and was started on n00[24] \\(v100\\)"):
        evaluate.evaluate(replace(plan, settings=plan.settings[-1:]), evaluate.load_config(None), workers=1)
