"""Run one conformance case: its trace through the live gateway (in-process emulators)
and through the simulator, and collect everything the rules check.

After the last answer the case settles: it polls until the gateway and the engines hold
nothing (at most ``SETTLE_S``), and reads the tick counters twice, at least 1.5 tick
intervals apart, to see that the policy's periodic ticks still run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

import baton.core.settings as settings
from baton.core.flow_control import FlowControlSettings
from baton.core.info import InfoModel, ViewMode
from baton.metrics.summary import SLO
from baton.profiling.qoe import extras_for
from baton.sim import ClusterSpec
from baton.sim.runner import simulate
from baton.sim.simulator import SimResult
from tests.conformance.cases import PRESET, SCRAPE_INTERVAL_S, Case
from tests.conformance.client import Answer, send_all, xid_trace_id
from tests.conformance.harness import (CASE, CaseLogs, Cluster, LogLine, Samples, by_label, cluster, get_json, scrape,
                                       slowed_preset, total, until)

SETTLE_S = 4.0
TICKS = "baton_policy_ticks_total"


@dataclass(slots=True)
class Live:
    """What one case's live run left to check."""

    answers: list[Answer] = field(default_factory=list)
    decisions: list[tuple[str, int, int]] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)
    ticks_before: dict[str, float] = field(default_factory=dict)
    ticks_after: dict[str, float] = field(default_factory=dict)
    metrics: Samples = field(default_factory=dict)  # the gateway's, after the settle
    residue: dict[str, float] = field(default_factory=dict)
    engine_hits_tokens: float = 0.0  # prefix-cache hits summed over the engines, after the settle
    wall_s: float = 0.0


async def residue(session: aiohttp.ClientSession, c: Cluster) -> dict[str, float]:
    """Everything that must be zero once the trace is over, by name."""
    gw = await scrape(session, c.url)
    out = {"gateway in-flight requests": total(gw, "baton_inflight_requests"),
           "held prefills": total(gw, "baton_engine_held_prefills"),
           "admin in-flight requests": len((await get_json(session, c.url + "/admin/requests"))["requests"])}
    booked = (await get_json(session, c.url + "/admin/instances"))["in_flight"]
    out.update({f"bookings.{k}": v for k, v in booked.items()})
    if any(out.values()):
        return out  # the engines are read once the gateway holds nothing
    for k, url in enumerate(c.engines):
        engine = await scrape(session, url)
        out[f"engine {k} running"] = total(engine, "vllm:num_requests_running")
        out[f"engine {k} waiting"] = total(engine, "vllm:num_requests_waiting")
    return out


async def _settle(session: aiohttp.ClientSession, c: Cluster, live: Live) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    live.ticks_before = by_label(await scrape(session, c.url), TICKS, "stage")

    async def empty() -> bool:
        live.residue = await residue(session, c)
        return not any(live.residue.values())
    await until(empty, SETTLE_S, interval_s=0.1)
    wait = 1.5 * max(live.policy.get("ticks_s") or [0.0])
    await asyncio.sleep(max(0.0, started + wait - loop.time()))
    live.metrics = await scrape(session, c.url)
    live.ticks_after = by_label(live.metrics, TICKS, "stage")
    for url in c.engines:
        live.engine_hits_tokens += total(await scrape(session, url), "vllm:prefix_cache_hits_total")


async def run_live(case: Case, runtime: str = "gateway") -> Live:
    """The case's trace through gateway (or Envoy + endpoint picker) + emulators, then
    the settle."""
    CASE.set(case.name)
    live, t0 = Live(), time.monotonic()
    slo = case.slo()
    gateway = {"policy": case.policy, "scrape_interval_s": SCRAPE_INTERVAL_S,
               **({"ttft_slo_s": slo[0], "tpot_slo_s": slo[1]} if slo else {}),
               **({"flow_control": case.flow, "classes": {"client_headers": "all"}} if case.flow else {})}
    async with cluster(case.engines(), gateway, case.preset, case.kv_events, runtime) as c, \
            aiohttp.ClientSession() as session:
        live.policy = await get_json(session, c.url + "/admin/policy")
        # behind Envoy every request streams: a picker sees a non-streamed answer only when it
        # ends (booked as a queued prefill until then), which the simulator does not model
        live.answers = await send_all(session, c.front, case.requests(), c.started, streamed=runtime == "epp")
        live.decisions = trace_ids((await get_json(session, c.url + "/admin/decisions"))["decisions"], runtime)
        await _settle(session, c, live)
    live.wall_s = time.monotonic() - t0
    return live


def trace_ids(log: list[dict[str, Any]], runtime: str) -> list[tuple[str, int, int]]:
    """(kind, trace request id, instance) of each decision: by the X-Request-Id the client
    sent (``client.send``), where the runtime passed it on; else by arrival."""
    ids = [xid_trace_id(d.get("x_request_id")) for d in log]
    if all(i is not None for i in ids):
        return [(d["kind"], i, d["instance_id"]) for d, i in zip(log, ids)]
    decisions = [(d["kind"], d["req_id"], d["instance_id"]) for d in log]
    return in_arrival_order(decisions) if runtime == "workers" else decisions


def in_arrival_order(decisions: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Relay workers number their requests apart (their start number above
    ``relay.ID_BITS``); control logs placements in arrival order, which numbers them as one
    process does."""
    order: dict[int, int] = {}
    for _, rid, _ in decisions:
        order.setdefault(rid, len(order))
    return [(kind, order[rid], iid) for kind, rid, iid in decisions]


def run_sim(case: Case, jitter: list[float] | None = None, speed: float = 1.0, delay_s: float = 0.0,
            seed: int = 0) -> SimResult:
    """The same trace, cluster, preset, SLOs and scrape interval in the simulator;
    ``jitter`` (s per request), ``speed`` (engine time factor) and ``delay_s`` (scrapes
    seen that much later, as a gateway whose scrape loop drifts sees them) perturb it, and
    ``seed`` (the policy's random stream; the gateway's is seeded 0 like the default)."""
    p, d, m = case.cluster
    preset = slowed_preset(PRESET, case.time_scale * speed)
    slo = case.slo()
    requests = [replace(r, arrival_s=max(0.0, r.arrival_s + dt)) for r, dt in
                zip(case.requests(), jitter or [0.0] * len(case.trace))]
    flow = settings.parse(FlowControlSettings, case.flow, "flow_control") if case.flow else None
    return simulate(requests, ClusterSpec(prefill=p, decode=d, mixed=m, preset=preset), case.policy, seed=seed,
                    slo=SLO(*slo) if slo else None, info=InfoModel(ViewMode.SCRAPED, SCRAPE_INTERVAL_S, delay_s),
                    extras=extras_for(case.policy, case.preset), flow=flow)


# --- all cases ---------------------------------------------------------------------------------
CASE_TIMEOUT_S = 120.0
CONCURRENCY = int(os.environ.get("BATON_CONFORMANCE_CONCURRENCY", "6"))


@dataclass(slots=True)
class Outcome:
    """One case's live run, its simulation and the gateway's log lines during it."""

    case: Case
    live: Live
    sim: SimResult
    logs: list[LogLine]
    error: str = ""  # the harness could not finish the live run


async def _guarded(case: Case, slots: asyncio.Semaphore, runtime: str) -> tuple[Live, str]:
    async with slots:
        try:
            return await asyncio.wait_for(run_live(case, runtime), CASE_TIMEOUT_S), ""
        except Exception as exc:  # noqa: BLE001 - reported by every rule of the case
            return Live(), f"{type(exc).__name__}: {exc}"


async def _live_all(cases: list[Case], runtime: str, concurrency: int) -> tuple[list[tuple[Live, str]], list[str]]:
    """Every case's live run, ``concurrency`` at a time, longest first; then the tasks
    still pending on the loop (a clean shutdown leaves none)."""
    slots = asyncio.Semaphore(concurrency)
    order = sorted(cases, key=lambda c: -c.time_scale)
    done = dict(zip([c.name for c in order], await asyncio.gather(*(_guarded(c, slots, runtime) for c in order))))
    await asyncio.sleep(0)
    leaked = [repr(t) for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    return [done[c.name] for c in cases], leaked


@contextmanager
def _no_collections() -> Iterator[None]:
    """No garbage collection while the live runs run (reference counting still frees what
    they drop; their few cycles wait for the collection after them). Emulated engines,
    gateway and clients share this process, so a collection stalls them all at once, and
    after the session's earlier tests a full one took a quarter of a second (a hundred
    milliseconds even with the session's objects frozen out of its reach): a stall between
    an engine's KV event and the next request of its prefix let the two race, and
    kv-cost's hits fell from 7 prefixes to 5 in full-suite runs only. Engines and
    gateway are separate processes in any real deployment."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def run_all(cases: list[Case], runtime: str = "gateway",
            concurrency: int = CONCURRENCY) -> tuple[dict[str, Outcome], list[str]]:
    """Outcomes by case name, and the tasks left behind by the live runs (``concurrency``
    cases at a time: the cases wait on their traces' clocks, not on the CPU). What gateways
    fit at construction (CascadeInfer's QoE model, cached per process) is fitted first: a
    fit inside the event loop would stall every case running then."""
    for c in cases:
        extras_for(c.policy, c.preset)
    with CaseLogs() as logs, _no_collections():
        lives, leaked = asyncio.run(_live_all(cases, runtime, concurrency))
    out = {c.name: Outcome(c, live, run_sim(c), logs.of(c.name), error) for c, (live, error) in zip(cases, lives)}
    return out, leaked
