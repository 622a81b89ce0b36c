"""The KV handoff of a real prefill/decode pair, measured in isolation (issue 53's connector
profile step), used by ``benchmarks/fidelity_fleet.py``'s 1P1D case.

The simulator prices a PD handoff as a transfer over the instances' link: ``nic_latency_s``
plus the prompt's KV bytes at ``nic_gbps``. The pair ``make real-vllm`` runs moves KV with
vLLM's ExampleConnector: the prefill instance writes each layer's KV to files in a shared
folder during its forward pass and the decode instance reads them back in its own, a disk
path far slower than any NIC, with a second HTTP leg and the decode engine's admission on
top. Before the 1P1D trace, the pair serves a calibration trace alone (prompts of
``HANDOFF_PROMPTS`` tokens, ``HANDOFF_REPEATS`` times each, ``HANDOFF_GAP_S`` apart, so each
request finds both engines idle); the same trace is simulated on 1P1D with the default link;
the TTFT the simulator misses per request is fitted as a fixed cost plus a cost per prompt
token (least squares, neither below 0), and the link is set so that a transfer alone costs
what it did plus that. The calibration knows nothing of the loaded trace: what it sets is
the engine pair's own behaviour, as the profile is the engine's.

What a link cannot carry: both connector ends run inside an engine's forward pass, so under
load a save or a load also delays the other requests in that iteration (their TPOT), which
the simulator's transfer, running beside the engines, does not.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from baton.core.request import Request
from baton.sim import ClusterSpec

HANDOFF_PROMPTS = (64, 256, 512, 1024, 1536)
HANDOFF_REPEATS = 2
HANDOFF_GAP_S = 5.0
HANDOFF_OUTPUT_TOKENS = 4  # more than one: a one-token answer ends at the prefill, with no handoff
HANDOFF_IDS = 900_000  # the calibration's request ids, clear of the traces'


def handoff_trace() -> list[Request]:
    """The calibration requests: each prompt length ``HANDOFF_REPEATS`` times, one request
    every ``HANDOFF_GAP_S`` seconds."""
    prompts = HANDOFF_PROMPTS * HANDOFF_REPEATS
    return [Request(HANDOFF_IDS + k, k * HANDOFF_GAP_S, tokens, HANDOFF_OUTPUT_TOKENS)
            for k, tokens in enumerate(prompts)]


def fit_handoff(requests: list[Request], real: Mapping[int, tuple], sim: Mapping[int, tuple]) -> dict[str, float]:
    """The TTFT the simulator misses per request (``real`` and ``sim``: per request id,
    TTFT first, seconds) as ``fixed_s`` + ``per_token_s`` x prompt tokens, least squares
    with neither below 0 (a negative term is dropped and the other refitted alone); also
    the points used and the fit's mean absolute error on them (s)."""
    pairs = [(r.prompt_tokens, real[r.req_id][0] - sim[r.req_id][0]) for r in requests
             if r.req_id in real and r.req_id in sim]
    if len(pairs) < 2:
        raise ValueError(f"the handoff calibration needs two answered requests, got {len(pairs)}")
    x, y = np.array(pairs, dtype=np.float64).T
    per_token, fixed = np.polyfit(x, y, 1)
    if per_token < 0:
        per_token, fixed = 0.0, float(np.mean(y))
    if fixed < 0:
        fixed, per_token = 0.0, float(max(np.dot(x, y) / np.dot(x, x), 0.0))
    fixed = max(float(fixed), 0.0)
    error = float(np.mean(np.abs(fixed + per_token * x - y)))
    return {"fixed_s": fixed, "per_token_s": float(per_token), "points": len(pairs), "fit_mae_s": error}


def link_for(fixed_s: float, per_token_s: float, kv_bytes_per_token: float,
             base: ClusterSpec | None = None) -> dict[str, float]:
    """``nic_gbps`` and ``nic_latency_s`` whose transfer of a prompt alone costs what
    ``base``'s (the default link) does plus ``fixed_s`` + ``per_token_s`` a prompt token."""
    base = base or ClusterSpec()
    seconds_per_byte = 1.0 / base.nic_bytes_per_s + per_token_s / kv_bytes_per_token
    return {"nic_gbps": 8.0 / seconds_per_byte / 1e9, "nic_latency_s": base.nic_latency_s + fixed_s}
