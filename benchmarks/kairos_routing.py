"""Cost of one Kairos routing decision (chunk search on every decode instance, both TTFT
estimates, the alpha rule) at 64 decode instances (+ 64 prefill instances with queues),
and of one proactive re-plan tick over those queues.

    python benchmarks/kairos_routing.py [--decode N] [--decisions N] [--record]

Baseline in the same run: ``least-loaded``'s decision on the same view.
The last line is ``{"median_us": ..., "p99_us": ..., "decode_instances": 64, ...}``;
``--record`` also writes those figures into ``results/kairos-routing.json`` for the docs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from arrow_decision import view  # noqa: E402
from baton.core import Request, RequestState  # noqa: E402
from baton.perf import build  # noqa: E402
from baton.policies import PolicyContext, build_scheduler  # noqa: E402
from recorded import emit  # noqa: E402


def time_decisions(name: str, v, decisions: int) -> np.ndarray:
    ctx = PolicyContext(np.random.default_rng(0), build("deepseek-v2-lite@a100-80g"), ttft_slo_s=3.0,
                        tpot_slo_s=0.1)
    sched = build_scheduler(name, ctx)
    out = np.empty(decisions)
    for k in range(decisions):
        st = RequestState(Request(k, 0.0, 500 + k % 4000, 100))
        v.now_s += 1e-3  # a new moment: nothing cached from the previous decision
        t0 = time.perf_counter()
        sched.plan_arrival(v, st)
        out[k] = time.perf_counter() - t0
    return out * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    v = view(2 * args.decode, np.random.default_rng(0))
    for i in v.prefill_ids:  # the queued prompts are waiting requests the tick may re-plan
        v._requests.update({rid: RequestState(Request(rid, 0.0, left, 100), prefill_instance=i)
                            for rid, left in v.instance(i).prefill_queue.items()})
    kairos = time_decisions("kairos", v, args.decisions)
    base = time_decisions("least-loaded", v, args.decisions)
    stage = build_scheduler("kairos", PolicyContext(np.random.default_rng(0), build("deepseek-v2-lite@a100-80g"),
                                                    ttft_slo_s=3.0, tpot_slo_s=0.1)).stages[0]
    t0 = time.perf_counter()
    for _ in range(20):
        stage.tick(v)
    tick_ms = (time.perf_counter() - t0) / 20 * 1e3
    med, p99 = float(np.median(kairos)), float(np.percentile(kairos, 99))
    queued = sum(len(v.instance(i).prefill_queue) for i in v.prefill_ids)
    print(f"kairos: median {med:.0f} us, p99 {p99:.0f} us per arrival at {args.decode} decode instances "
          f"(least-loaded {np.median(base):.0f} us); a re-plan tick over {queued} queued prefills: {tick_ms:.1f} ms")
    figures = {"median_us": round(med, 1), "p99_us": round(p99, 1), "decode_instances": args.decode,
               "least_loaded_median_us": round(float(np.median(base)), 1), "tick_ms": round(tick_ms, 2),
               "tick_queued_prefills": queued}
    emit("kairos-routing", figures, started, args.record)


if __name__ == "__main__":
    main()
