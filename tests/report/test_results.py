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
