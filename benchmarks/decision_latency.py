"""Per-decision latency of SIBYL's decode assignment at scale, against least-loaded
measured in the same run on the same cluster state.

Times the decode-assignment decision only (SIBYL's early binding given the prefill
instance; least-loaded's choose_decode). Builds a view of 256 decode instances with about 40 running decodes each (10,240
active requests) and 32 prefill instances, then makes decisions while the clock moves
on (10 ms per decision), one request completes per decision (dirtying its instance's
cached projection) and bound requests join their batch after 50 decisions. The last line
is one JSON object with median_us, p99_us and ratio_to_least_loaded (SIBYL median over
least-loaded median), and the same SIBYL decision at 1,024 decode instances (128 prefill),
median_us_1024 and p99_us_1024 (targets: median <= 50 us, p99 <= 500 us).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import ArrivalPlan
from baton.core.events import Completed
from baton.core.request import Phase
from baton.perf import build
from baton.policies import PolicyContext, build_scheduler
from baton.policies.sibyl import Sibyl
from recorded import emit  # noqa: E402


def build_view(decode: int, per_instance: int, prefill: int, rng: np.random.Generator) -> ClusterView:
    instances, states, rid = {}, {}, 0
    for i in range(prefill):
        instances[i] = InstanceState(i, Role.PREFILL, 50_000, 16)
        instances[i].queue_prefill(10_000_000 + i, int(rng.integers(0, 8000)))
    for i in range(prefill, prefill + decode):
        inst = InstanceState(i, Role.DECODE, 50_000, 16)
        for _ in range(int(rng.poisson(per_instance))):
            rid += 1
            prompt, gen = int(rng.integers(100, 4000)), int(rng.integers(2, 6000))
            st = RequestState(Request(rid, 0.0, prompt, 8192))
            st.phase, st.decode_instance = Phase.DECODE, i
            st.decode_start_s, st.generated_tokens = -gen / 30.0, gen
            states[rid] = st
            inst.decodes.add(rid, prompt + 1, 1, 8192, rid, -(-(prompt + gen) // 16),
                             joined_s=-gen / 30.0)
            inst.decodes.set(rid, "ctx", prompt + gen)
            inst.decodes.set(rid, "generated", gen)
        instances[i] = inst
    view = ClusterView(instances, states)
    return view


def measure(policy: str, view: ClusterView, decisions: int, rng: np.random.Generator) -> np.ndarray:
    perf = build("llama-3.1-8b@a100-80g")
    sched = build_scheduler(policy, PolicyContext(np.random.default_rng(0), perf))
    stage = sched.stages[0]
    running = [r for r, s in view._requests.items() if s.phase is Phase.DECODE]
    times, ticks = np.empty(decisions), []
    for k in range(decisions):
        view.now_s = 10.0 + 0.01 * k
        done = running[int(rng.integers(len(running)))]
        sched.observe(view, Completed(done, 5000, view.now_s))
        st = RequestState(Request(50_000_000 + k, view.now_s, int(rng.integers(100, 4000)), 100))
        view._requests[st.req_id] = st
        prefill = int(rng.integers(32))  # the prefill choice is not what is timed
        t0 = time.perf_counter_ns()
        if isinstance(stage, Sibyl):
            stage.plan_arrival(view, st, ArrivalPlan(prefill_instance=prefill))
        else:
            stage.choose_decode(view, st)
        times[k] = (time.perf_counter_ns() - t0) / 1e3
        if isinstance(stage, Sibyl) and k % 10 == 0:  # its 0.1 s maintenance tick, timed apart
            t0 = time.perf_counter_ns()
            stage.tick(view)
            ticks.append((time.perf_counter_ns() - t0) / 1e3)
        if isinstance(stage, Sibyl) and k >= 50:
            stage.pending.remove(50_000_000 + k - 50)  # joined its batch
    return times, np.array(ticks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--per-instance", type=int, default=40)
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    view = build_view(args.decode, args.per_instance, 32, np.random.default_rng(0))
    active = sum(view.instance(i).decodes.n for i in view.decode_ids)
    print(f"{args.decode} decode instances, {active} active requests, {args.decisions} decisions")
    results, tick_ms = {}, float("nan")
    for policy in ("least-loaded", "sibyl"):
        t, ticks = measure(policy, view, args.decisions, np.random.default_rng(1))
        t = t[100:]  # warm-up
        results[policy] = (float(np.median(t)), float(np.percentile(t, 99)))
        print(f"{policy:13s} median {results[policy][0]:8.1f} us   p99 {results[policy][1]:8.1f} us")
        if ticks.size:
            tick_ms = float(np.mean(ticks[10:])) / 1e3
            print(f"{'':13s} maintenance tick (every 0.1 s): mean {tick_ms:.2f} ms, "
                  f"{tick_ms / 100 * 100:.1f}% of one core")
    med, p99 = results["sibyl"]
    ratio = med / results["least-loaded"][0]
    print(f"sibyl / least-loaded median: {ratio:.2f}x  (targets: median <= 50 us, p99 <= 500 us)")
    big = build_view(1024, args.per_instance, 128, np.random.default_rng(0))
    t, _ = measure("sibyl", big, max(1000, args.decisions // 3), np.random.default_rng(1))
    med_k, p99_k = float(np.median(t[100:])), float(np.percentile(t[100:], 99))
    print(f"sibyl at 1,024 decode instances: median {med_k:.1f} us, p99 {p99_k:.1f} us")
    figures = {"median_us": round(med, 1), "p99_us": round(p99, 1), "tick_mean_ms": round(tick_ms, 2),
               "ratio_to_least_loaded": round(ratio, 3), "decode_instances": args.decode,
               "active_requests": active, "median_us_1024": round(med_k, 1), "p99_us_1024": round(p99_k, 1)}
    emit("decision-latency", figures, started, args.record)


if __name__ == "__main__":
    main()
