"""Cost of one ARES rescheduling round at 256 (``--decode``) decode instances x 40 requests,
and at 1,024 (``round_ms_1024``).

Times ``Ares.tick`` (classification, candidate enumeration, selection) on a hand-built
cluster state (the one ``decision_latency.py`` builds), for the survival and oracle
estimators and with up to 4 migrations per round, and compares it with the time the
round covers: one simulated second (the default interval). Also measures, in the same
run, the wall time the simulator needs for one simulated second of a 16P64D cluster with
~2,500 running decodes, to put the round's cost next to the simulator's own. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from decision_latency import build_view

from baton.perf import build
from baton.policies import PolicyContext, build_scheduler
from baton.sim import ClusterSpec, simulate
from baton.workload import generate, reasoning_spec
from recorded import emit  # noqa: E402


def time_rounds(view, estimator: str, max_migrations: int, rounds: int) -> np.ndarray:
    cfg = {"name": "b", "stages": [{"stage": "ares", "estimator": estimator,
                                    "max_migrations": max_migrations}]}
    stage = build_scheduler(cfg, PolicyContext(np.random.default_rng(0), build("llama-3.1-8b@a100-80g"))).stages[0]
    out = np.empty(rounds)
    for k in range(rounds):
        view.now_s = 10.0 + k
        stage.in_flight.clear()
        t0 = time.perf_counter()
        stage.tick(view)
        out[k] = (time.perf_counter() - t0) * 1e3
    return out


def sim_wall_per_simulated_s() -> float:
    reqs = generate(reasoning_spec(3000, 40.0), np.random.default_rng(0))
    t0 = time.perf_counter()
    res = simulate(reqs, ClusterSpec(prefill=16, decode=64), "ares", seed=0)
    return (time.perf_counter() - t0) / res.makespan_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--decode", type=int, default=256)
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    view = build_view(args.decode, 40, 0, np.random.default_rng(0))
    active = sum(view.instance(i).decodes.n for i in view.decode_ids)
    print(f"{args.decode} decode instances, {active} running requests")
    figures = {}
    for est, moves in (("survival", 1), ("oracle", 1), ("survival", 4)):
        t = time_rounds(view, est, moves, args.rounds)
        key = f"{est}_{moves}"
        figures[key] = float(np.median(t))
        print(f"ares {est:8s} max_migrations={moves}: median {np.median(t):6.2f} ms, max {t.max():6.2f} ms "
              f"(target <= 20 ms; {np.median(t) / 10:.2f}% of a 1 s interval)")
    big = build_view(1024, 40, 0, np.random.default_rng(0))
    t = time_rounds(big, "survival", 1, max(5, args.rounds // 3))
    figures["survival_1_1024"] = float(np.median(t))
    print(f"ares survival max_migrations=1 at 1,024 decode instances: median {np.median(t):6.2f} ms, "
          f"max {t.max():6.2f} ms (target <= 20 ms)")
    sim_s = sim_wall_per_simulated_s()
    print(f"simulator: {sim_s * 1e3:.1f} ms of wall time per simulated second (16P64D reasoning, ares)")
    emit("ares-round", {"round_ms": round(figures["survival_1"], 2), "round_ms_oracle": round(figures["oracle_1"], 2),
                        "round_ms_4_moves": round(figures["survival_4"], 2),
                        "round_ms_1024": round(figures["survival_1_1024"], 2),
                        "round_share_of_1s_interval": round(figures["survival_1"] / 1000, 5),
                        "sim_wall_ms_per_simulated_s": round(sim_s * 1e3, 1),
                        "running_requests": active}, started, args.record)


if __name__ == "__main__":
    main()
