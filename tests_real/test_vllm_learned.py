"""ARES's learned length predictor on real engines: a tiny MLP trained inside the step on
16 real generations (teacher-forced hidden states, torch in the vLLM environment), then
ARES with the learned estimator through the gateway, fed by Baton's vLLM plugin: hidden
states arrive every k tokens and greedy outputs are unchanged. (That predictions shrink as
requests progress is checked by benchmarks/length_predictor.py, on enough data.)"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from pathlib import Path

from baton.learn import generate, prompts
from baton.predict.learned import MLP
from tests.live import metric, post, start_gateway, wait_until
from tests_real.conftest import MODEL, NEEDS_VLLM, PY

pytestmark = NEEDS_VLLM
ROOT = Path(__file__).resolve().parents[1]
ALPACA = ROOT.parent / "shared" / "prompts" / "alpaca_5000.json"
FALLBACK = [("own:0", "Name three colours."), ("own:1", "Explain photosynthesis."), ("own:2", "Write a haiku."),
            ("own:3", "What is 2 + 2?"), ("own:4", "Describe a cat in detail."), ("own:5", "Say hi.")] * 3
EVERY = 16
GREEDY = {"max_tokens": 40, "temperature": 0.0, "ignore_eos": True}


def pipeline(step: str, data: Path, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([PY, "-m", "baton.learn.pipeline", step, "--data", str(data), *extra], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_ares_learned_gets_hidden_states_every_k_tokens_and_outputs_are_unchanged(stack, tmp_path):
    t0 = time.monotonic()
    source = prompts.alpaca(ALPACA) if ALPACA.exists() else [(f"{i}:{p}", t) for i, (p, t) in enumerate(FALLBACK)]
    data = tmp_path / "data"
    asyncio.run(generate.generate(stack["gw"].url, "smollm2", prompts.build([source], [16], 0.4, seed=0),
                                  data / "generations.jsonl", max_tokens=96, concurrency=8, timeout_s=300))
    assert len(generate.read_records(data / "generations.jsonl")) == 16
    pipeline("hidden", data, "--model", MODEL)
    pipeline("train", data)
    weights = data / "models" / "mlp_last.npz"
    assert MLP(weights).input_dim == 576
    print(f"\n16 generations, hidden states and a trained MLP in {time.monotonic() - t0:.0f} s")

    engines = [{"name": k, "url": stack[k].url, "role": k, "model": "smollm2", "hidden_states": stack[k].hidden_states,
                **({"hidden_states_key": stack[k].hidden_states_key} if stack[k].hidden_states_key else {})}
               for k in ("prefill", "decode")]
    policy = {"name": "ares-learned", "stages": [
        {"stage": "least-kv"}, {"stage": "ares", "estimator": "learned", "repredict_tokens": EVERY,
                                "estimator_params": {"weights": str(weights)}}]}
    gw = start_gateway(tmp_path, {"engines": engines, "policy": policy, "log_level": "debug",
                                  "upstream_timeout_s": 300, "first_token_timeout_base_s": 120,
                                  "token_timeout_min_s": 60})
    try:
        gw.wait_ready()
        assert wait_until(lambda: metric(gw.url, "baton_hidden_state_sources_connected") == 2, timeout_s=10)
        for prompt in ("The capital of France is", "Once upon a time,"):
            status, want = post(stack["decode"].url + "/v1/completions",
                                {"model": "smollm2", "prompt": prompt, **GREEDY}, timeout=300)
            status_gw, got = post(gw.url + "/v1/completions", {"model": "smollm2", "prompt": prompt, **GREEDY},
                                  timeout=300)
            assert status == status_gw == 200, got
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
            assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
        log = gw.log.read_text()
        predictions = metric(gw.url, 'baton_policy_report{key="length_predictions"}')
        states = metric(gw.url, "baton_hidden_states_total")
    finally:
        gw.stop()
    seen: dict[int, set[int]] = {}
    for req_id, generated in re.findall(r"hidden state: request (\d+) after (\d+) generated tokens", log):
        seen.setdefault(int(req_id), set()).add(int(generated))
    assert len(seen) == 2, log[-3000:]
    assert predictions == states >= 6  # one prediction per state: at 0, 16 and 32 tokens of each
    for req_id, gens in seen.items():
        # the states after 0, 16 and 32 generated tokens (those of the 1st, 17th and 33rd)
        assert {0, EVERY, 2 * EVERY} <= gens, (req_id, sorted(gens))
