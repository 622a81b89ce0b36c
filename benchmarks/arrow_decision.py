"""Cost of one Arrow decision (Algorithm 1 at arrival, then Algorithm 2 at prefill end) at
64 instances, on a view with queued prefills and running decodes everywhere.

    python benchmarks/arrow_decision.py [--instances N] [--decisions N]

Baseline in the same run: the ``least-loaded`` policy's two decisions on the same view.
The last line is ``{"median_us": ..., "p99_us": ..., "instances": 64, ...}``, with the same at
1,024 instances in ``median_us_1024`` and ``p99_us_1024``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.core import ClusterView, InstanceState, Request, RequestState, Role  # noqa: E402
from baton.perf import build  # noqa: E402
from baton.policies import PolicyContext, build_scheduler  # noqa: E402
from recorded import emit  # noqa: E402


def view(n: int, rng: np.random.Generator) -> ClusterView:
    """Half prefill, half decode; each prefill instance has 8 queued prompts, each decode
    instance 32 running requests."""
    instances = {}
    for i in range(n):
        role = Role.PREFILL if i < n // 2 else Role.DECODE
        inst = InstanceState(i, role, kv_blocks_total=28_000, block_size_tokens=16)
        if role is Role.PREFILL:
            for j in range(8):
                inst.queue_prefill(10_000 * i + j, int(rng.integers(100, 4000)))
        else:
            for j in range(32):
                c = int(rng.integers(200, 4000))
                inst.decodes.add(10_000 * i + j, c, 1, 10_000, j, -(-c // 16))
            inst.recent_iteration_s = inst.recent_token_interval_s = 0.02
        instances[i] = inst
    return ClusterView(instances, {})


def time_policy(name: str, v: ClusterView, decisions: int) -> np.ndarray:
    ctx = PolicyContext(np.random.default_rng(0), build("llama-3.1-8b@h100"), ttft_slo_s=3.0, tpot_slo_s=0.1)
    sched = build_scheduler(name, ctx)
    out = np.empty(decisions)
    for k in range(decisions):
        st = RequestState(Request(k, 0.0, 1000 + k % 3000, 100))
        t0 = time.perf_counter()
        plan = sched.plan_arrival(v, st)
        st.prefill_instance = plan.prefill_instance
        sched.choose_decode(v, st)
        out[k] = time.perf_counter() - t0
    return out * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    v = view(args.instances, np.random.default_rng(0))
    arrow = time_policy("arrow", v, args.decisions)
    base = time_policy("least-loaded", v, args.decisions)
    med, p99 = float(np.median(arrow)), float(np.percentile(arrow, 99))
    print(f"arrow: median {med:.1f} us, p99 {p99:.1f} us per request (both decisions), "
          f"{args.instances} instances; least-loaded: median {np.median(base):.1f} us "
          f"({med / np.median(base):.1f}x)")
    big = time_policy("arrow", view(1024, np.random.default_rng(0)), max(1000, args.decisions // 3))
    med_k, p99_k = float(np.median(big)), float(np.percentile(big, 99))
    print(f"arrow at 1,024 instances: median {med_k:.1f} us, p99 {p99_k:.1f} us")
    emit("arrow-decision", {"median_us": round(med, 2), "p99_us": round(p99, 2), "instances": args.instances,
                            "least_loaded_median_us": round(float(np.median(base)), 2),
                            "median_us_1024": round(med_k, 2), "p99_us_1024": round(p99_k, 2)}, started, args.record)


if __name__ == "__main__":
    main()
