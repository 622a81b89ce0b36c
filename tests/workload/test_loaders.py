import json

import numpy as np
import pytest

from baton.core.errors import WorkloadError
from baton.workload import (SyntheticSpec, clip_window, detect_format, generate, load_trace,
                            mean_rate_rps, reasoning_spec, scale_to_rate)
from baton.workload.synthetic import gamma_arrivals


def test_azure_csv(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:48.1805900,10,2\n")
    reqs = load_trace(f)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(374, 44), (10, 2)]
    assert reqs[0].arrival_s == 0.0 and abs(reqs[1].arrival_s - 1.5) < 1e-6


@pytest.mark.parametrize("body,where", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n2023-11-16 18:15:47,abc,3\n", ":3: ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", ":2: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n", ":2: expected 3 columns"),
])
def test_malformed_azure_names_file_and_line(tmp_path, body, where):
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(WorkloadError, match=f"bad.csv{where}"):
        load_trace(f)


def test_mooncake_jsonl_and_bad_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
                 '{"timestamp": 2500, "input_length": 20, "output_length": 7, "hash_ids": [1]}\n')
    reqs = load_trace(f)
    assert reqs[1].arrival_s == 2.5 and reqs[1].prompt_tokens == 20
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n{not json}\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl:2: invalid JSON"):
        load_trace(f)


def test_burstgpt_sharegpt_vidur(tmp_path):
    b = tmp_path / "b.csv"
    b.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,100,20,120,Conversation log\n")
    assert detect_format(b) == "burstgpt" and load_trace(b)[0].output_tokens == 20
    s = tmp_path / "s.json"
    s.write_text(json.dumps([{"input_len": 12, "output_len": 3}, {"prompt_len": 5, "output_len": 9}]))
    with pytest.raises(WorkloadError, match="no arrival times .columns found: input_len, output_len"):
        load_trace(s)  # never silently all at t=0
    reqs = load_trace(s, arrivals="uniform:2")
    assert [r.prompt_tokens for r in reqs] == [12, 5] and [r.arrival_s for r in reqs] == [0.0, 0.5]
    s.write_text(json.dumps([{"input_len": 12}]))
    with pytest.raises(WorkloadError, match="item 0"):
        load_trace(s)
    v = tmp_path / "v.csv"
    v.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,300,40\n0.1,10,4\n")
    assert [r.prompt_tokens for r in load_trace(v)] == [10, 300]


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(WorkloadError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="cannot tell the trace format"):
        load_trace(f)


def test_real_traces_load(traces_dir):
    assert len(load_trace(traces_dir / "azure_conv_2023.csv")) == 19366
    assert len(load_trace(traces_dir / "azure_code_2023.csv")) == 8819
    assert len(load_trace(traces_dir / "mooncake_conversation.jsonl")) == 12031


def test_rate_scaling_and_clipping():
    reqs = generate(SyntheticSpec(requests=500, rate_rps=3.0), np.random.default_rng(0))
    scaled = scale_to_rate(reqs, 12.0)
    assert abs(mean_rate_rps(scaled) - 12.0) < 1e-9
    window = clip_window(scaled, 5.0, 10.0)
    assert window and all(0 <= r.arrival_s < 5.0 for r in window)


def test_gamma_arrivals_have_the_asked_cv():
    gaps = np.diff(gamma_arrivals(200_000, 10.0, 3.0, np.random.default_rng(1)))
    assert abs(gaps.mean() - 0.1) < 0.003 and abs(gaps.std() / gaps.mean() - 3.0) < 0.1


def test_reasoning_workload_shape():
    out = np.array([r.output_tokens for r in generate(reasoning_spec(20_000, 5.0), np.random.default_rng(0))])
    assert abs((out == 8192).mean() - 0.30) < 0.02
    assert 4500 < out.mean() < 5500 and out.max() == 8192


def test_jsonl_time_keys_have_their_units(tmp_path):
    """timestamp is milliseconds (Mooncake); arrival_s and arrived_at are seconds."""
    for key, value, want in (("timestamp", 2500, 2.5), ("arrival_s", 2.5, 2.5), ("arrived_at", 2.5, 2.5)):
        f = tmp_path / f"{key}.jsonl"
        f.write_text(json.dumps({key: 0, "input_length": 5, "output_length": 2}) + "\n"
                     + json.dumps({key: value, "input_length": 7, "output_length": 2}) + "\n")
        assert detect_format(f) == "mooncake"
        assert load_trace(f)[1].arrival_s == pytest.approx(want), key


def test_traces_without_arrival_times_need_arrivals(tmp_path):
    v = tmp_path / "v.csv"
    v.write_text("num_prefill_tokens,num_decode_tokens\n300,40\n10,4\n")
    with pytest.raises(WorkloadError, match="no arrival times .columns found: num_prefill_tokens,num_decode_tokens"):
        load_trace(v)
    reqs = load_trace(v, arrivals="poisson:4", seed=1)
    assert [r.prompt_tokens for r in reqs] == [300, 10] and reqs[1].arrival_s > 0
    j = tmp_path / "j.jsonl"
    j.write_text(json.dumps({"input_length": 5, "output_length": 2}) + "\n")
    with pytest.raises(WorkloadError, match="--arrivals"):
        load_trace(j)
    with pytest.raises(WorkloadError, match="has arrival times"):
        load_trace(_timed(tmp_path), arrivals="uniform:1")
    with pytest.raises(WorkloadError, match="poisson:R or uniform:R"):
        load_trace(v, arrivals="bursty:3")
    with pytest.raises(WorkloadError, match="is a directory"):
        load_trace(tmp_path)


def _timed(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,3,4\n")
    return f


def test_vidur_request_metrics(tmp_path):
    """Vidur's output: arrivals are the running sum of inter-arrival delays, ids are Vidur's."""
    f = tmp_path / "request_metrics.csv"
    f.write_text("Request Id,request_e2e_time,request_inter_arrival_delay,request_num_tokens,"
                 "request_num_prefill_tokens,request_num_decode_tokens\n"
                 "0,2.3,,352,319,33\n1,7.1,1.5,1113,1011,102\n2,18.9,0.25,2854,2594,260\n")
    assert detect_format(f) == "vidur-metrics"
    reqs = load_trace(f)
    assert [(r.req_id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0, 0.0, 319, 33), (1, 1.5, 1011, 102), (2, 1.75, 2594, 260)]
    v = tmp_path / "v.csv"
    v.write_text("num_prefill_tokens,num_decode_tokens\n319,33\n")
    with pytest.raises(WorkloadError, match="no arrival times"):
        load_trace(v, "vidur")  # --format vidur still requires arrived_at


def test_json_is_detected_by_content_and_a_csv_format_on_json_is_named(tmp_path):
    f = tmp_path / "trace.txt"
    f.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 2}) + "\n")
    assert detect_format(f) == "mooncake"
    with pytest.raises(WorkloadError, match="is JSON .lines., but --format azure expects CSV columns "
                                            "TIMESTAMP,ContextTokens,GeneratedTokens"):
        load_trace(f, "azure")
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(WorkloadError, match="expected columns per format: azure: TIMESTAMP"):
        load_trace(odd)


def test_a_yaml_trace_path_is_relative_to_the_yaml(tmp_path):
    from baton.experiments import load_experiment
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,3,4\n")
    (tmp_path / "exp.yaml").write_text("workload: {trace: data/t.csv}\n")
    exp = load_experiment(tmp_path / "exp.yaml")
    assert exp.workload.trace == str(tmp_path / "data" / "t.csv")
    assert len(exp.workload.load(0)) == 1


def test_column_mapping_reads_any_csv_or_jsonl(tmp_path):
    from baton.workload.loaders import parse_columns
    cols = parse_columns("time=ts,prompt=in,output=out")
    c = tmp_path / "c.csv"
    c.write_text("ts,in,out\n1000,30,5\n1500,40,6\n")
    assert [(r.arrival_s, r.prompt_tokens) for r in load_trace(c, columns=cols, time_unit="ms")] == [(0.0, 30), (0.5, 40)]
    j = tmp_path / "j.jsonl"
    j.write_text(json.dumps({"ts": 2, "in": 3, "out": 4}) + "\n" + json.dumps({"ts": 5, "in": 6, "out": 7}) + "\n")
    assert [r.arrival_s for r in load_trace(j, columns=cols)] == [0.0, 3.0]
    with pytest.raises(WorkloadError, match="no column 'nope'"):
        load_trace(c, columns={"prompt": "in", "output": "out", "time": "nope"})
    with pytest.raises(WorkloadError, match="prompt=COL and output=COL"):
        parse_columns("time=ts")


def test_class_columns_give_each_request_its_priority_tenant_and_slos(tmp_path):
    from baton.core.errors import WorkloadError
    from baton.workload.loaders import load_trace, parse_columns
    trace = tmp_path / "classes.csv"
    trace.write_text("ts,in,out,band,team,ttft_ms\n0,100,10,1,web,500\n1000,200,20,,batch,\n")
    cols = parse_columns("time=ts,prompt=in,output=out,priority=band,tenant=team,ttft_slo_ms=ttft_ms")
    a, b = load_trace(trace, columns=cols, time_unit="ms")
    assert (a.priority, a.tenant, a.ttft_slo_s, a.tpot_slo_s) == (1, "web", 0.5, None)
    assert (b.priority, b.tenant, b.ttft_slo_s, b.arrival_s) == (0, "batch", None, 1.0)  # empty cells: defaults
    trace.write_text("ts,in,out,band\n0,100,10,high\n")
    with pytest.raises(WorkloadError, match=r"classes.csv:2: column 'band' \(priority\): expected an integer"):
        load_trace(trace, columns=parse_columns("time=ts,prompt=in,output=out,priority=band"))
    with pytest.raises(WorkloadError, match="--columns: expected"):
        parse_columns("time=ts,prompt=in,output=out,colour=c")


def test_a_window_of_a_trace_starts_at_zero_numbered_from_zero_and_keeps_its_gaps():
    from baton.workload.transform import window
    reqs = generate(SyntheticSpec(requests=50, rate_rps=3.0), np.random.default_rng(0))
    part = window(reqs, 10, 20)
    assert [r.req_id for r in part] == list(range(20)) and part[0].arrival_s == 0.0
    assert [r.prompt_tokens for r in part] == [r.prompt_tokens for r in reqs[10:30]]
    assert np.allclose(np.diff([r.arrival_s for r in part]), np.diff([r.arrival_s for r in reqs[10:30]]))
    assert len(window(reqs, 40, 20)) == 10 and window(reqs, 60, 5) == []  # fewer where the trace ends
