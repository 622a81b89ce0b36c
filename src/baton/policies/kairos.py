"""Kairos: load-aware prefill deflection onto decode instances, TBT-safe (a summary of
arXiv 2607.02043, ../shared/papers/002). Under bursts the prefill instances queue while
decode instances have idle compute; Kairos lets a decode instance prefill a waiting
request in chunks between its decode iterations, with no KV transfer, when that helps
TTFT and keeps the in-flight decodes inside their TBT SLO.

The summary gives no formulas beyond the deflection condition; Baton's choices:

- **TTFT on the prefill path**: the least predicted queueing delay among prefill
  instances (``PrefillPredictor``: a quadratic fit of the perf model's prefill time,
  summed over the queued prompts), plus the request's own prefill time, plus its KV
  transfer over the prefill instance's link (``ClusterView.link_bytes_per_s``: the runtime's).
- **TTFT on decode instance n**: X* is the largest chunk (at most ``max_chunk_tokens``,
  the engine's token budget) such that one iteration of n's current decodes (running and
  arriving, with their contexts) plus a chunk of X* tokens stays within the TBT SLO,
  found by a bracketed search on the perf model (interpolation, halving where the time
  jumps; the largest fitting chunk whatever the probes); the chunk's attention to the
  prompt's earlier chunks is left out of that check (small next to the linear layers at
  these lengths; ``chunk_attention: true``, Baton's, sizes the chunk for the prompt's last
  chunk with that attention counted; measured in the combined scheduler it did not remove the TPOT
  misses of deflection on the Azure code trace, 18% with and 19% without, at 5.4 req/s on
  4P4D with the TBT budget at the TPOT SLO: those come from decodes that join the batch
  after the deflection was admitted; on the Mooncake trace's 12k-token prompts the
  attention does matter: 23% TPOT misses without it, 0.2% with it).
  TTFT_dec(n) = ceil((Q_n + L) / X*) x that iteration time, Q_n being the prompt tokens
  already deflected to n and still queued there (they go first). No feasible chunk (the
  decodes alone break the SLO, or X* < ``min_chunk_tokens``): n is not a candidate.
- **Deflect** to n* = argmin TTFT_dec when TTFT_dec(n*) <= ``alpha`` x TTFT_pf and
  TTFT_dec(n*) <= the TTFT SLO (alpha = 1, the paper's default); the request then
  prefills and decodes on n* with a chunk limit of X*. Otherwise plain PD: prefill on the
  least-delay prefill instance, decode on the least token-loaded decode instance when the
  prefill ends.
- **Proactive** (every ``replan_interval_s``): requests still queued, not started, on
  prefill instances are re-planned with the same rule in queue order (their TTFT_pf is
  what is left of their wait: the work ahead of them plus their own prefill and transfer,
  minus nothing already waited) and moved with a ``Deflect`` decision, at most
  ``max_replans`` per tick; a request whose prefill started is never moved. The same tick
  re-fits X* of work already deflected to the batch it now shares (decodes joined or
  left since): a ``Deflect`` to the instance it is on changes only its chunk limit (the
  simulator applies it; with ``fixed_chunk`` no re-fit is made, the engine's budget
  stands).
- The TBT SLO is ``tbt_slo_s``, else the run's TPOT SLO.
- **Live** (``fixed_chunk: true``): vLLM has no per-request chunk limit; a decode
  instance prefills a deflected prompt in chunks of its own ``--max-num-batched-tokens``
  (or ``--long-prefill-token-threshold``). The gateway is told that budget as
  ``max_chunk_tokens``, and an instance is a candidate only if an iteration with that
  whole chunk keeps the TBT SLO (X* is the budget or nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from baton.core.decisions import ArrivalPlan, Decision, Deflect
from baton.core.request import Phase, RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage, params_for
from baton.policies.prefill_time import PrefillPredictor

DEFAULT_TTFT_SLO_S, DEFAULT_TBT_SLO_S = 2.0, 0.1


@dataclass(frozen=True, slots=True)
class KairosParams:
    """Kairos's parameters (the deflection rule, the chunk search and the proactive re-plan)."""

    alpha: float = setting(1.0, ge=1, doc="deflect when the decode path's predicted TTFT is at most alpha x the "
                                          "prefill path's (1: the paper's default)")
    tbt_slo_s: float | None = setting(None, gt=0, unit="s",
                                      doc="the TBT SLO an iteration with a deflected chunk must keep (null: the run's "
                                          f"TPOT SLO, else {DEFAULT_TBT_SLO_S:g} s)")
    ttft_slo_s: float | None = setting(None, gt=0, unit="s",
                                       doc="the most a deflected request's predicted TTFT may be (null: the run's TTFT "
                                           f"SLO, else {DEFAULT_TTFT_SLO_S:g} s)")
    max_chunk_tokens: int = setting(2048, ge=1, unit="tokens",
                                    doc="the largest chunk X* a decode instance prefills per iteration (the engine's "
                                        "token budget; with fixed_chunk, the chunk)")
    min_chunk_tokens: int = setting(32, ge=1, unit="tokens",
                                    doc="a decode instance whose largest TBT-safe chunk is smaller is no candidate; "
                                        "re-fitted chunks are at least this")
    replan_interval_s: float = setting(0.1, gt=0, unit="s",
                                       doc="how often queued prefills are re-planned and deflected chunks re-fitted "
                                           "(proactive)")
    max_replans: int = setting(8, ge=1, doc="most queued prefills one re-plan moves onto decode instances")
    proactive: bool = setting(True, doc="re-plan queued prefills and re-fit deflected chunks every replan_interval_s "
                                        "(false: deflect on arrival only)")
    fixed_chunk: bool = setting(False, doc="the engine's budget is the chunk (live vLLM): a candidate must keep the "
                                           "TBT SLO with max_chunk_tokens whole; no re-fits")
    chunk_attention: bool = setting(False, doc="size the chunk for the prompt's last chunk, its attention to the "
                                               "earlier chunks counted (Baton's)")


class Kairos(Stage):
    """Prefill deflection onto decode instances (see the module docstring)."""

    name = "kairos"
    needs_bookings = True
    replans_prefills = True
    Params = KairosParams

    def __init__(self, context: PolicyContext, params: KairosParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Kairos, params, values)
        if p.max_chunk_tokens < p.min_chunk_tokens:
            raise ValueError("need min_chunk_tokens <= max_chunk_tokens")
        self.alpha, self.max_chunk, self.min_chunk = p.alpha, p.max_chunk_tokens, p.min_chunk_tokens
        self.tbt_slo_s = p.tbt_slo_s or context.tpot_slo_s or DEFAULT_TBT_SLO_S
        self.ttft_slo_s = p.ttft_slo_s or context.ttft_slo_s or DEFAULT_TTFT_SLO_S
        self.predictor = PrefillPredictor(context.perf)
        self.tick_interval_s = p.replan_interval_s if p.proactive else None
        self.max_replans = p.max_replans
        self.fixed_chunk = p.fixed_chunk
        self.chunk_attention = p.chunk_attention
        self._cache_at: float | None = None
        self._cache: dict[tuple[int, int], tuple[int, float]] = {}
        # the last X* found: the next search starts there (an arrival searches every decode
        # instance for one prompt, and their loads, hence their X*, are alike)
        self._last_chunk: int | None = None
        self._slope_s: float | None = None  # iteration time per chunk token near the last X* (s)
        # decode instances another stage owns at the moment (a composed scheduler's conflict
        # rules: one being flipped takes no deflection); none when Kairos runs alone
        self.exclude: frozenset[int] = frozenset()

    # --- the two paths -------------------------------------------------------------------
    def transfer_s(self, view: ClusterView, prompt_tokens: int, prefill_id: int | None) -> float:
        """The PD path's KV handoff of ``prompt_tokens`` from ``prefill_id`` (s), over its
        link (the cluster's slowest when no instance is named)."""
        perf = self.context.perf
        link = view.link_bytes_per_s(prefill_id) if prefill_id is not None else view.link_bytes_per_s()
        return perf.transfer_time_s(perf.kv_bytes(prompt_tokens), link)

    def chunk_for(self, view: ClusterView, n: int, prompt_tokens: int = 0) -> tuple[int, float]:
        """(X*, the iteration time with it) on decode instance ``n``; (0, inf) if none fits.
        Kept for the rest of the moment (a tick re-plans many requests against one batch).
        With ``chunk_attention`` the chunk is sized for the prompt's last chunk, whose
        attention reads the ``prompt_tokens - X*`` tokens before it."""
        cache, key = self._moment_cache(view), (n, prompt_tokens if self.chunk_attention else 0)
        if key not in cache:
            cache[key] = self._search_chunk(view, n, key[1])
        return cache[key]

    def _moment_cache(self, view: ClusterView) -> dict[tuple[int, int], tuple[int, float]]:
        """The searches of this moment, by (instance, prompt tokens the chunk is sized for)."""
        if self._cache_at != view.now_s:
            self._cache_at, self._cache = view.now_s, {}
        return self._cache

    def _search_chunk(self, view: ClusterView, n: int, prompt_tokens: int = 0) -> tuple[int, float]:
        perf, inst = self.context.perf, view.instance(n)
        iteration = perf.chunk_time_fn(inst.decodes.n + len(inst.incoming), int(view.running_tokens(n)),
                                       prompt_tokens)
        found = None if self.fixed_chunk else self._near(iteration, self._last_chunk)
        if found is None:
            found = self._bracketed(iteration)
        if found[0]:
            self._last_chunk = found[0]
        return found

    def _near(self, iteration, x: int | None) -> tuple[int, float] | None:
        """X* searched from ``x`` (the last answer, for another instance or an earlier
        moment: close to this one). The first probe goes where the last search's slope (s
        a token) puts the SLO crossing, then steps of 1, 4, 16, ... away until the answer is
        bracketed, then the bracketed search. None without a last answer. Iteration time
        grows with the chunk, so the largest fitting chunk is the same whichever probes
        find it; better guesses only mean fewer of them. (Written out, without helper
        calls: a combined run searches a dozen instances per arrival.)"""
        lo, hi, slo = self.min_chunk, self.max_chunk, self.tbt_slo_s
        if x is None or not lo <= x <= hi:
            return None
        x0, t_x = x, iteration(x)
        t0, slope = t_x, self._slope_s
        # the first step: to the chunk just past the predicted crossing (1 without a slope)
        step = 1 if slope is None else int(abs(slo - t_x) / slope) + 1
        if t_x <= slo:  # X* is x or above: find a chunk that does not fit
            while x < hi:
                y = x + step
                if y > hi:
                    y = hi
                t_y = iteration(y)
                if t_y > slo:
                    return self._learned(x0, t0, self._narrowed(iteration, x, t_x, y, t_y))
                x, t_x, step = y, t_y, 1 if step > 1 and x == x0 else step * 4
            return x, t_x
        while x > lo:  # X* is below x: find a chunk that fits
            y = x - step
            if y < lo:
                y = lo
            t_y = iteration(y)
            if t_y <= slo:
                return self._learned(x0, t0, self._narrowed(iteration, y, t_y, x, t_x))
            x, t_x, step = y, t_y, 1 if step > 1 and x == x0 else step * 4
        return 0, math.inf

    def _learned(self, x0: int, t0: float, found: tuple[int, float]) -> tuple[int, float]:
        """Keep the slope between the search's start and its answer (far enough apart to
        say something) for the next search's first probe."""
        x, t = found
        if abs(x - x0) >= 8 and t != t0:
            self._slope_s = abs((t - t0) / (x - x0))
        return found

    def _bracketed(self, iteration) -> tuple[int, float]:
        """X* between the smallest and the largest chunk: (0, inf) when even the smallest
        breaks the TBT budget."""
        lo, hi = self.min_chunk, self.max_chunk
        t_lo, t_hi = iteration(lo), iteration(hi)
        if t_lo > self.tbt_slo_s or (self.fixed_chunk and t_hi > self.tbt_slo_s):
            return 0, math.inf
        if t_hi <= self.tbt_slo_s:
            return hi, t_hi
        return self._narrowed(iteration, lo, t_lo, hi, t_hi)

    def _narrowed(self, iteration, lo: int, t_lo: float, hi: int, t_hi: float) -> tuple[int, float]:
        """X* in a bracket (``lo`` fits, ``hi`` does not). Iteration time is nearly affine
        in the chunk: interpolate, then keep the bracket with the probe; a guess within a
        token of X* is followed by a probe of the next chunk, which closes the bracket: two
        or three evaluations instead of ~11. Where the time jumps (the roofline's corners,
        a model's steps) interpolation lands beside the same end again and again: after two
        probes that moved the same end the rest of the search halves the bracket, so no
        search takes more than about log2 of it beyond those two."""
        slo, last, halving = self.tbt_slo_s, None, False
        while hi - lo > 1:
            if halving:
                mid = (lo + hi) // 2
            else:
                guess = int(lo + (slo - t_lo) / (t_hi - t_lo) * (hi - lo))
                mid = lo + 1 if guess < lo + 1 else (hi - 1 if guess > hi - 1 else guess)
            t_mid = iteration(mid)
            fits = t_mid <= slo
            halving = halving or fits is last
            last = fits
            if fits:
                lo, t_lo = mid, t_mid
            else:
                hi, t_hi = mid, t_mid
        return lo, t_lo

    def best_decode(self, view: ClusterView, prompt_tokens: int,
                    extra: dict[int, int] | None = None) -> tuple[float, int, int] | None:
        """(TTFT_dec, instance, X*) of the decode instance that would prefill this prompt
        soonest, counting prompt tokens already deflected there (and ``extra``)."""
        cache, key_prompt = self._moment_cache(view), prompt_tokens if self.chunk_attention else 0
        best = None
        for n in view.decode_ids:  # chunk_for's reads, written out (a dozen per arrival)
            if n in self.exclude:
                continue
            found = cache.get((n, key_prompt))
            if found is None:
                found = cache[(n, key_prompt)] = self._search_chunk(view, n, key_prompt)
            x, it = found
            if x == 0:
                continue
            queued = view.queued_prefill_moments(n)[1] + (extra.get(n, 0) if extra else 0)
            ttft = math.ceil((queued + prompt_tokens) / x) * it
            if best is None or ttft < best[0] or (ttft == best[0] and n < best[1]):
                best = (ttft, n, x)
        return best

    def qualifies(self, ttft_dec: float, ttft_pf: float, request: RequestState | None = None) -> bool:
        """Whether the decode path's TTFT (s) beats the prefill path's by the margin and meets
        the TTFT SLO (``request``'s own where it has one, else the run's)."""
        slo = (request.request.ttft_slo_s if request is not None else None) or self.ttft_slo_s
        return ttft_dec <= self.alpha * ttft_pf and ttft_dec <= slo

    # --- hooks ---------------------------------------------------------------------------
    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        tokens = request.request.prompt_tokens
        delays = [(self.predictor.delay(view, p), p) for p in view.prefill_ids]
        p_delay, p = min(delays) if delays else (math.inf, None)
        ttft_pf = p_delay + self.predictor.pt(tokens) + self.transfer_s(view, tokens, p)
        best = self.best_decode(view, tokens)
        if best is not None and (p is None or self.qualifies(best[0], ttft_pf, request)):
            return ArrivalPlan(best[1], best[1], best[2], plan.reject_reason, plan.role_changes)
        return ArrivalPlan(p, None, None, plan.reject_reason, plan.role_changes)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        return view.least_token_load(view.decode_ids)

    def tick(self, view: ClusterView) -> list[Decision]:
        """Re-fit the chunk of work already deflected to the batch it now shares, then
        re-plan prefills still waiting on prefill instances (queue order)."""
        retunes = [] if self.fixed_chunk else self._retune(view)  # live: the engine's chunk budget stands
        out: list[Decision] = []
        extra: dict[int, int] = {}
        for p in view.prefill_ids:
            ahead = 0.0
            for rid, left in list(view.instance(p).prefill_queue.items()):
                st = view.request(rid)
                own = self.predictor.pt(self.predictor.queued_tokens(view, p, rid, left))
                if st.phase is Phase.WAITING and left == st.request.prompt_tokens and st.chunk_limit_tokens is None:
                    best = self.best_decode(view, left, extra)
                    if best is not None and self.qualifies(best[0], ahead + own + self.transfer_s(view, left, p), st):
                        out.append(Deflect(rid, best[1], best[2]))
                        extra[best[1]] = extra.get(best[1], 0) + left
                        if len(out) >= self.max_replans:
                            return retunes + out
                        continue
                ahead += own
        return retunes + out

    def _retune(self, view: ClusterView) -> list[Decision]:
        """Decodes joined or left since a prefill was deflected: its chunk limit follows
        (at least ``min_chunk_tokens``, so deflected work always progresses)."""
        out: list[Decision] = []
        for n in view.decode_ids:
            queue = view.instance(n).prefill_queue
            if not queue:
                continue
            x = max(self.chunk_for(view, n)[0], self.min_chunk)
            out += [Deflect(rid, n, x) for rid in queue
                    if view.request(rid).chunk_limit_tokens not in (None, x)]
        return out


STAGES = {"kairos": Kairos}
