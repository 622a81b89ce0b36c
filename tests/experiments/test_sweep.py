"""Sweep points are seeded simulations: every executor gives the same numbers."""

import pytest

from baton.experiments import Experiment, WorkloadConfig, max_sustainable_rate, run_sweep
from baton.sim import ClusterSpec
from baton.workload import SyntheticSpec


@pytest.mark.parametrize("rates,att,expected", [
    ([1, 2, 3], [1.0, 0.95, 0.5], 2.0 + 0.05 / 0.45),
    ([1, 2, 3], [1.0, 1.0, 0.9], 3.0),
    ([1, 2, 3], [0.8, 0.95, 1.0], None),
    ([1, 2], [0.9, 0.1], 1.0),
    ([], [], None),
])
def test_max_sustainable_rate(rates, att, expected):
    got = max_sustainable_rate(rates, att, 0.9)
    assert got == (pytest.approx(expected) if expected is not None else None)


def small() -> Experiment:
    return Experiment(cluster=ClusterSpec(prefill=1, decode=2),
                      workload=WorkloadConfig(synthetic=SyntheticSpec(requests=50, rate_rps=5.0,
                                                                      arrival="gamma", cv=2.0)), seed=5)


POLICIES = {"rr": "round-robin", "p2": "power-of-two"}


def same(a, b) -> bool:
    """Exact equality, NaN equal to NaN (summaries hold NaN where nothing was measured)."""
    return repr(a) == repr(b)


def test_processes_equal_serial():
    a = run_sweep(small(), POLICIES, [3.0, 9.0], executor="serial")
    b = run_sweep(small(), POLICIES, [9.0, 3.0], executor="processes", workers=2)
    assert same(a.points, b.points) and a.rates_rps == b.rates_rps == [3.0, 9.0]
    assert a.points["rr"][0] != a.points["rr"][1]


def test_ray_equals_serial():
    ray = pytest.importorskip("ray")
    try:
        a = run_sweep(small(), POLICIES, [3.0, 9.0], executor="serial")
        b = run_sweep(small(), POLICIES, [3.0, 9.0], executor="ray")
    finally:
        ray.shutdown()
    assert same(a.points, b.points)


@pytest.mark.parametrize("att,steady,want", [
    ([1.0, 0.95, 0.5], [1, 1, 1], ("knee", 2.0 + 0.05 / 0.45)),
    ([1.0, 1.0, 0.95], [1, 1, 1], ("capped", 3.0)),  # nothing missed: a lower bound
    ([0.5, 0.2, 0.1], [1, 1, 1], ("below range", 1.0)),
    ([1.0, 0.95, 0.5], [1, 0, 1], ("not measurable", None)),  # the last pass was a burst
    ([1.0, 1.0, 1.0], [1, 1, 0], ("not measurable", None)),
    ([1.0, 0.95, 0.5], [0, 1, 0], ("knee", 2.0 + 0.05 / 0.45)),  # a burst below the knee does not decide it
])
def test_a_knee_rests_on_steady_points(att, steady, want):
    from baton.experiments.steady import sustained
    got = sustained([1.0, 2.0, 3.0], [{"slo_attainment": a, "steady": s} for a, s in zip(att, steady)], 0.9)
    assert got.status == want[0] and got.rate_rps == (pytest.approx(want[1]) if want[1] is not None else None)


def test_a_point_runs_on_a_steady_window():
    from baton.experiments.steady import steady_point
    sizes = []

    def run(n):  # a fake source whose mean e2e at this rate asks for 150 s of arrivals
        sizes.append(n)
        return {"requests": n, "steady": float(n >= 1668), "steady_needed_s": 150.0, "slo_attainment": 0.95}
    assert steady_point(run, 10.0, 200)["steady"] == 1.0
    assert sizes == [200, 2501]  # its own count, then 10 mean e2e (150 s) x 1.5 over the 90% steady share
    sizes.clear()
    short = {"requests": 300, "steady": 0.0, "steady_needed_s": 60.0, "slo_attainment": 1.0}
    assert steady_point(lambda n: sizes.append(n) or short, 10.0, 500) is short and sizes == [500]  # no more to give
    sizes.clear()
    miss = {"requests": 50, "steady": 0.0, "steady_needed_s": 5000.0, "slo_attainment": 0.2}
    assert steady_point(lambda n: sizes.append(n) or miss, 10.0, 50) is miss and sizes == [50]  # a miss: one run


def _azure_trace(path, n):
    """An Azure-format trace of ``n`` requests, 0.1 s apart, each prompt a different length."""
    rows = [f"2023-11-16 18:{15 + i // 600:02d}:{(i // 10) % 60:02d}.{i % 10}000000,{100 + i},8" for i in range(n)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return str(path)


def test_a_sweep_point_on_a_trace_without_a_request_count_runs_all_of_it(tmp_path):
    """``requests`` unset on a trace means the whole trace (whatever ``kind`` says), not
    the synthetic spec's default count."""
    from baton.experiments.sweep import run_point
    trace = _azure_trace(tmp_path / "t.csv", 1300)
    exp = Experiment(cluster=ClusterSpec(prefill=0, decode=0, mixed=2), workload=WorkloadConfig(trace=trace),
                     policy="round-robin")
    assert exp.workload.kind == "synthetic" and not exp.workload.drawn
    assert run_point(exp, 10.0)["requests"] == 1300  # 1,000 of them would already be a steady window


def test_a_reproduction_on_trace_windows_never_reads_past_its_own_window(tmp_path, monkeypatch):
    """A pass short of a steady window asks for more requests; a trace window has no more to
    give, so it runs again on itself (reading the trace's first N made every repeat the
    same run: Arrow's conversation figure came out +10.3% [+10.3, +10.3])."""
    from types import SimpleNamespace

    import baton.experiments.reproduce as reproduce
    from baton.experiments.repeats import repeat_workloads
    seen = []

    def fake_run(exp, requests, name):
        seen.append(requests[0].prompt_tokens)
        summary = {"slo_attainment": 1.0, "steady": 0.0, "steady_needed_s": 60.0, "requests": len(requests)}
        return None, SimpleNamespace(summary=summary)
    monkeypatch.setattr(reproduce, "run_experiment", fake_run)
    exp = Experiment(workload=WorkloadConfig(trace=_azure_trace(tmp_path / "t.csv", 400), requests=100))
    claim = reproduce.Claim("x", "fig", "", exp, "a", "b", reproduce.SUSTAINABLE, 0.1, rates=(10.0,))
    for _, window in repeat_workloads(exp, 3)[1:]:
        seen.clear()
        reproduce._measure(exp, window, "a", claim)
        assert seen and set(seen) == {window[0].prompt_tokens} != {100}  # its own first request, each run
