"""The Kairos breakdown's arithmetic: each part's share of the tail's summed TTFT."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kairos_breakdown import alone_s, breakdown  # noqa: E402

from baton.sim import ClusterSpec  # noqa: E402

LINK = ClusterSpec(nic_gbps=8.0, nic_latency_s=0.001)  # 1e9 bytes/s


def _row(ttft: float, queue: float, prefill: float, transfer: float, decode: float, finished: str = "true",
         prompt: int = 100) -> dict:
    return {"finished": finished, "ttft_s": str(ttft), "queue_s": str(queue), "prefill_s": str(prefill),
            "transfer_s": str(transfer), "decode_wait_s": str(decode), "prompt_tokens": str(prompt)}


def test_shares_are_over_the_requests_at_or_above_p95_and_sum_to_one():
    fast = [_row(0.1, 0.0, 0.1, 0.0, 0.0) for _ in range(95)]
    slow = [_row(2.0, 1.5, 0.4, 0.05, 0.05, prompt=3000) for _ in range(5)]
    rejected = [_row(float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), finished="false")]
    out = breakdown(fast + slow + rejected, 1000.0, LINK)
    assert out["tail_requests"] == 5
    assert out["queue_share"] == pytest.approx(0.75)
    assert out["prefill_share"] == pytest.approx(0.2)
    assert out["transfer_share"] + out["decode_share"] == pytest.approx(0.05)
    assert out["median_tail_prompt_tokens"] == 3000
    assert out["median_tail_transfer_ms"] == pytest.approx(50.0)
    # alone: 3,000 tokens x 1,000 bytes at 1e9 bytes/s + 1 ms = 4 ms; the tail took 50
    assert out["median_tail_alone_ms"] == pytest.approx(4.0)
    assert out["median_tail_over_alone"] == pytest.approx(12.5)


def test_a_transfer_alone_is_its_bytes_at_the_nic_rate_plus_the_latency():
    assert alone_s(1662, 31104, ClusterSpec()) == pytest.approx(1662 * 31104 / 12.5e9 + 20e-6)
