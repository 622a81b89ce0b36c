"""One conformance case per policy (the table ``CASES``): the cluster it needs, the trace
that makes it act, whether its placements must match the simulator's exactly, and what it
must do. A policy added to the catalog without a row here fails
``test_cases.py::test_every_catalog_policy_has_a_case``.

``EXACT`` (deterministic) means: no random draws, and every decision depends only on the
router's own bookings (request counts, queued prompt tokens, contexts of the decodes it
relays), never on scraped engine metrics or on the phase of a periodic tick. Their live
placements must equal the simulator's request by request. ``DISTRIBUTION``: every other
policy; its placements must spread over the instances as the simulator's do (see
``test_conformance.py``). The reason is in each row (``why``).

Timing. Every case runs on ``PRESET`` slowed ``time_scale`` times (3 for EXACT, 2 for the
others) in all three runtimes alike, the gateway's policy included (its SLOs and the
trace's arrivals stretched alike), so that the live run's timing noise on a loaded
2-core machine is small next to the trace's margins. EXACT traces come in two waves whose
decisions sit far from any completion (the first wave's short answers end before the
second wave arrives, its long ones after the second wave is placed). Every trace is
checked in the simulator under perturbed timing (``test_cases.py``): EXACT traces keep
every placement, acting traces still act, the others keep their spread.

``acts``: the actions the policy exists to take on its trace ("migrations",
"deflections", "flips"), each of which must happen live and in the simulator; any action
not listed must happen in neither.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from baton.core.request import Request
from tests.conformance.harness import slowed_preset

PRESET = "llama-3.1-8b@a100-80g"
SCRAPE_INTERVAL_S = 1.0
EXACT_TIME_SCALE = 3.0  # bookings-only policies: slow engines give timing noise no purchase
TIME_SCALE = 2.0
LEAD_S = 0.1  # the gateway's first scrapes are done when the trace starts; ticks keep their phase
EXACT, DISTRIBUTION = "exact", "distribution"
TVD_TOLERANCE = 0.2  # see test_conformance.py
MIGRATES, DEFLECTS, FLIPS = frozenset({"migrations"}), frozenset({"deflections"}), frozenset({"flips"})
SLO = (0.5, 0.05)  # TTFT, TPOT (s) at the preset's own speed


def trace(rows: list[tuple[float, int, int]]) -> tuple[Request, ...]:
    """(arrival s, prompt tokens, output tokens) rows as requests 0, 1, ..."""
    return tuple(Request(i, t, p, o) for i, (t, p, o) in enumerate(rows))


def classed(rows: list[tuple[float, int, int, int, str]]) -> tuple[Request, ...]:
    """(arrival s, prompt tokens, output tokens, priority band, tenant) rows as requests."""
    return tuple(Request(i, t, p, o, priority=b, tenant=n) for i, (t, p, o, b, n) in enumerate(rows))


@dataclass(frozen=True)
class Case:
    """A policy on a cluster (``prefill``/``decode``/``mixed`` instances, ids in that
    order in both runtimes) with its trace."""

    name: str
    policy: Any  # a catalog name or a {name, stages} mapping
    cluster: tuple[int, int, int]
    trace: tuple[Request, ...]
    compare: str
    why: str
    acts: frozenset[str] = frozenset()
    slo_s: tuple[float, float] | None = None  # (TTFT, TPOT) on PRESET, for SLO-aware policies
    flow: dict[str, Any] | None = None  # flow control's settings (config key flow_control); classes by header

    @property
    def time_scale(self) -> float:
        """How many times slower than ``PRESET`` the case's engines run (arrivals, SLOs
        and the preset itself stretched alike in both runtimes)."""
        return EXACT_TIME_SCALE if self.compare == EXACT else TIME_SCALE

    @property
    def preset(self) -> str:
        return slowed_preset(PRESET, self.time_scale)

    def slo(self) -> tuple[float, float] | None:
        return (self.slo_s[0] * self.time_scale, self.slo_s[1] * self.time_scale) if self.slo_s else None

    def requests(self) -> list[Request]:
        """The trace in both runtimes' clocks (0: the gateway is built, the simulation
        starts): ``LEAD_S`` later, arrivals stretched by ``time_scale``."""
        return [replace(r, arrival_s=LEAD_S + r.arrival_s * self.time_scale) for r in self.trace]

    @property
    def kv_events(self) -> bool:
        """Whether the trace has prefix identity: its emulators then publish KV events and
        the gateway subscribes to them (prefix-aware policies read the engines' caches)."""
        return any(r.prefix_ids for r in self.trace)

    def engines(self) -> list[tuple[str, str, int]]:
        """(name, role, max batched tokens) of each emulator, in instance-id order."""
        p, d, m = self.cluster
        return ([(f"p{k}", "prefill", 8192) for k in range(p)] + [(f"d{k}", "decode", 8192) for k in range(d)]
                + [(f"m{k}", "mixed", 8192) for k in range(m)])


# 1P2D, two waves (EXACT: robust for every PD policy below; deflect-short deflects 4)
PD = trace([(0.0, 2200, 108), (0.15, 1000, 337), (0.3, 1000, 82), (0.45, 150, 331), (0.6, 150, 56),
            (0.75, 150, 43), (1.8, 300, 20), (1.95, 1000, 60), (2.1, 2200, 90), (2.25, 1000, 40),
            (2.4, 1500, 20), (2.55, 600, 60)])
# 1P2D: a 9,000-token prompt keeps 9,000 tokens queued on p0 while 1-3 arrive (deflected)
QUEUE = trace([(0.0, 9000, 40), (0.15, 300, 340), (0.3, 300, 380), (0.45, 1000, 60), (1.6, 2200, 90),
               (1.75, 150, 90), (1.9, 1500, 20), (2.05, 2200, 90), (2.2, 1000, 90), (2.35, 600, 60),
               (2.5, 1500, 20), (2.65, 300, 40)])
# 1P2D: a burst of 3,500-token prompts queues p0 past the TTFT SLO (0.5 s at the preset's speed)
BURST = trace([(0.0, 200, 300), (0.1, 3500, 10), (0.2, 3500, 30), (0.3, 3500, 30), (0.4, 3500, 30),
               (0.5, 3500, 10), (0.6, 200, 200), (1.4, 1000, 60), (1.55, 500, 60), (1.7, 300, 30),
               (1.85, 2000, 40), (2.0, 1000, 30)])
# BURST with short prompts after it: Kairos's decode path costs whole iterations of about
# the TBT SLO each (ceil(prompt / chunk) of them) whatever the engine speed, its prefill path
# scales with it, so prompts of 500-2,000 tokens sit within 20% of its choice and flip on
# engines 1.2x slower; prompts of 200-300 tokens fit one decode iteration and stay 1.6x away
BURST_THEN_SHORT = trace([*((r.arrival_s, r.prompt_tokens, r.output_tokens) for r in BURST[:7]),
                          (1.4, 300, 60), (1.55, 250, 60), (1.7, 300, 30), (1.85, 200, 40), (2.0, 300, 30)])
# 1P2D: a 7,000-token prompt first, then long answers with small prompts, short ones only
# after several rebalancing rounds: a placement by (scraped) KV usage leaves the decode
# loads uneven as requests end, so a rebalancer has moves to make (ARES without a learned
# survival table: the first completion would teach it that answers are short)
IMBALANCE = trace([(0.0, 7000, 100), (1.2, 200, 380), (1.35, 300, 340), (1.5, 200, 340), (1.65, 150, 380),
                   (3.2, 800, 20), (3.32, 1200, 20), (3.44, 1200, 30), (3.56, 300, 20), (3.68, 500, 30),
                   (3.8, 300, 30), (3.92, 500, 20)])
# 1P2D: six long answers placed within the first scrape interval (stale KV usage: they
# herd) and before any completion teaches the survival table
LONG_FIRST = trace([(0.0, 300, 420), (0.1, 1500, 400), (0.2, 200, 430), (0.3, 2500, 410), (0.4, 250, 420),
                    (0.5, 600, 400), (1.15, 300, 60), (1.27, 1000, 40), (1.39, 500, 60), (1.51, 700, 40),
                    (1.63, 400, 50), (1.75, 900, 30)])
# the same six long answers, and the short second wave later (from 2.4 s, past the second
# scrape): ARES's decode binding (least KV usage, scraped) on LONG_FIRST's second wave at
# 1.15 s turned on where that scrape fell, and in the simulator slower engines with late
# scrapes put all twelve on one instance (TVD 0.25 against 0.2 allowed) as a cold live run
# did; here no perturbation of a 180-run grid goes past 0.17
LONG_FIRST_LATE = trace([(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in LONG_FIRST[:6]]
                        + [(2.4, 300, 60), (2.52, 1000, 40), (2.64, 500, 60), (2.76, 700, 40), (2.88, 400, 50),
                           (3.0, 900, 30)])
# 4 mixed, two waves (colocated placement)
MIXED = trace([(0.0, 300, 368), (0.15, 600, 95), (0.3, 2200, 369), (0.45, 1000, 352), (0.6, 1000, 56),
               (0.75, 600, 43), (0.9, 200, 400), (1.05, 150, 400), (1.8, 2200, 60), (1.95, 2200, 60),
               (2.1, 600, 60), (2.25, 1500, 90)])
# 4 mixed: 6,000-token prompts with short answers keep m1-m3 busy while four long answers
# pile up on m0 (all seven in flight at the first tick, when CascadeInfer plans its stages);
# then m1-m3 drain and m0 is the outlier
# (the tail starts at 2.0 s, after the three 6,000-token requests have ended even on engines
# 1.2x slower: at 1.4 s it met their ends, and where it went hung on which ended first)
DRAIN = trace([(0.0, 300, 300), (0.05, 6000, 60), (0.1, 6000, 60), (0.15, 6000, 60), (0.2, 150, 300),
               (0.25, 300, 300), (0.3, 200, 300), (2.0, 600, 40), (2.15, 2200, 20), (2.3, 150, 20),
               (2.45, 1500, 60), (2.6, 1000, 40)])
# 4 mixed: the same start, then answers long enough to grow across the stage bounds that
# CascadeInfer planned at its first tick (handovers between stages)
GROWTH = trace([(0.0, 150, 350), (0.05, 6000, 60), (0.1, 6000, 60), (0.15, 6000, 60), (0.2, 800, 350),
                (0.25, 300, 350), (0.3, 400, 350), (1.4, 300, 250), (1.52, 300, 250), (1.64, 150, 150),
                (1.76, 600, 40), (1.88, 300, 250)])


def shared_prefixes(rows: list[tuple[float, int | None, int, int]], system_blocks: int = 40) -> tuple[Request, ...]:
    """(arrival s, system prompt or None, prompt tokens, output tokens) rows as requests
    with prefix identity: a system prompt's first ``system_blocks`` 16-token blocks are
    shared by every request naming it, the rest of each prompt is its own."""
    out = []
    for i, (t, group, prompt, output) in enumerate(rows):
        blocks = -(-prompt // 16)
        shared = [1_000_000 * (group + 1) + k for k in range(system_blocks)] if group is not None else []
        own = [7_000_000 + 1000 * i + k for k in range(blocks - len(shared))]
        out.append(Request(i, t, prompt, output, tuple(shared + own), 16))
    return tuple(out)


# 4 mixed: three system prompts of 640 tokens (and two prompts with none) in two waves;
# a prefix-aware router keeps each system prompt's requests together. Arrivals sit between
# scrapes (at 0.1 + 2t s live, scrapes every second), so KV usage reads the same in the
# perturbed runs (kv-cost weighs it against the cached blocks)
PREFIX = shared_prefixes([(0.1, 0, 900, 60), (0.15, 1, 800, 60), (0.2, 2, 1000, 60), (0.25, 0, 760, 60),
                          (0.3, None, 700, 60), (0.6, 1, 950, 60), (1.6, 2, 800, 40), (1.65, 0, 1100, 40),
                          (1.7, 1, 700, 40), (1.75, 0, 850, 40), (1.8, None, 900, 40), (2.1, 2, 760, 40)])
# 4 mixed: long answers of mixed prompts that outlast cascade-guarded's 10 s warm-up (live
# seconds: the trace's arrivals run at 0.1 + 2t), then a second wave after its first plan.
# The plan is made on a randomly thinned window, so it differs from draw to draw: the second
# wave's short prompts answer long enough to cross any first-stage bound a plan sets (or be
# moved by the one-stage outlier rule), whatever the draws
WARM = trace([(0.0, 150, 1200), (0.05, 3000, 1200), (0.1, 200, 1200), (0.15, 6000, 60), (0.2, 800, 1200),
              (0.25, 300, 1200), (0.3, 400, 1200), (5.5, 300, 1200), (5.6, 3000, 100), (5.7, 150, 1200),
              (5.8, 600, 40), (5.9, 300, 1200)])

# 1P1D under flow control (two bands, tenants a and b; one decode instance: the order is the
# point, not the decode choice): an 8,000-token prompt fills p0's
# queue past max_queued_prefill_tokens while eight more arrive and wait; at most six wait
# (the seventh and ninth arrivals push out band 0's newest: 6 and 8 are shed); when the
# long prefill ends, all six go at once: band 1 first (3, 5, 7: VTC alternates a and b),
# then band 0 (1, 4, 2: b's 4 before a's second). FCFS would send 1, 2, 4. The last two
# arrive into an idle cluster and go at once.
FLOW = classed([(0.0, 8000, 4, 0, "a"), (0.05, 1000, 40, 0, "a"), (0.1, 1000, 40, 0, "a"), (0.15, 500, 40, 1, "a"),
                (0.2, 1000, 40, 0, "b"), (0.25, 500, 40, 1, "b"), (0.3, 1000, 40, 0, "a"), (0.35, 500, 40, 1, "a"),
                (0.4, 1000, 40, 0, "b"), (2.0, 300, 30, 1, "b"), (2.1, 600, 30, 0, "a")])
FLOW_CONTROL = {"enabled": True, "fairness": "vtc", "ordering": "fcfs", "max_queued": 6,
                "max_queued_prefill_tokens": 4096, "max_kv_usage": 1.0}  # bookings only: no scraped KV usage

PD1P2D, PD1P3D, MIXED4 = (1, 2, 0), (1, 3, 0), (0, 0, 4)
BOOKINGS = "own bookings only"
SCRAPED = "reads scraped engine metrics"
SIBYL_WHY = "observed decode rates and completions (timing) shape its projections"


def _sibyl(name: str) -> Case:
    return Case(name, name, PD1P2D, PD, DISTRIBUTION, SIBYL_WHY)


def _cascade(name: str, tr: tuple[Request, ...] = GROWTH) -> Case:
    return Case(name, name, MIXED4, tr, DISTRIBUTION, "stage bounds planned and refined at ticks (the plan's "
                "window thinned at random); handovers by tick phase", MIGRATES)


CASES: list[Case] = [
    Case("round-robin", "round-robin", PD1P2D, PD, EXACT, "turn counter"),
    Case("least-loaded", "least-loaded", PD1P2D, PD, EXACT, BOOKINGS + " (token load)"),
    Case("pd", "pd", PD1P2D, PD, EXACT, BOOKINGS + " (token load)"),
    Case("least-requests", "least-requests", PD1P2D, PD, EXACT, BOOKINGS + " (request counts)"),
    Case("least-outstanding", "least-outstanding", PD1P2D, PD, EXACT, BOOKINGS + " (request counts), bound early"),
    Case("rr-early", "rr-early", PD1P2D, PD, EXACT, "turn counter, bound early"),
    Case("static-xpyd", "static-xpyd", PD1P2D, PD, EXACT, "turn counters per group"),
    Case("deflect-short", "deflect-short", PD1P2D, PD, EXACT, "prompt length rule + token load", DEFLECTS),
    Case("deflect-queue", "deflect-queue", PD1P2D, QUEUE, EXACT, "queued prompt tokens + token load", DEFLECTS),
    Case("pd+flow-control", "pd", (1, 1, 0), FLOW, EXACT, BOOKINGS + "; flow control on queued prompt tokens "
         "(bookings) and bands, VTC, FCFS, a queue cap", flow=FLOW_CONTROL),
    Case("colocated", "colocated", MIXED4, MIXED, EXACT, BOOKINGS + " (token load)"),
    Case("colocated-rr", "colocated-rr", MIXED4, MIXED, EXACT, "turn counter"),
    Case("least-kv", "least-kv", PD1P2D, PD, DISTRIBUTION, SCRAPED + " (KV usage)"),
    Case("pd-kv", "pd-kv", PD1P2D, PD, DISTRIBUTION, SCRAPED + " (KV usage)"),
    Case("ils", "ils", PD1P2D, PD, DISTRIBUTION, SCRAPED + " (running requests)"),
    Case("power-of-two", "power-of-two", PD1P3D, PD, DISTRIBUTION, "random draws (1P3D: more than two candidates)"),
    *(_sibyl(n) for n in ("sibyl", "sibyl-prob1", "sibyl-no-type1", "sibyl-no-type2", "sibyl-no-type3",
                          "sibyl-reqlevel")),
    Case("ares", "ares", PD1P2D, LONG_FIRST_LATE, DISTRIBUTION, SCRAPED + " (KV usage); tick-phase migrations", MIGRATES),
    *(Case(n, n, PD1P2D, IMBALANCE, DISTRIBUTION, SCRAPED + " (KV usage); tick-phase migrations"
           + ("; random prediction error" if n == "ares-learned-error" else ""), MIGRATES)
      for n in ("ares-none", "ares-oracle", "ares-learned-error")),
    Case("arrow", "arrow", PD1P2D, BURST, DISTRIBUTION, SCRAPED + " (token intervals); monitor ticks", FLIPS,
         SLO),
    Case("arrow-static", "arrow-static", PD1P2D, BURST, DISTRIBUTION, SCRAPED + " (token intervals)",
         slo_s=SLO),
    Case("kairos", "kairos", PD1P2D, BURST_THEN_SHORT, DISTRIBUTION, "TTFT/TBT predictions on live queues; replan ticks",
         DEFLECTS, SLO),
    Case("kairos-reactive", "kairos-reactive", PD1P2D, BURST_THEN_SHORT, DISTRIBUTION, "TTFT/TBT predictions on live queues",
         DEFLECTS, SLO),
    *(_cascade(n) for n in ("cascade", "cascade-chain", "cascade-refine-count", "cascade-refine-memory",
                            "cascade-rr-handover", "cascade-interstage-only")),
    _cascade("cascade-nopipe", DRAIN),
    _cascade("cascade-guarded", WARM),  # the first plan after its warm-up, then the guard's rules  # one stage: only the intra-stage outlier rule moves work
    Case("llumnix", "llumnix", MIXED4, DRAIN, DISTRIBUTION, "scraped KV usage in its freeness; tick-phase "
         "migrations", MIGRATES),
    # prefix-aware routing: engine caches live from the emulators' KV events (precise, kv-cost),
    # or the router's own history of where it sent which blocks (approx, cache-aware)
    Case("prefix-precise", "prefix-precise", MIXED4, PREFIX, DISTRIBUTION, "engine caches (KV events) and scraped "
         "KV usage and queues"),
    Case("prefix-approx", "prefix-approx", MIXED4, PREFIX, DISTRIBUTION, "own routing history and scraped KV usage "
         "and queues"),
    Case("kv-cost", "kv-cost", MIXED4, PREFIX, DISTRIBUTION, "engine caches (KV events) and scraped KV usage"),
    Case("cache-aware", "cache-aware", MIXED4, PREFIX, EXACT, "own routing history and request counts"),
    Case("prefix-precise+sibyl", "prefix-precise+sibyl", PD1P2D, PREFIX, DISTRIBUTION,
         "engine caches (KV events); " + SIBYL_WHY),
    # Baton's combined scheduler: on the two-wave trace its deflections act (2-4 of them in
    # every perturbed run); its flips need prefill demand held for a second (on the bursts of
    # BURST one happens only on engines 1.2x slower: not a stable case) and its migrations a
    # projected KV overflow, neither of which this trace has
    Case("combined", "combined", PD1P2D, PD, DISTRIBUTION, "TTFT/TBT predictions on live queues; replan, flip "
         "and migration ticks", DEFLECTS, SLO),
    # composed stage lists: those of examples/*.yaml (none today) and one of two ticking stages
    Case("sibyl+ares-none", {"name": "sibyl+ares-none", "stages": [
        {"stage": "sibyl"}, {"stage": "ares", "estimator": "none"}]}, PD1P2D, LONG_FIRST, DISTRIBUTION,
         SIBYL_WHY + "; tick-phase migrations", MIGRATES),
]
BY_NAME = {c.name: c for c in CASES}
