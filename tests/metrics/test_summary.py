"""Steady-window metrics, the optimal-assignment ratio and the per-request breakdown."""

import math

import pytest

from baton.core.request import Request
from baton.metrics import SLO
from baton.metrics.records import RequestRecord
from baton.metrics.summary import Window, window_metrics
from baton.sim import ClusterSpec, EngineConfig
from tests.sim.helpers import run, tiny_perf
from tests.sim.test_handoff import CLUSTER, Fixed, sched


def rec(i, arrival, ttft=0.1, tpot=0.01, out=11, finished=True):
    e2e = ttft + tpot * (out - 1) if finished else math.nan
    return RequestRecord(i, arrival, 100, out, finished, "" if finished else "rejected",
                         ttft if finished else math.nan, tpot if finished else math.nan, e2e,
                         math.nan, 0.0, math.nan, math.nan, math.nan, math.nan, 0, 0, "0-1")


def test_window_leaves_out_warmup_and_drain():
    records = [rec(i, float(i)) for i in range(101)]           # one arrival a second, 0..100
    records.append(rec(101, 100.0, ttft=5000.0))               # stalls long after the last arrival
    w = Window.of(records)
    assert (w.start_s, w.end_s) == (10.0, 100.0)               # 10% warm-up, ends at the last arrival
    m = window_metrics(records, SLO(ttft_s=1.0, tpot_s=0.05), w)
    assert m["window_requests"] == 92
    assert m["slo_attainment"] == pytest.approx(91 / 92)       # the stalled one misses
    assert m["goodput_rps"] == pytest.approx(91 / 90)
    # tokens made inside the window: 11 per request for those that arrived in it and ended
    # by t=100, nothing from the stalled one (its first token comes at t=5100)
    assert m["throughput_tok_s"] == pytest.approx((11 * 90 + 11 * 0.9 + 11 * 0.1 + 11 * 0.5) / 90, rel=0.02)


def test_unfinished_and_rejected_requests_count_as_misses():
    records = [rec(0, 0.0), rec(1, 5.0), rec(2, 6.0, finished=False), rec(3, 10.0)]
    m = window_metrics(records, SLO(1.0, 0.05), Window(0.0, 10.0))
    assert m["slo_attainment"] == pytest.approx(3 / 4)


def test_explicit_warmup():
    records = [rec(i, float(i)) for i in range(11)]
    assert Window.of(records, warmup_s=4.0) == Window(4.0, 10.0)
    assert Window.of(records, warmup_s=50.0) == Window(10.0, 10.0)


def test_oar_leaves_the_request_itself_out_of_its_instance():
    """Request 1 starts decoding alone on instance 1 while instance 2 holds request 0.
    Counting itself, instance 1 (1,000 tokens) looks heavier than instance 2 (~600):
    a miss. Without itself it is empty: the least loaded, a hit."""

    class Alternate(Fixed):
        def choose_decode(self, view, request):
            return 2 if request.req_id == 0 else 1

    perf, s = sched(lambda c: Alternate(c))
    reqs = [Request(0, 0.0, 500, 400), Request(1, 0.3, 1000, 50)]
    _, res = run(reqs, cluster=CLUSTER, perf=perf, scheduler=s)
    summary = res.summary(SLO())
    assert summary["oar_tokens"] == 1.0 and summary["oar_count"] == 1.0
    assert res.counters.decode_starts == 2


def test_breakdown_columns_add_up():
    perf, s = sched(lambda c: Fixed(c))
    _, res = run([Request(0, 0.0, 480, 5)], cluster=CLUSTER, perf=perf, scheduler=s)
    r = res.records[0]
    assert r.queue_s == 0.0 and r.prefill_s > 0 and r.transfer_s > 0 and r.decode_wait_s > 0
    assert r.receive_wait_s == 0.0  # its blocks were free at once
    assert r.ttft_s == pytest.approx(r.queue_s + r.prefill_s + r.receive_wait_s + r.transfer_s + r.decode_wait_s)
    assert r.e2e_s == pytest.approx(r.ttft_s + r.decode_s)
    cluster = ClusterSpec(prefill=0, decode=0, mixed=1, engine=EngineConfig(512, 32, 16))
    _, res = run([Request(0, 0.0, 300, 5)], "colocated", cluster=cluster, perf=tiny_perf())
    assert res.records[0].decode_wait_s == 0.0 and math.isnan(res.records[0].transfer_s)


@pytest.mark.parametrize("summary, resource", [
    ({"slo_attainment": 0.2, "p50_ttft_s": 30.0, "p50_queue_s": 29.0, "p50_decode_wait_s": 0.1,
      "preemptions": 0, "requests": 100}, "prefill capacity"),
    ({"slo_attainment": 0.3, "p50_ttft_s": 3.0, "p50_queue_s": 0.1, "p50_decode_wait_s": 0.2,
      "preemptions": 50, "requests": 100}, "KV memory"),
    ({"slo_attainment": 0.4, "p50_ttft_s": 30.0, "p50_queue_s": 0.1, "p50_decode_wait_s": 25.0,
      "preemptions": 0, "requests": 100}, "decode slots"),
])
def test_overload_names_the_saturated_resource(summary, resource):
    from baton.metrics.summary import overload
    assert resource in overload(summary, SLO(ttft_s=2.0, tpot_s=0.1))


def test_no_overload_warning_for_a_healthy_run():
    from baton.metrics.summary import overload
    assert overload({"slo_attainment": 0.97, "p50_ttft_s": 0.3}, SLO()) is None


def test_class_figures_judge_each_request_by_its_own_slos():
    from dataclasses import replace

    from baton.metrics.summary import class_metrics
    # band 1 (tenant i): TTFT SLO 0.2 s of its own; band 0 (tenant b): the run's 1 s
    fast = [replace(rec(k, float(k), ttft=0.15 + 0.1 * (k == 3)), priority=1, tenant="i", ttft_slo_s=0.2)
            for k in range(4)]
    slow = [replace(rec(4 + k, float(k), ttft=0.5), tenant="b") for k in range(3)]
    shed = replace(rec(7, 2.0, finished=False), tenant="b", reject_reason="shed")
    m = class_metrics(fast + slow + [shed], SLO(1.0, 0.05), Window(0.0, 4.0))
    assert m["band1_slo_attainment"] == pytest.approx(3 / 4)  # 0.25 s misses its own 0.2 s
    assert m["band0_slo_attainment"] == pytest.approx(3 / 4)  # 0.5 s meets the run's 1 s; the shed one misses
    assert (m["tenant_b_shed"], m["tenant_b_rejected"], m["tenant_i_shed"]) == (1, 1, 0)
    assert m["band1_goodput_rps"] == pytest.approx(3 / 4.0)
    assert m["band1_p99_ttft_s"] == pytest.approx(0.25, abs=0.01) and m["band0_p99_ttft_s"] == pytest.approx(0.5)
    assert "band0_p99_queue_s" in m
    assert class_metrics(slow, SLO(1.0, 0.05), Window(0.0, 4.0)) == {}  # one class: no split
