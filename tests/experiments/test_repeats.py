"""Repeats: seeds or disjoint trace windows, paired differences with t intervals."""


import numpy as np
import pytest
from scipy import stats

from baton.core.errors import ConfigError
from baton.experiments import Experiment, WorkloadConfig
from baton.experiments.repeats import combine, includes_zero, repeat_workloads, thin_percentiles
from baton.report.table import table_rows
from baton.workload import SyntheticSpec


def test_paired_difference_and_student_t_interval():
    a = [{"p99_tpot_s": x} for x in (10.0, 12.0, 11.0, 13.0)]
    b = [{"p99_tpot_s": x} for x in (11.0, 14.0, 12.0, 15.0)]  # differences 1, 2, 1, 2
    means, paired = combine({"a": a, "b": b})
    assert means["b"]["p99_tpot_s"] == 13.0 and means["b"]["repeats"] == 4
    entry = paired["b"]["p99_tpot_s"]
    d = np.array([1.0, 2.0, 1.0, 2.0])
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert entry["mean_diff"] == 1.5 and entry["ci95"] == pytest.approx([1.5 - half, 1.5 + half])
    assert not includes_zero(entry)  # a consistent difference: no ~
    _, paired = combine({"a": a, "c": [{"p99_tpot_s": x} for x in (12.0, 11.0, 13.0, 10.0)]})
    assert includes_zero(paired["c"]["p99_tpot_s"])
    rows = dict(table_rows({"a": means["a"], "c": {"p99_tpot_s": 11.5}}, paired))
    assert "~" in " ".join(rows["c"])


def test_percentiles_on_too_few_samples_are_flagged():
    warned = " ".join(thin_percentiles({"tpot_samples": 1000, "ttft_samples": 1000}))
    assert "p99_tpot_s" in warned and "p99_9_tpot_s" in warned and "p95_ttft_s" not in warned
    assert thin_percentiles({"tpot_samples": 30000, "ttft_samples": 30000}) == []


def test_synthetic_repeats_use_consecutive_seeds():
    exp = Experiment(workload=WorkloadConfig(synthetic=SyntheticSpec(requests=50)), seed=4)
    loads = repeat_workloads(exp, 3)
    assert [s for s, _ in loads] == [4, 5, 6]
    assert loads[0][1] != loads[1][1] and all(len(r) == 50 for _, r in loads)


def test_trace_windows_are_consecutive_and_disjoint(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{i * 0.5},{100 + i},{10}\n" for i in range(30)))
    exp = Experiment(workload=WorkloadConfig(trace=str(path), requests=10))
    windows = repeat_workloads(exp, 3)
    prompts = [[r.prompt_tokens for r in reqs] for _, reqs in windows]
    assert prompts == [list(range(100 + 10 * k, 110 + 10 * k)) for k in range(3)]
    assert all(reqs[0].arrival_s == 0.0 for _, reqs in windows)
    with pytest.raises(ConfigError, match="needs 40 requests; the trace has 30"):
        repeat_workloads(exp, 4)
    with pytest.raises(ConfigError, match="--requests N"):
        repeat_workloads(Experiment(workload=WorkloadConfig(trace=str(path))), 2)
    (_, whole), = repeat_workloads(Experiment(workload=WorkloadConfig(trace=str(path))), 1)
    assert len(whole) == 30  # compare on a whole trace: one repeat needs no window size


def test_thin_tails_fold_into_one_line_with_the_fewest_samples_per_policy():
    from baton.experiments.repeats import thin_tails_line

    line = thin_tails_line({"a": [{"tpot_samples": 1000, "ttft_samples": 30000}, {"tpot_samples": 500}],
                            "b": [{"tpot_samples": 1500, "ttft_samples": 30000}]})
    assert line is not None and "\n" not in line
    assert "p99_tpot_s (a 5.0, b 15.0)" in line and "p99_9_tpot_s (a 0.5, b 1.5)" in line
    assert "ttft" not in line
    assert thin_tails_line({"a": [{"tpot_samples": 30000, "ttft_samples": 30000}]}) is None
    same = thin_tails_line({"a": [{"tpot_samples": 1000}], "b": [{"tpot_samples": 1000}]})
    assert "p99_tpot_s (10.0 for every policy)" in same


def test_rejections_are_named_per_policy_with_their_reasons_and_kept_in_the_csv():
    from baton.experiments.comparison import comparison_rows
    from baton.experiments.repeats import dropped_line
    runs = {"least-loaded": [{"requests": 1000, "rejected": 83, "rejected_context": 80, "rejected_shed": 3}] * 2,
            "sibyl": [{"requests": 1000, "rejected": 1, "rejected_context": 1}] * 2,  # 0.1%: not named
            "arrow": [{"requests": 1000, "rejected": 0}] * 2}
    line = dropped_line(runs)
    assert line == "requests rejected (counted as SLO misses): least-loaded 166 of 2000 (8.3%: context 160, shed 6)"
    assert dropped_line({"arrow": runs["arrow"]}) is None
    header, rows = comparison_rows(runs)
    by_policy = {row[0]: dict(zip(header, row)) for row in rows}
    assert by_policy["least-loaded"]["rejected_context"] == "80" and by_policy["arrow"]["rejected_context"] == "0"
    assert by_policy["sibyl"]["rejected_shed"] == "0" and "rejected_shed_diff_ci95_lo" in header


def test_runs_without_a_steady_window_are_counted_in_one_warning_line():
    from baton.experiments.repeats import unsteady_line
    runs = {"a": [{"steady": 1.0, "steady_needed_s": 60.0}, {"steady": 0.0, "steady_needed_s": 84.0}],
            "b": [{"steady": 0.0, "steady_needed_s": 60.0}] * 2}
    line = unsteady_line(runs)
    assert line.startswith("3 of 4 runs had no steady window (a 1, b 2)") and "about 84 s" in line
    assert unsteady_line({"a": [{"steady": 1.0}], "old": [{}]}) is None  # steady, or predating the key


def test_skip_holds_out_a_trace_window_for_one_run_and_for_repeats(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{i * 0.5},{100 + i},{10}\n" for i in range(30)))
    one = WorkloadConfig(trace=str(path), requests=5, skip=12).load(0)
    assert [r.prompt_tokens for r in one] == list(range(112, 117))
    assert [r.req_id for r in one] == list(range(5)) and one[0].arrival_s == 0.0 and one[1].arrival_s == 0.5
    windows = repeat_workloads(Experiment(workload=WorkloadConfig(trace=str(path), requests=5, skip=20)), 2)
    assert [[r.prompt_tokens for r in reqs][0] for _, reqs in windows] == [120, 125]  # after the held-out part
    with pytest.raises(ConfigError, match="needs 15 requests; the trace has 10"):
        repeat_workloads(Experiment(workload=WorkloadConfig(trace=str(path), requests=5, skip=20)), 3)
    with pytest.raises(ConfigError, match="skip 30: the trace .* has only 30 requests"):
        WorkloadConfig(trace=str(path), skip=30).load(0)
    with pytest.raises(ConfigError, match="only a trace's requests can be skipped"):
        WorkloadConfig(skip=3).load(0)
