"""CascadeInfer's stage partition (section 4.2): how many stages, how many instances each,
and which length range each serves, minimising the predicted QoE of the pipeline.

Inputs are a snapshot of the sequences in flight (prompt I and current context C, tokens;
the paper plans on the last period's statistics, and Eq. 1 describes a concurrent batch,
so a snapshot of the concurrent population is what Baton plans on), the QoE model and the
instance count E. Cut points are exponential tiers (powers of two from ``first_cut``; the
last stage is unbounded).

- A stage [a, b) holds the sequences whose context is in [a, b); a sequence whose prompt
  is below a entered by migration, so it adds no prefill (I = 0) to the stage's features.
- k instances of a stage each hold an even share: the sequences sorted by context, every
  k-th from the middle of the first k (the paper's even division); the stage costs
  k x Q^B(share).
- ``prefill_residence_tokens`` R > 0 (Baton's reading of Eq. 1 for a pipeline): the QoE
  profile spreads each prefill over its R output tokens, but a stage holds a new sequence
  only until it crosses the stage's bound, so a stage entered with prompt I weighs that
  prefill's terms (D2 I, D3 I^2) by R / min(bound - I, ``mean_output_tokens``) (at least
  16 tokens). Without it the first stage, which runs every prefill but keeps each
  sequence only a few dozen tokens, looks cheap and is starved of instances.
- A cut at l costs c_l = (sequences in [l/2, l) with prompts below l: the ones about to
  cross) x the KV transfer time of l tokens / ``mean_output_tokens``: the paper adds a
  time to a sum of per-token latencies, so Baton spreads the migration delay over a
  request's output tokens (a choice; the paper leaves the units open).
- ``exact_plan``: the DP f[s, e, j] = min over j' < j and s-1 <= e' <= e-1 of
  f[s-1, e', j'] + (e - e') Q(share of [t_j', t_j)) + c_{t_j'}.
- ``heuristic_plan`` (the paper's two phases): a chain of min(E, tiers) stages of one
  instance each (DP over tiers), extra instances to the stages that gain most, then
  greedy merges of adjacent stages while the merge gain (the two stages' cost plus their
  cut's cost, minus the merged stage's cost) is positive, largest first, with a heap.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from baton.perf.qoe import QoEModel


@dataclass(slots=True, frozen=True)
class StagePlan:
    """Stage upper bounds (tokens; the last is infinite), instances per stage, and the
    predicted cost (s/token summed over requests, plus the cuts' migration terms)."""

    bounds: tuple[float, ...]
    instances: tuple[int, ...]
    cost: float


class PlanCost:
    """Stage and cut costs over the tier edges, cached."""

    def __init__(self, prompt_tokens: np.ndarray, context_tokens: np.ndarray, qoe: QoEModel,
                 kv_bytes_per_token: int, link_bytes_per_s: float, mean_output_tokens: float = 256.0,
                 first_cut: int = 256, max_context: int = 131072, prefill_residence_tokens: float = 0.0) -> None:
        order = np.argsort(context_tokens, kind="stable")
        self.residence = prefill_residence_tokens
        self.prompt = np.asarray(prompt_tokens, float)[order]
        self.ctx = np.asarray(context_tokens, float)[order]
        self.qoe, self.kv_bytes, self.link = qoe, kv_bytes_per_token, link_bytes_per_s
        self.mean_output = mean_output_tokens
        cuts, c = [], first_cut
        while c < max_context:
            cuts.append(float(c))
            c *= 2
        self.edges = [0.0, *cuts, math.inf]
        self.tiers = len(self.edges) - 1
        self.stage = lru_cache(maxsize=None)(self._stage)

    def _stage(self, a: int, b: int, k: int) -> float:
        """Cost of a stage over tiers [a, b) with k instances."""
        lo, hi = self.edges[a], self.edges[b]
        i0, i1 = np.searchsorted(self.ctx, lo, "left"), np.searchsorted(self.ctx, hi, "left")
        if i1 <= i0:
            return 0.0
        ctx, prompt = self.ctx[i0:i1], self.prompt[i0:i1]
        prompt = np.where(prompt >= lo, prompt, 0.0)
        share = slice(min(k // 2, len(ctx) - 1), None, k)
        if not self.residence:
            return k * self.qoe.batch_qoe_s(prompt[share], ctx[share])
        p, c = prompt[share], ctx[share]
        # Eq. 1's prefill terms were profiled with each prefill spread over the profile's
        # output length; in a stage a prefill is spread over the tokens decoded there
        stay = np.maximum(np.minimum(hi - p, self.mean_output), 16.0)
        w = np.where(p > 0, self.residence / stay, 0.0)
        d, n = self.qoe.d, len(c)
        return k * n * (d[0] + d[1] * n + d[2] * float((w * p).sum()) + d[3] * float((w * p * p).sum())
                        + d[4] * float(c.sum()))

    def cut(self, j: int) -> float:
        """Migration cost of a cut at edge j (0 for the pipeline's entry)."""
        if j == 0 or j >= self.tiers:
            return 0.0
        lo = self.edges[j]
        crossing = np.count_nonzero((self.ctx >= lo / 2) & (self.ctx < lo) & (self.prompt < lo))
        return crossing * lo * self.kv_bytes / self.link / self.mean_output

    def plan_of(self, stages: list[tuple[int, int, int]]) -> StagePlan:
        """A plan from (first tier, end tier, instances) per stage, with its cost."""
        cost = sum(self.stage(a, b, k) + self.cut(a) for a, b, k in stages)
        return StagePlan(tuple(self.edges[b] for _, b, _ in stages), tuple(k for *_, k in stages), cost)


def exact_plan(cost: PlanCost, instances: int) -> StagePlan:
    """The exact DP (use on small inputs: O(E^3 K^2) stage evaluations)."""
    k_tiers, inf = cost.tiers, math.inf
    best: dict[tuple[int, int, int], tuple[float, tuple]] = {(0, 0, 0): (0.0, ())}
    for s in range(1, instances + 1):
        for e in range(s, instances + 1):
            for j in range(1, k_tiers + 1):
                cand = (inf, ())
                for e2 in range(s - 1, e):
                    for j2 in range(0, j):
                        prev = best.get((s - 1, e2, j2))
                        if prev is None or (j2 == 0) != (s == 1) or (e2 == 0) != (s == 1):
                            continue
                        v = prev[0] + cost.stage(j2, j, e - e2) + cost.cut(j2)
                        if v < cand[0]:
                            cand = (v, prev[1] + ((j2, j, e - e2),))
                if cand[0] < inf:
                    best[(s, e, j)] = cand
    finals = [v for (s, e, j), v in best.items() if e == instances and j == k_tiers and s > 0]
    return cost.plan_of(list(min(finals)[1]))


def chain_plan(cost: PlanCost, instances: int) -> list[tuple[int, int, int]]:
    """Phase one: min(E, tiers) stages of one instance over the tiers (DP), then each
    extra instance to the stage whose cost drops most with it."""
    stages, k_tiers, inf = min(instances, cost.tiers), cost.tiers, math.inf
    g = [[(inf, ())] * (k_tiers + 1) for _ in range(stages + 1)]
    g[0][0] = (0.0, ())
    for s in range(1, stages + 1):
        for j in range(s, k_tiers + 1):
            g[s][j] = min(((g[s - 1][j2][0] + cost.stage(j2, j, 1) + cost.cut(j2), g[s - 1][j2][1] + ((j2, j),))
                           for j2 in range(s - 1, j) if g[s - 1][j2][0] < inf), default=(inf, ()))
    chain = [[a, b, 1] for a, b in g[stages][k_tiers][1]]
    for _ in range(instances - stages):
        gain = [cost.stage(a, b, k) - cost.stage(a, b, k + 1) for a, b, k in chain]
        chain[int(np.argmax(gain))][2] += 1
    return [tuple(x) for x in chain]  # type: ignore[misc]


def heuristic_plan(cost: PlanCost, instances: int) -> StagePlan:
    """The paper's two phases: the chain, then greedy merges by merge gain (a heap)."""
    stages = [list(x) for x in chain_plan(cost, instances)]
    alive = [True] * len(stages)
    version = [0] * len(stages)

    def gain(i: int, j: int) -> float:
        (a, _, k1), (_, b, k2) = stages[i], stages[j]
        return (cost.stage(stages[i][0], stages[i][1], k1) + cost.stage(stages[j][0], b, k2) + cost.cut(stages[j][0])
                - cost.stage(a, b, k1 + k2))

    def right(i: int) -> int | None:
        return next((j for j in range(i + 1, len(stages)) if alive[j]), None)
    heap = [(-gain(i, i + 1), i, 0, i + 1, 0) for i in range(len(stages) - 1)]
    heapq.heapify(heap)
    while heap:
        g, i, vi, j, vj = heapq.heappop(heap)
        if g >= 0:
            break
        if not (alive[i] and alive[j]) or version[i] != vi or version[j] != vj:
            continue
        stages[i] = [stages[i][0], stages[j][1], stages[i][2] + stages[j][2]]
        alive[j], version[i] = False, version[i] + 1
        left = next((h for h in range(i - 1, -1, -1) if alive[h]), None)
        if left is not None:
            heapq.heappush(heap, (-gain(left, i), left, version[left], i, version[i]))
        nxt = right(i)
        if nxt is not None:
            heapq.heappush(heap, (-gain(i, nxt), i, version[i], nxt, version[nxt]))
    return cost.plan_of([tuple(s) for s, ok in zip(stages, alive) if ok])  # type: ignore[misc]


def split_point(ctx: np.ndarray, refine: str, d: np.ndarray | None = None) -> float:
    """Where a sorted set of contexts (tokens) splits best between two stages (range
    refinement, section 4.3): ``refine`` ``qoe`` minimises Q(left) + Q(right) under the
    QoE coefficients ``d``; ``count`` / ``memory`` split into equal counts / equal tokens."""
    if refine == "count":
        return float(ctx[len(ctx) // 2])
    if refine == "memory":
        return float(ctx[int(np.searchsorted(np.cumsum(ctx), ctx.sum() / 2))])
    # Q(left) + Q(right) at every split at once: with no prefill terms (I = 0) a batch of
    # n sequences costs n (D0 + D1 n + D4 sum L), so prefix sums give every split
    assert d is not None
    n = len(ctx)
    left_n = np.arange(1, n, dtype=np.float64)
    left_sum = np.cumsum(ctx)[:-1]
    right_n, right_sum = n - left_n, ctx.sum() - left_sum
    costs = left_n * (d[0] + d[1] * left_n + d[4] * left_sum) + right_n * (d[0] + d[1] * right_n + d[4] * right_sum)
    return float(ctx[1 + int(np.argmin(costs))])
