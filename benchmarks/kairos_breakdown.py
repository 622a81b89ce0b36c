"""Where PD's slowest first tokens go on Azure code (Kairos's motivating observation).

Runs ``baton simulate`` on the Kairos page's cluster (2P2D DeepSeek-V2-Lite on A100, the
first 3,000 requests of Azure code at ``--rate`` req/s, ``pd``) and splits the TTFT of the
requests at or above its P95 into the records' parts: queueing for a prefill instance
(``queue_s``), prefilling (``prefill_s``), the KV transfer (``transfer_s``) and the decode
side (``decode_wait_s``), each as a share of their summed TTFT. Also the KV a token holds
under the preset, what the median tail prompt's transfer takes, and how much longer the
tail's transfers take than each would alone on the link (the cluster's default NIC and
latency): a prefill batch finishes several prompts at once, and their KV leaves through
the same NIC, which the link model shares between the flows on it (``sim/network.py``).

Usage: python benchmarks/kairos_breakdown.py [--rate 6] [--traces DIR] [--record]
The last line is one JSON object: queue_share, prefill_share, transfer_share,
decode_share, tail_requests, p95_ttft_s, median_tail_prompt_tokens,
kv_bytes_per_token, median_tail_transfer_ms, median_tail_alone_ms (the median tail prompt's
transfer alone on the link), median_tail_over_alone (the median of each tail request's
transfer over its own alone).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from baton.perf import build  # noqa: E402
from baton.sim import ClusterSpec  # noqa: E402
from recorded import emit  # noqa: E402

PRESET = "deepseek-v2-lite@a100-80g"
PARTS = {"queue": "queue_s", "prefill": "prefill_s", "transfer": "transfer_s", "decode": "decode_wait_s"}


def simulate(trace: Path, rate: float, out: Path) -> Path:
    """The page's ``pd`` run; the path of its per-request records."""
    cmd = [sys.executable, "-m", "baton.cli.main", "simulate", "--trace", str(trace), "--requests", "3000",
           "--prefill", "2", "--decode", "2", "--preset", PRESET, "--ttft-slo", "3", "--tpot-slo", "0.1",
           "--rate", str(rate), "--policy", "pd", "--out", str(out), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"kairos_breakdown: baton simulate failed:\n{done.stderr[-2000:]}")
    return out / "pd.requests.csv"


def alone_s(prompt_tokens: float, kv_bytes_per_token: float, link: ClusterSpec) -> float:
    """A prompt's KV transfer with the link to itself (s): its bytes at the NIC's rate plus
    the one-way latency, as ``sim/network.py`` prices a flow that shares nothing."""
    return prompt_tokens * kv_bytes_per_token / link.nic_bytes_per_s + link.nic_latency_s


def breakdown(rows: list[dict], kv_bytes_per_token: float, link: ClusterSpec) -> dict:
    """Each part's share of the summed TTFT of the finished requests at or above P95 TTFT,
    and their transfers against the same transfers alone on ``link``."""
    done = [r for r in rows if r["finished"] == "true"]
    ttft = np.array([float(r["ttft_s"]) for r in done])
    p95 = float(np.percentile(ttft, 95))
    tail = [r for r, t in zip(done, ttft) if t >= p95]
    total = sum(float(r["ttft_s"]) for r in tail)
    out = {f"{k}_share": sum(float(r[col]) for r in tail) / total for k, col in PARTS.items()}
    out.update(tail_requests=len(tail), p95_ttft_s=p95,
               median_tail_prompt_tokens=float(np.median([int(r["prompt_tokens"]) for r in tail])),
               median_tail_transfer_ms=float(np.median([float(r["transfer_s"]) for r in tail])) * 1e3)
    out["median_tail_alone_ms"] = alone_s(out["median_tail_prompt_tokens"], kv_bytes_per_token, link) * 1e3
    out["median_tail_over_alone"] = float(np.median(
        [float(r["transfer_s"]) / alone_s(int(r["prompt_tokens"]), kv_bytes_per_token, link) for r in tail]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=6.0, help="arrival rate, req/s")
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces",
                    help="folder holding azure_code_2023.csv (Azure LLM inference trace 2023, AzurePublicDataset)")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    trace = args.traces / "azure_code_2023.csv"
    if not trace.is_file():
        sys.exit(f"kairos_breakdown: {trace} is missing: download AzureLLMInferenceTrace_code.csv from "
                 "github.com/Azure/AzurePublicDataset and save it there, or pass --traces DIR")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        with simulate(trace, args.rate, Path(tmp)).open() as f:
            kv_bytes = build(PRESET).kv_bytes_per_token
            figures = breakdown(list(csv.DictReader(f)), kv_bytes, ClusterSpec())  # the run's link: the defaults
    figures.update(rate_rps=args.rate, kv_bytes_per_token=kv_bytes)
    print(", ".join(f"{k} {figures[f'{k}_share']:.1%}" for k in PARTS) +
          f" of the TTFT of the {figures['tail_requests']} requests at or above P95 "
          f"({figures['p95_ttft_s']:.2f} s); the tail's transfers take {figures['median_tail_over_alone']:.2f}x "
          f"their time alone on the link (median)")
    emit("kairos-breakdown", figures, started, args.record)


if __name__ == "__main__":
    main()
