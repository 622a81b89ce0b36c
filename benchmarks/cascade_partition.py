"""Time CascadeInfer's stage partition at 16 instances and 128K context (the paper: 0.06 s;
target here <= 1 s), with the exact DP measured in the same run as the baseline.

    python benchmarks/cascade_partition.py [--instances 16] [--sequences 5000]

Population: a snapshot of in-flight sequences with ShareGPT-like lognormal prompts and
outputs (up to 128K context); QoE coefficients fitted by ``baton profile --kind qoe``'s
procedure on llama-3.2-3b@h100 (about 1 s). The last line is JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.perf import build  # noqa: E402
from baton.policies.cascade_plan import PlanCost, exact_plan, heuristic_plan  # noqa: E402
from baton.profiling.qoe import profile_qoe  # noqa: E402
from recorded import emit  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--sequences", type=int, default=5000)
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    prompt = rng.lognormal(6.0, 1.2, args.sequences).clip(16, 100_000)
    ctx = (prompt + rng.lognormal(5.8, 1.3, args.sequences)).clip(17, 131_072)
    qoe = profile_qoe("llama-3.2-3b@h100").model
    perf = build("llama-3.2-3b@h100")

    def fresh() -> PlanCost:
        return PlanCost(prompt, ctx, qoe, perf.kv_bytes_per_token, 50e9, first_cut=128, max_context=131_072)
    heur_s, heur = timed(lambda: heuristic_plan(fresh(), args.instances), 5)
    exact_s, exact = timed(lambda: exact_plan(fresh(), args.instances), 1)
    print(f"{args.instances} instances, {fresh().tiers} length tiers, {args.sequences} sequences: heuristic "
          f"{heur_s * 1e3:.0f} ms ({len(heur.instances)} stages {heur.instances}, cost {heur.cost:.4g}); exact DP "
          f"{exact_s:.2f} s ({len(exact.instances)} stages {exact.instances}, cost {exact.cost:.4g}); heuristic "
          f"within {heur.cost / exact.cost - 1:.2%} of the optimum, {exact_s / heur_s:.0f}x faster")
    emit("cascade-partition", {"heuristic_s": round(heur_s, 4), "exact_s": round(exact_s, 3),
                               "instances": args.instances, "tiers": fresh().tiers,
                               "gap_to_optimum": round(heur.cost / exact.cost - 1, 5),
                               "stages": list(heur.instances)}, started, args.record)


if __name__ == "__main__":
    main()
