"""Real-engine fidelity beyond one engine's plain load (issue 53, its second part), used by
``benchmarks/fidelity_real.py`` after the one-instance cases:

- **two instances**: two vLLM CPU instances, each pinned to its own core with all its
  processes (taskset), colocated under least-loaded (``colocated``) and round-robin
  (``colocated-rr``), each run on the same Poisson trace at ``FLEET_LOAD`` of twice one
  instance's sustainable rate, and simulated on two mixed instances with the profile;
- **1P1D**: the same two pinned instances as a prefill and a decode with the
  ExampleConnector (the KV connector ``make real-vllm`` uses: KV through files in a shared
  folder), policy ``least-loaded``, at the same rate, simulated as 1 prefill + 1 decode
  over a link priced by the pair's own handoff, measured alone first
  (``fidelity_handoff``; the figures with the default link are kept beside);
- **prefix at load**: the multi-turn sessions trace on the one instance, with sessions
  arriving so that requests come at ``FLEET_LOAD`` of its sustainable rate.

Ranking: the two colocated policies by mean e2e latency over the same requests, real and
simulated, each with a paired bootstrap 90% interval of the difference (least-loaded minus
round-robin); the simulator agrees when its difference has the real one's sign, and
whether the real difference is decided (its interval excludes 0) is said beside it.
Every engine starts fresh for its case (empty prefix caches).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from baton.core.request import Request
from baton.gateway.replay import replay
from fidelity_handoff import fit_handoff, handoff_trace, link_for

FLEET_LOAD = 0.7
TWO_POLICIES = ("colocated", "colocated-rr")  # least-loaded and round-robin, colocated
SESSIONS_AT_LOAD = 20
BOOTSTRAP = 2000


def paired_difference(a: dict, b: dict, k: int = 2, seed: int = 0) -> dict[str, float]:
    """Mean of a's minus b's ``k``-th figure (default e2e, s) over the requests both
    finished, with a bootstrap 90% interval over those requests."""
    ids = sorted(set(a) & set(b))
    d = np.array([a[i][k] - b[i][k] for i in ids])
    if not len(d):
        return {"mean_s": math.nan, "lo_s": math.nan, "hi_s": math.nan, "requests": 0}
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (BOOTSTRAP, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [5, 95])
    return {"mean_s": float(d.mean()), "lo_s": float(lo), "hi_s": float(hi), "requests": len(ids)}


def ranking(real: dict[str, dict], sim: dict[str, dict]) -> dict:
    """Whether the simulator orders ``TWO_POLICIES`` by mean e2e as the real runs do."""
    first, second = TWO_POLICIES
    r, s = paired_difference(real[first], real[second]), paired_difference(sim[first], sim[second])
    decided = not (r["lo_s"] <= 0.0 <= r["hi_s"])
    return {"real": r, "sim": s, "agrees": bool(np.sign(r["mean_s"]) == np.sign(s["mean_s"])),
            "real_decided": decided}


def cores() -> tuple[int | None, int | None]:
    """Two cores to pin the two instances to (None, None where there are fewer)."""
    mine = sorted(os.sched_getaffinity(0))
    return (mine[0], mine[1]) if len(mine) >= 2 else (None, None)


def fleet_case(work: Path, roles: str, policy: str, requests: list[Request], tools, say: Callable[[str], None],
               before: list[Request] | None = None):
    """Start two pinned instances (``roles``: "mixed" or "pd") and a gateway with
    ``policy``, replay ``before`` (if given) and then ``requests``, stop them; (the records
    of ``before``, those of ``requests``, seconds, and per process group (the engines, the
    gateway) its CPU seconds and the seconds its threads waited for a CPU during
    ``requests``: ``cpu_waits``)."""
    from fidelity_loaded import group_schedstat
    name = f"{roles}-{policy}"
    kv_dir = work / f"{name}-kv" if roles == "pd" else None
    procs = []
    t0 = time.monotonic()
    try:
        pins = cores()
        for i in range(2):
            procs.append(tools.start_vllm(work, f"{name}-vllm{i}", pins[i], kv_dir))
        role = ("prefill", "decode") if roles == "pd" else ("mixed", "mixed")
        engines = [{"name": f"e{i}", "url": url, "role": role[i], "model": "smollm2"}
                   for i, (_, url) in enumerate(procs)]
        gateway = tools.start_gateway(work, engines, tools.profile, policy, f"{name}-gateway")
        procs.append(gateway)
        first = []
        if before:
            say(f"{name}: engines and gateway ready after {time.monotonic() - t0:.0f} s; {len(before)} requests alone")
            first = asyncio.run(replay(gateway[1], before, model="smollm2", timeout_s=900))
        say(f"{name}: ready after {time.monotonic() - t0:.0f} s; replaying {len(requests)} requests")
        names = [*(e["name"] for e in engines), "gateway"]
        before_run = [group_schedstat(proc.pid) for proc, _ in procs]
        live = asyncio.run(replay(gateway[1], requests, model="smollm2", timeout_s=900))
        waits = cpu_waits(names, before_run, [group_schedstat(proc.pid) for proc, _ in procs])
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(60)
    return first, live, time.monotonic() - t0, waits


def cpu_waits(names: list[str], before: list[tuple[float, float]],
              after: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Per process group: CPU seconds, seconds runnable but waiting for a CPU, and the
    wait's share of the two, between two ``group_schedstat`` samples."""
    out = {}
    for name, (run0, wait0), (run1, wait1) in zip(names, before, after):
        cpu_s, wait_s = run1 - run0, wait1 - wait0
        share = wait_s / (cpu_s + wait_s) if cpu_s + wait_s else 0.0
        out[name] = {"cpu_s": cpu_s, "wait_s": wait_s, "wait_share": share}
    return out


FLEET_CASES = (*TWO_POLICIES, "pd")


def run_fleet(work: Path, sustainable_rps: float, tools, say: Callable[[str], None],
              kinds: tuple[str, ...] = FLEET_CASES) -> dict:
    """The two-instance cases (``kinds`` of ``FLEET_CASES``: colocated under both
    policies, and 1P1D), each compared request by request with its simulation; ``tools``:
    fidelity_real's helpers bound to this run (start_vllm, start_gateway, profile,
    kv_bytes_per_token, simulate, compare, paired, write_pairs)."""
    from fidelity_loaded import CASE_SPAN_S, poisson_trace
    rate = FLEET_LOAD * 2 * sustainable_rps
    requests = poisson_trace(rate, CASE_SPAN_S, seed=53, least=100)
    out: dict = {"rate_rps": rate, "requests": len(requests), "cores": list(cores())}
    real_of, sim_of = {}, {}
    for key in kinds:
        roles, policy, sim_roles = ("pd", "least-loaded", (1, 1, 0)) if key == "pd" else ("mixed", key, (0, 0, 2))
        calibration = handoff_trace() if key == "pd" else None
        first, live, seconds, waits = fleet_case(work, roles, policy, requests, tools, say, calibration)
        real, failed = tools.paired(live, requests)
        link = None
        if calibration:
            out["handoff"], link = calibrated_link(calibration, first, tools, say)
            out["pd_default_link"] = {**tools.compare(real, tools.simulate(requests, sim_roles, policy, None)),
                                      "failed": failed}
        sim = tools.simulate(requests, sim_roles, policy, link)
        tools.write_pairs(work / f"fleet_{key}_requests.csv", requests, real, sim)
        figures = tools.compare(real, sim)
        figures.update(failed=failed, seconds=round(seconds), cpu_waits=waits)
        out[key], real_of[key], sim_of[key] = figures, real, sim
        say(f"{key} at {rate:.2f} req/s: TTFT MAPE {figures['ttft_mape']:.1%}, TPOT {figures['tpot_mape']:.1%}, "
            f"e2e {figures['e2e_mape']:.1%} ({failed} failed); waiting for a CPU: "
            + ", ".join(f"{n} {w['wait_share']:.0%} of {w['cpu_s'] + w['wait_s']:.0f} s" for n, w in waits.items()))
    if not set(TWO_POLICIES) <= set(real_of):
        return out
    out["ranking"] = ranking(real_of, sim_of)
    r = out["ranking"]
    say(f"ranking (mean e2e, {TWO_POLICIES[0]} minus {TWO_POLICIES[1]}): real {r['real']['mean_s']:+.3f} s "
        f"[{r['real']['lo_s']:+.3f}, {r['real']['hi_s']:+.3f}], simulated {r['sim']['mean_s']:+.3f} s "
        f"[{r['sim']['lo_s']:+.3f}, {r['sim']['hi_s']:+.3f}]: "
        + ("agrees" if r["agrees"] else "disagrees") + ("" if r["real_decided"] else " (the real runs do not decide it)"))
    return out


def calibrated_link(calibration: list[Request], live, tools, say: Callable[[str], None]) -> tuple[dict, dict]:
    """The handoff fitted from the calibration's answers (``fidelity_handoff``) and the link
    that prices it: (the figures, the link's ClusterSpec fields)."""
    real, failed = tools.paired(live, calibration)
    fit = fit_handoff(calibration, real, tools.simulate(calibration, (1, 1, 0), "least-loaded", None))
    link = link_for(fit["fixed_s"], fit["per_token_s"], tools.kv_bytes_per_token)
    with_link = tools.compare(real, tools.simulate(calibration, (1, 1, 0), "least-loaded", link))
    say(f"handoff alone: {fit['fixed_s'] * 1000:.0f} ms + {fit['per_token_s'] * 1000:.3f} ms a prompt token "
        f"(fit error {fit['fit_mae_s'] * 1000:.0f} ms over {fit['points']} requests, {failed} failed): a link of "
        f"{link['nic_gbps']:.3f} Gb/s and {link['nic_latency_s'] * 1000:.0f} ms; the calibration's TTFT MAPE with it "
        f"{with_link['ttft_mape']:.1%}")
    return {**fit, **link, "failed": failed, "calibration_ttft_mape": with_link["ttft_mape"]}, link


def arrival_rate(requests: list[Request]) -> float:
    """Requests per second over a trace's span (requests less one over first to last arrival)."""
    times = [r.arrival_s for r in requests]
    return (len(times) - 1) / max(max(times) - min(times), 1e-9)


def session_rate_for(rate_rps: float, trace: Callable[[float], list[Request]], rounds: int = 6) -> float:
    """The session start rate at which ``trace(session_rate)``'s requests arrive at
    ``rate_rps`` (``arrival_rate``). A session's turns follow its start by think times that do
    not scale with the start rate, and a few sessions' draws vary, so the rate is found by
    rescaling the realized one, not by dividing by the mean turns (which gave 0.25 req/s
    for a 0.19 target on the 20-session trace)."""
    session_rate = rate_rps / 4.0
    for _ in range(rounds):
        session_rate *= rate_rps / arrival_rate(trace(session_rate))
    return session_rate
