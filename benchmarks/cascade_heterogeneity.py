"""How much length-homogeneous batching can save under a preset's engine model.

    python benchmarks/cascade_heterogeneity.py [--preset llama-3.2-3b@h100] [--record]

Decode batches of n sequences whose contexts are drawn as in flight under
examples/cascade-16.yaml's workload (prompt lognormal, median 250, sigma 0.8; output
lognormal, median 300, sigma 1.0; in-flight sampling is length-biased by the output, each
sequence a uniform share of the way through its answer). For each n: the iteration time of
the mixed batch, of a homogeneous batch with the same total context (CV^2 = 0), and of the
batch split into four length quartiles (what a 4-stage pipeline would see), with the
ratio mixed / homogeneous: the most a perfect length pipeline could save per decode
iteration. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baton.perf import build  # noqa: E402
from baton.perf.model import BatchShape, length_cv2  # noqa: E402
from recorded import emit  # noqa: E402


def in_flight_contexts(n: int, rng: np.random.Generator) -> np.ndarray:
    prompts = np.exp(np.log(250) + 0.8 * rng.standard_normal(4 * n))
    outputs = np.exp(np.log(300) + 1.0 * rng.standard_normal(4 * n))
    picked = rng.choice(4 * n, n, p=outputs / outputs.sum())  # long answers are in flight longer
    return prompts[picked] + rng.uniform(0, 1, n) * outputs[picked]


def iteration_s(perf, ctx: np.ndarray, cv2: float) -> float:
    return perf.breakdown(BatchShape(n_decodes=len(ctx), decode_ctx_tokens=int(ctx.sum()), decode_ctx_cv2=cv2)).total_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-3.2-3b@h100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = p.parse_args()
    started = time.perf_counter()
    perf, rng = build(args.preset), np.random.default_rng(args.seed)
    out = {"preset": args.preset, "batches": []}
    print(f"{'n':>5} {'CV^2':>6} {'mixed ms':>9} {'homog. ms':>10} {'4 quartiles ms':>15} {'mixed/homog.':>13}")
    for n in (16, 32, 64, 128, 256, 512):
        ctx = np.sort(in_flight_contexts(n, rng))
        cv2 = length_cv2(ctx)
        quartile_cv2 = float(np.mean([length_cv2(q) for q in np.array_split(ctx, 4)]))
        mixed, homo, split = (iteration_s(perf, ctx, c) for c in (cv2, 0.0, quartile_cv2))
        print(f"{n:>5} {cv2:>6.2f} {mixed * 1e3:>9.2f} {homo * 1e3:>10.2f} {split * 1e3:>15.2f} {mixed / homo:>13.3f}")
        out["batches"].append({"n": n, "cv2": round(cv2, 3), "mixed_ms": round(mixed * 1e3, 3),
                               "homogeneous_ms": round(homo * 1e3, 3), "quartiles_ms": round(split * 1e3, 3),
                               "mixed_over_homogeneous": round(mixed / homo, 4)})
    emit("cascade-heterogeneity", out, started, args.record)


if __name__ == "__main__":
    main()
