"""Result files and the markers that quote them (first hour, item 1)."""

import json

import pytest

from baton.core.errors import ConfigError
from baton.report.result_markers import hand_written, render
from baton.report.results import fmt, load, lookup, record


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("BATON_RESULTS_DIR", str(tmp_path))
    record("bench", {"speedup": 1.7834, "claims": [{"name": "a", "baton": -0.5723, "ci95": [-0.818, 0.004]}],
                     "rate": {"azure/code": 12.5}, "counts": {"direction only": 2}}, seconds=218.4, command="python benchmarks/x.py --record")
    return tmp_path


def test_a_record_holds_the_figures_with_command_commit_machine_and_time(results):
    data = json.loads((results / "bench.json").read_text())
    assert data["command"] == "python benchmarks/x.py --record" and data["seconds"] == 218.4
    assert data["commit"] and data["machine"]["cpus"] >= 1 and data["date"].endswith("Z")
    assert lookup(data, "claims.0.baton") == -0.5723 and lookup(data, "rate.azure/code") == 12.5
    assert lookup(data, "claims.a.ci95.1") == 0.004  # a list entry by its name
    assert fmt(lookup(data, "claims"), "len") == "1"
    assert lookup(data, "counts.direction_only") == 2  # a marker's path has no spaces
    with pytest.raises(ConfigError, match="no figure at 'claims.3.baton'"):
        lookup(data, "claims.3.baton")
    with pytest.raises(ConfigError, match="no such result file"):
        load("missing")


@pytest.mark.parametrize("value, spec, text", [(-0.5723, "pct", "-57.2%"), ((-0.818, 0.004), "ci", "[-81.8, +0.4]"),
                                               (218.4, "min", "3 min 38 s"), (1.7834, ".2f", "1.78"),
                                               (12345.6, ",.0f", "12,346"), (0.21, ".0%", "21%"),
                                               (1.7834, "ms", "1,783"), (0.0342, "ms.1", "34.2")])
def test_formats(value, spec, text):
    assert fmt(value, spec) == text


@pytest.mark.parametrize("value, spec, text", [(1.85, "meets-ge-1.8", "met"), (1.65, "meets-ge-1.8", "missed"),
                                               (1.8, "meets-ge-1.8", "met"), (40.0, "meets-le-40", "met"),
                                               (66.7, "meets-le-40", "missed"), (2048, "meets-lt-2048", "missed")])
def test_a_target_verdict_follows_the_figure(value, spec, text):
    assert fmt(value, spec) == text


@pytest.mark.parametrize("spec", ["meets-eq-1", "meets-ge", "meets-ge-x"])
def test_a_verdict_without_a_comparison_and_a_number_is_refused(spec):
    with pytest.raises(ConfigError, match="write meets-OP-NUMBER, OP one of ge, le, gt, lt"):
        fmt(1.0, spec)


def test_markers_are_filled_from_the_files_and_stale_text_is_replaced(results):
    page = ("Kairos: <!--r bench:claims.0.baton:pct-->-33%<!--/r--> "
            "<!--r bench:claims.0.ci95:ci-->[-114%, +47%]<!--/r--> in <!--r bench:seconds:min-->1 s<!--/r-->.")
    out = render(page)
    assert out == ("Kairos: <!--r bench:claims.0.baton:pct-->-57.2%<!--/r--> "
                   "<!--r bench:claims.0.ci95:ci-->[-81.8, +0.4]<!--/r--> in <!--r bench:seconds:min-->3 min 38 s<!--/r-->.")
    assert render(out) == out
    with pytest.raises(ConfigError, match="no figure"):
        render("<!--r bench:nope-->x<!--/r-->")


def test_a_figure_written_by_hand_in_a_measured_region_is_found():
    page = ("Outside: 12.5% is free text.\n<!--measured-->\nKairos <!--r bench:x:pct-->-57.2%<!--/r--> on "
            "Fig. 6 with 3 repeats of `--rate 2.5`, but also -33% and 1.78x and 19,366 and 0.91 by hand;"
            " see [the page](../a-1.5.md) for Llama-3.1-8B.\n<!--/measured-->")
    assert hand_written(page) == ["-33%", "1.78x", "19,366", "0.91"]


def test_each_table_renderer_writes_a_markdown_table(results):
    record("overhead", {"rows": {"baton": {"8": {"rps": 2655.3, "tok_s": 21242.0, "cpu_ms_per_req": 0.374,
                                                 "cpu_s_per_mtok": 46.73}},
                                 "vllm-router": {"8": {"rps": 3726.0, "tok_s": 29806.0, "cpu_ms_per_req": 0.101,
                                                       "cpu_s_per_mtok": 12.65}}}})
    table = render("<!--rt overhead:overhead-->\n<!--/rt-->")
    assert "| baton | 8 | 2,655 | 21,242 | 0.374 | 46.73 | 0.71x |" in table
    assert "paced" not in table  # a run before the paced shape
    record("overhead", {"rows": {}, "paced": {"baton": {"rps": 210.0, "tok_s": 107520.0, "cpu_ms_per_req": 3.48,
                                                        "cpu_s_per_mtok": 6.8}}})
    assert "| baton | 512 paced | 210 | 107,520 | 3.480 | 6.80 | - |" in render("<!--rt overhead:overhead-->\n<!--/rt-->")
    with pytest.raises(ConfigError, match="no table renderer 'nope'"):
        render("<!--rt overhead:nope-->\n<!--/rt-->")


def test_the_sustainable_rate_table_adds_the_first_systems_ratios(results):
    rate = lambda r: {"max_sustainable_rate_rps": r, "max_rate_status": "knee"}  # noqa: E731
    record("arrow", {"code": {"arrow": rate(44.6), "arrow-static": {**rate(20.0), "max_rate_status": "capped"}}})
    table = render("<!--rt arrow:sustainable-->\n<!--/rt-->")
    assert "| arrow-static | >= 20.0 |" in table and "| arrow / arrow-static | 2.23x |" in table


def test_a_figure_a_run_could_not_measure_is_recorded_as_null(results):
    record("gaps", {"rate": float("nan"), "rows": [1.0, float("inf")]})
    assert load("gaps")["figures"] == {"rate": None, "rows": [1.0, None]}


def test_a_repeat_without_a_steady_window_is_shown_not_averaged_as_zero(results):
    record("cache", {"sessions_colocated_kv_cost_max_rate_per_repeat": [12.22, None, None]})
    table = render("<!--rt cache:cache_rates-->\n<!--/rt-->")
    assert "| kv-cost | 12.22 (12.22, no steady window, no steady window) |" in table


def test_the_sweep_table_marks_points_without_a_steady_window(results):
    point = {"slo_attainment": 0.95, "mean_ttft_s": 0.0128, "steady": 1.0}
    record("sw", {"rates_rps": [200, 400], "policies": {"cascade": {
        "max_sustainable_rate_rps": 354.2, "max_rate_status": "knee",
        "points": [point, {**point, "slo_attainment": 0.5, "steady": 0.0}]}}})
    table = render("<!--rt sw:sweep-->\n<!--/rt-->")
    assert "| cascade | 354 | 95% / 12.8 | 50% / 12.8 * |" in table


def test_the_migration_table_gives_p99_changes_against_the_first_row(results):
    row = lambda p99, pre, mig, gb: {"p99_tpot_s": p99, "mean_tpot_s": 0.014, "preemptions": pre,  # noqa: E731
                                     "migrations": mig, "migration_bytes": gb * 1e9}
    record("mig", {"policies": {"pd-kv": row(0.040, 16.0, 0.0, 0),
                                "ares": {**row(0.030, 0.0, 917.0, 1394),
                                         "paired": {"p99_tpot_s": {"mean_diff": -0.01, "ci95": [-0.012, -0.008]}}},
                                "ares-none": {**row(0.041, 1.5, 10.0, 3),
                                              "paired": {"p99_tpot_s": {"mean_diff": 0.001, "ci95": [-0.002, 0.004]}}}}})
    table = render("<!--rt mig:migration-->\n<!--/rt-->")
    assert "| pd-kv | 40.0 | 14.0 | 16 | 0 | 0 |" in table
    assert "| ares | 30.0 (-25%) | 14.0 | 0 | 917 | 1,394 |" in table
    assert "| ares-none | 41.0 (~+3%) | 14.0 | 1.5 | 10 | 3 |" in table


def test_the_combined_table_gives_each_cells_difference_verdict_and_short_passes(results):
    record("comb", {"cells": {"reasoning@8": {"best_single": "arrow", "combined_minus_best": 0.21,
                                              "ci95": [0.12, 0.30], "verdict": "above (capped: see above)"}},
                    "rates": {"reasoning@8": {"arrow": [2.8, 2.82], "combined": [3.0, 3.04]}},
                    "unsteady": {"reasoning@8": {"sibyl": 1}}})
    table = render("<!--rt comb:combined-->\n<!--/rt-->")
    assert "| reasoning @ 8 | arrow 2.81 | 3.02 | +0.21 [+0.12, +0.30] | above | sibyl 1 |" in table


def test_the_ablation_table_gives_each_component_its_paired_difference_per_cell(results):
    cell = {"best_single": "arrow", "combined_minus_best": 0.6, "ci95": [0.4, 0.8], "verdict": "above",
            "minus_combined-no-deflect": [0.61, 0.46, 0.77], "minus_combined-no-flips": [0.0, 0.0, 0.0]}
    record("abl", {"cells": {"mooncake@8": cell, "mooncake@64": {k: cell[k] for k in list(cell)[:4]}},
                   "rates": {}})
    table = render("<!--rt abl:combined_ablations-->\n<!--/rt-->")
    assert "| component off (combined minus the ablation, paired, req/s) | mooncake @ 8 |" in table
    assert "| deflection | +0.61 [+0.46, +0.77] |" in table
    assert "| flips | 0.00 (identical rates) |" in table
    assert "| prefix-aware placement | - |" in table  # an ablation the run did not have
    assert "@ 64" not in table  # a cell without ablations gets no column


def test_a_rate_below_the_lowest_swept_is_shown_as_below_it(results):
    f = {"prefix_cache_hit_rate": 0.2, "p50_ttft_s": 1.0, "p95_ttft_s": 2.0, "load_cv": 1.1,
         "max_rate_per_repeat": [0.5, 3.0], "max_rate_status_per_repeat": ["below range", "knee"]}
    figures = {f"{col}_{p.replace('-', '_')}_{k}": v for col in ("mooncake", "mooncake_pd")
               for p in ("round-robin", "least-loaded", "prefix-precise", "prefix-approx", "kv-cost", "cache-aware")
               for k, v in f.items()}
    record("moon", figures)
    table = render("<!--rt moon:cache_mooncake-->\n<!--/rt-->")
    assert "| 3.00 (< 0.50, 3.00) |" in table  # the mean leaves out the repeat below the range


def test_the_decode_bound_and_vidur_tables(results):
    record("db", {"requests": 6000, "80": {"arrow": {"slo_attainment": 0.263, "role_changes": 44,
                                                     "waited_for_blocks": 0.041, "p50_block_wait_s": 3.04,
                                                     "p50_ttft_s": 6.31, "steady": False}}})
    assert "| 80 | arrow | 0.263 | 44 | 4.1% (3.0 s) | 6.31 | no |" in render("<!--rt db:decode_bound-->\n<!--/rt-->")
    case = {"case": "70b-light", "load": None, "ttft_mape": 0.051, "tpot_mape": 0.007, "e2e_mape": 0.008,
            "speedup_whole": 7.9, "speedup_in_process": 9.0,
            **{f"{k}_p{q}_ratio": 0.95 for k in ("ttft", "e2e") for q in (50, 90, 99)}}
    record("vid", {"vidur_cases": [case]})
    assert ("| `70b-light` | light | 5.1% | 0.95 / 0.95 / 0.95 | 0.7% | 0.8% | 0.95 / 0.95 / 0.95 | 7.9x / 9.0x |"
            in render("<!--rt vid:vidur-->\n<!--/rt-->"))


def test_the_decisions_table_has_a_column_per_size(results):
    record("dec", {f"decision_{p}_{n}_{q}_us": v for p in ("prefix_precise", "prefix_approx", "kv_cost", "cache_aware")
                   for n in (64, 1024) for q, v in (("median", 41.25), ("p99", 152.4))})
    table = render("<!--rt dec:decisions-->\n<!--/rt-->")
    assert "| `kv-cost` | 41.2 / 152 | 41.2 / 152 |" in table and "1,024 instances" in table


def test_the_cascade_regime_tables(results):
    figures = {"sharegpt_colocated_rr_max_rate_per_repeat": [654.1, 661.6],
               "sharegpt_colocated_rr_max_rate_status": ["knee", "knee"],
               "sharegpt_cascade_max_rate_per_repeat": [313.6, 300.0],
               "sharegpt_cascade_max_rate_status": ["knee", "below range"],
               "sharegpt_cascade_guarded_max_rate_per_repeat": [329.1, 350.0]}
    for key in ("heavy_256", "heavy_1024", "sessions"):
        figures.update({f"{key}_colocated_rr_throughput_rps": 588.8, f"{key}_cascade_throughput_rps": 545.9,
                        f"{key}_cascade_guarded_throughput_rps": 581.3, f"{key}_cascade_guarded_throughput_over_rr": 0.987})
    record("cr", figures)
    rates = render("<!--rt cr:cascade_rates-->\n<!--/rt-->")
    assert "| `cascade` | 313.60 (313.60, < 300.00) |" in rates
    assert "| ShareGPT-like, `max_num_seqs` 256 | 588.8 | 545.9 | 581.3 | 0.99x |" in render(
        "<!--rt cr:cascade_throughput-->\n<!--/rt-->")


def test_the_real_fidelity_table_has_a_row_per_case_that_ran(results):
    def case(mape, **extra):
        return {"ttft_mape": mape, "tpot_mape": mape, "e2e_mape": mape, "e2e_p50_ratio": 0.98, "e2e_p90_ratio": 0.95,
                "e2e_p99_ratio": 0.9, "failed": 0, **extra}
    record("real", {"real": {"loaded": {"cases": {"70": case(0.05, rate_rps=0.19)},
                                        "prefix": case(0.1, rate_rps=0.25, target_rps=0.19),
                                        "fleet": {"rate_rps": 0.38, "colocated": case(0.11), "pd": case(0.2)}}}})
    table = render("<!--rt real:real_fidelity-->\n<!--/rt-->")
    assert "| one instance, 70% load | 0.19 | 5.0% | 5.0% | 5.0% | 0.98 / 0.95 / 0.90 | 0 |" in table
    assert "| one instance, sessions with prefix caching | 0.25 (target 0.19) |" in table
    assert "| two instances, least-loaded | 0.38 | 11.0% |" in table and "round-robin" not in table
    assert "| 1 prefill + 1 decode (ExampleConnector) | 0.38 | 20.0% |" in table


def test_a_record_names_the_commit_its_run_started_at(results, tmp_path, monkeypatch):
    """A commit that lands while a long run goes on is not the run's code."""
    import subprocess
    import time

    from baton.report import results as module
    repo = tmp_path / "repo"
    repo.mkdir()
    now = int(time.time())

    def commit(message: str, at: int) -> str:
        env = {"GIT_AUTHOR_DATE": f"{at} +0000", "GIT_COMMITTER_DATE": f"{at} +0000", "GIT_AUTHOR_NAME": "t",
               "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", message], cwd=repo, env=env, check=True)
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    before, during = commit("before the run", now - 1000), commit("during the run", now - 10)
    monkeypatch.setattr(module, "ROOT", repo)
    assert module.run_commit(100.0) == before
    assert module.run_commit(1.0) == during and module.run_commit(None) == during
    assert json.loads(record("long", {"x": 1}, seconds=100.0).read_text())["commit"] == before


def test_the_predictor_tables_sort_by_mae_and_split_by_generated_tokens(results):
    bucket = lambda g, n, t, a, b: {"generated": g, "samples": n, "true_mean": t,  # noqa: E731
                                    "mlp_last_mae": a, "mlp_last_mean": a + 100, "mean_mae": b, "mean_mean": 256.0}
    record("pred", {"mae_tokens": {"mean": 256.0, "mlp_last": 220.8}, "requests": {"test": 195},
                    "mae_ci95": {"mean": [245.9, 265.4], "mlp_last": [201.94, 238.9]},
                    "mae_split_at_512": {"mean": [292.0, 152.0], "mlp_last": [244.2, 153.4]},
                    "by_generated": [bucket("0-0", 195, 222.0, 137.0, 299.0), bucket("512-1023", 1200, 256.0, 153.0, 152.0)]})
    mae = render("<!--rt pred:predictor_mae-->\n<!--/rt-->")
    assert mae.index("`mlp_last`") < mae.index("`mean`")  # best first
    assert "| `mlp_last` (last-layer hidden state) | 220.8 | 201.9-238.9 | 244 | 153 |" in mae
    assert "test split, 195 requests" in mae
    by = render("<!--rt pred:predictor_by_generated-->\n<!--/rt-->")
    assert "| g | 0-0 | 512-1023 |" in by
    assert "| `mlp_last` | 137 (237) | 153 (253) |" in by
    assert "| `survival`" not in by  # a predictor the run did not have gets no row
    assert "| samples | 195 | 1,200 |" in by


def test_the_deflection_table_gives_max_rates_deflected_shares_and_points(results):
    pt = lambda ttft, slo, tbt, share, steady=1.0: {"p95_ttft_s": ttft, "slo_attainment": slo,  # noqa: E731
                                                    "p95_tbt_s": tbt, "deflected_fraction": share, "steady": steady}
    record("kai", {"rates_rps": [3, 6, 8], "policies": {
        "pd": {"max_sustainable_rate_rps": 3.5, "max_rate_status": "knee", "target_attainment": 0.9,
               "points": [pt(4.4, 0.915, 0.009, 0.0), pt(8.37, 0.773, 0.010, 0.0), pt(9.94, 0.703, 0.011, 0.0)]},
        "kairos": {"max_sustainable_rate_rps": 8.0, "max_rate_status": "capped", "target_attainment": 0.9,
                   "points": [pt(0.77, 0.974, 0.065, 0.30), pt(5.57, 0.923, 0.075, 0.34),
                              pt(7.48, 0.856, 0.080, 0.35, 0.0)]}}})
    table = render("<!--rt kai:deflection-->\n<!--/rt-->")
    assert "| policy | max rate at 90% (req/s) | deflected at 6 req/s | P95 TBT ms | 3 req/s (P95 TTFT s / SLO %) | 6 req/s | 8 req/s |" in table
    assert "| `pd` | 3.5 | 0% | 9-11 | 4.40 / 92 | 8.37 / 77 | 9.94 / 70 |" in table
    assert "| `kairos` | >= 8.0 | 34% | 65-80 | 0.77 / 97 | 5.57 / 92 | 7.48 / 86 * |" in table
