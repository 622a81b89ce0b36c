"""Real-engine fidelity under load (issue 53, its first part): the sustainable rate of one
vLLM CPU instance found on the engine itself, then Poisson traces at 50%, 70% and 85% of
it replayed through the gateway and simulated with the engine's profile as the preset.

Used by ``benchmarks/fidelity_real.py`` (``make fidelity-real``), with the vLLM instance
and the gateway it started. The SLO is Baton's definition (a request meets it when its
TTFT and its TPOT are both within target; a rate is sustained at 90% of the requests of
its steady window, the arrivals after the first 10%), with targets ``SLO_SCALE`` times the
unloaded latency of the trace's mean request as the profile predicts it (its 576-token
prompt alone; one decode at 650 tokens of context): the engine sets the scale, as the
papers' "SLO scale" does. Probes of the rate search span ``PROBE_SPAN_S`` of arrivals.

Profile quality: the CPU time every other process on the machine used while the profile
was taken, as a share of the machine, is measured from /proc (all jiffies busy minus
vLLM's process group's and this process's); a share over ``BUSY_SHARE`` marks the profile
(and every figure resting on it) as taken on a busy machine.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baton.core.request import Request
from baton.gateway.replay import replay
from baton.metrics import SLO
from baton.perf.model import PerfModel, batch_shape

SLO_SCALE = 5.0
LOADS = (0.5, 0.7, 0.85)
PROBE_SPAN_S = 40.0
CASE_SPAN_S = 60.0
BUSY_SHARE = 0.15
MEAN_PROMPT, MEAN_CONTEXT = 576, 650  # the trace's prompts are uniform 128-1,024, outputs 16-128


def slo_of(perf: PerfModel) -> SLO:
    """``SLO_SCALE`` x the unloaded TTFT and TPOT of the mean request, from the profile."""
    ttft = perf.prefill_time_s(MEAN_PROMPT)
    tpot = perf.iteration_time_s(batch_shape([], [MEAN_CONTEXT]))
    return SLO(ttft_s=SLO_SCALE * ttft, tpot_s=SLO_SCALE * tpot)


def poisson_trace(rate_rps: float, span_s: float, seed: int, least: int = 60) -> list[Request]:
    """A Poisson trace spanning about ``span_s`` of arrivals (at least ``least`` requests):
    prompts uniform 128-1,024 tokens, outputs uniform 16-128."""
    n = max(least, int(rate_rps * span_s))
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    prompts, outputs = rng.integers(128, 1025, n), rng.integers(16, 129, n)
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


def attainment(live, requests: list[Request], slo: SLO) -> float:
    """Share of the steady window's requests (arrivals after the first 10%) that finished
    within both targets; a failed request is a miss."""
    last = requests[-1].arrival_s
    ok = n = 0
    for r, q in zip(live, requests):
        if q.arrival_s < 0.1 * last:
            continue
        n += 1
        if r.status != 200 or not math.isfinite(r.e2e_s):
            continue
        tpot = (r.e2e_s - r.ttft_s) / max(q.output_tokens - 1, 1)
        ok += r.ttft_s <= slo.ttft_s and tpot <= slo.tpot_s
    return ok / max(n, 1)


@dataclass
class Harness:
    """What the loaded cases act through: the gateway in front of the engine, the engine's
    prefix cache (emptied before every replay: the replay's filler prompts depend on the
    request id only, so two traces' request 0 share their first tokens, and vLLM would
    serve one from the other's blocks where the simulator sees unrelated prompts), the
    simulator with the engine's profile, the per-request comparison and the pairs' file."""

    gateway_url: str
    reset_cache: Callable[[], None]
    cache_hits: Callable[[], float]  # vLLM's prefix-cache hits so far (tokens)
    simulate: Callable[[list[Request]], dict]
    compare: Callable[[dict, dict], dict]
    write_pairs: Callable[[str, list[Request], dict, dict], None]
    say: Callable[[str], None]

    def replay(self, reqs: list[Request]) -> tuple[list, float]:
        """Replay ``reqs`` from an empty prefix cache: the records and vLLM's hits (tokens)."""
        self.reset_cache()
        before = self.cache_hits()
        live = asyncio.run(replay(self.gateway_url, reqs, model="smollm2", timeout_s=900))
        return live, self.cache_hits() - before


@dataclass
class RateSearch:
    """The engine's sustainable rate: doubling from ``start_rps`` while a probe attains
    90%, then ``bisections`` geometric halvings of the bracket."""

    harness: Harness
    slo: SLO
    start_rps: float = 1.0
    bisections: int = 3
    tried: list[tuple[float, float]] | None = None

    def passes(self, rate: float) -> bool:
        reqs = poisson_trace(rate, PROBE_SPAN_S, seed=11 + len(self.tried or []))
        live, _ = self.harness.replay(reqs)
        att = attainment(live, reqs, self.slo)
        self.tried = (self.tried or []) + [(rate, att)]
        self.harness.say(f"rate search: {rate:.2f} req/s, {len(reqs)} requests: attainment {att:.3f}")
        return att >= 0.9

    def run(self) -> float:
        lo, hi = 0.0, self.start_rps
        for _ in range(8):
            if not self.passes(hi):
                break
            lo, hi = hi, hi * 2
        if lo == 0.0:  # even the start missed: search below it
            lo = hi / 8
        for _ in range(self.bisections):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if self.passes(mid) else (lo, mid)
        return lo


def loaded_cases(harness: Harness, sustainable_rps: float) -> dict[str, dict]:
    """Replay and simulate a Poisson trace at each of ``LOADS`` x the sustainable rate;
    per load, ``compare``'s MAPEs and percentile ratios (keyed "50", "70", "85"), and the
    per-request pairs in ``loaded_<load>_requests.csv``."""
    out = {}
    for k, load in enumerate(LOADS):
        rate = load * sustainable_rps
        reqs = poisson_trace(rate, CASE_SPAN_S, seed=31 + k, least=100)
        live, hits = harness.replay(reqs)
        real = {r.req_id: (r.ttft_s, (r.e2e_s - r.ttft_s) / max(q.output_tokens - 1, 1), r.e2e_s)
                for r, q in zip(live, reqs) if r.status == 200 and math.isfinite(r.e2e_s)}
        sim = harness.simulate(reqs)
        key = f"{round(load * 100)}"
        harness.write_pairs(f"loaded_{key}_requests.csv", reqs, real, sim)
        figures = harness.compare(real, sim)
        figures.update(load=load, rate_rps=rate, requests=len(reqs), failed=len(reqs) - len(real),
                       vllm_prefix_hit_tokens=hits)
        out[key] = figures
        harness.say(f"load {load:.0%} ({rate:.2f} req/s, {len(reqs)} requests): TTFT MAPE "
                    f"{figures['ttft_mape']:.1%}, TPOT {figures['tpot_mape']:.1%}, e2e {figures['e2e_mape']:.1%} "
                    f"(vLLM prefix-cache hits: {hits:.0f} tokens)")
    return out


def _jiffies(stat_line: str) -> int:
    """utime + stime of a /proc/PID/stat line (fields after the command's closing paren)."""
    rest = stat_line.rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def group_jiffies(pgid: int) -> int:
    """CPU jiffies of every live process in process group ``pgid``."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(line.rsplit(")", 1)[1].split()[2]) == pgid:
            total += _jiffies(line)
    return total


def group_schedstat(pgid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) summed over the threads of
    every live process in group ``pgid`` (/proc/PID/task/TID/schedstat: the scheduler's own
    accounting, so the wait is time other work held the CPU the thread could run on)."""
    run_ns = wait_ns = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                run_ns, wait_ns = run_ns + int(fields[0]), wait_ns + int(fields[1])
        except OSError:
            continue
    return run_ns / 1e9, wait_ns / 1e9


def machine_busy_jiffies() -> int:
    """All CPUs' busy jiffies (user, nice, system, irq, softirq, steal) from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)


class BusyMeter:
    """The share of the machine other processes used between ``start`` and ``stop``:
    everything busy minus ``pgid``'s group and this process."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    def _sample(self) -> tuple[int, int, int]:
        return machine_busy_jiffies(), group_jiffies(self.pgid), _jiffies(Path("/proc/self/stat").read_text())

    def start(self) -> None:
        self.t0, self.s0 = os.times().elapsed, self._sample()

    def stop(self) -> float:
        s1, elapsed = self._sample(), os.times().elapsed - self.t0
        others = (s1[0] - self.s0[0]) - (s1[1] - self.s0[1]) - (s1[2] - self.s0[2])
        ticks = os.sysconf("SC_CLK_TCK") * max(elapsed, 1e-9) * (os.cpu_count() or 1)
        return max(0.0, others / ticks)
