"""CascadeInfer's parameters (``Cascade.Params``): layout, planning, range refinement,
handovers and Baton's plan guard (see ``cascade``, ``cascade_plan`` and ``cascade_guard``)."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.settings import setting


@dataclass(frozen=True, slots=True)
class CascadeParams:
    """CascadeInfer's parameters, its ablations' and those of Baton's guard on the planner."""

    layout: str = setting("plan", choices=("plan", "chain", "nopipe"),
                          doc="plan: stages re-planned every period; chain: one instance per stage on the fixed "
                              "length tiers; nopipe: one stage of every instance (the layout ablations)")
    exact: bool = setting(True, doc="plan with the exact DP (false: the paper's two-phase heuristic, a chain of "
                                    "one-instance stages then greedy merges)")
    refine: str = setting("qoe", choices=("qoe", "count", "memory", "off"),
                          doc="on ticks without a re-plan, move every stage bound toward the split of least Q(left) "
                              "+ Q(right) (qoe), equal counts (count) or equal context tokens (memory); off: none")
    balance: str = setting("bidask", choices=("bidask", "rr", "inter"),
                           doc="bidask: handovers by bid-ask auction, asks queued while receivers are busy, and "
                               "intra-stage balancing; inter: the auction between stages only; rr: round-robin "
                               "over the receivers with room")
    tick_interval_s: float = setting(1.0, gt=0, unit="s",
                                     doc="how often the stage ticks: refinement, queued asks, intra-stage balancing, "
                                         "the planning window's snapshots (plans are made on ticks too)")
    plan_interval_s: float = setting(10.0, ge=0, unit="s",
                                     doc="length of a period: with layout plan the stages are re-planned at the first "
                                         "tick after it ends; the per-stage output CV is reported per period")
    ema: float = setting(0.5, ge=0, le=1, doc="weight of a refinement's split point in the moving average of a "
                                              "stage bound (1: the bound jumps to it)")
    freeze_below: int = setting(5, ge=2, doc="fewest sequences a bound's refinement (the stage's decodes with its "
                                             "share of the next stage's) or a re-plan needs; with fewer it is skipped")
    outlier: float = setting(0.25, ge=0, doc="share above its stage's mean token load at which an instance gives its "
                                             "longest request to a peer (balance: bidask)")
    max_moves: int = setting(3, ge=1, doc="handovers an instance may have arriving, and may be sending, at once; a "
                                          "receiver at the limit does not bid, a sender at it waits")
    retry_tokens: int = setting(64, ge=1, unit="tokens",
                                doc="with no receiver bidding (or a move refused), the request asks again this many "
                                    "context tokens later")
    first_cut: int = setting(256, ge=1, unit="tokens",
                             doc="the planner's first tier edge, the others doubling from it (layout chain: the first "
                                 "stage's bound, the next ones doubling)")
    max_context: int = setting(131072, ge=1, unit="tokens",
                               doc="the planner's tier edges stay below this; the last stage is unbounded")
    mean_output_tokens: float = setting(256.0, gt=0, unit="tokens",
                                        doc="output tokens a move's KV transfer time is spread over in plan costs "
                                            "(cuts, the guard's moves); caps the stay a prefill is weighed by")
    assign: str = setting("stable", choices=("stable", "id"),
                          doc="after a re-plan, instances go to stages in order of the median context they hold "
                              "(stable: they keep their lengths) or of their ids (id)")
    rewatch: bool = setting(True, doc="after a re-plan, hand over sequences beyond their instance's new range and "
                                      "set the others' watches at their stage's new bound")
    plan_window: bool = setting(True, doc="plan on the period's tick snapshots, pooled and thinned to one concurrent "
                                          "population (false: on the snapshot at planning time)")
    prefill_residence_tokens: float = setting(128.0, ge=0, unit="tokens",
                                              doc="R, the QoE profile's output length: a stage weighs a prefill's "
                                                  "terms by R over the tokens it decodes there (0: unweighted)")
    starvation_s: float = setting(2.0, ge=0, unit="s",
                                  doc="an ask queued this long is served first (oldest first), before the asks "
                                      "ordered by their sender's token load")
    warmup_s: float = setting(0.0, ge=0, unit="s",
                              doc="no plan before this time (the first period ends at it)")
    hysteresis: float | None = setting(None, ge=0,
                                       doc="guard: take a new plan only when its predicted gain exceeds its moves' "
                                           "cost plus this share of the current cost (null: any plan)")
    prefill_share: float | None = setting(None, gt=0, le=1,
                                          doc="guard: share of an instance's prefill throughput a stage's arrivals may "
                                              "use, which sets the instances the stage keeps (null: no such rule)")
