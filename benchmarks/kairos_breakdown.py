"""Where PD's slowest first tokens go on Azure code (Kairos's motivating observation).

Runs ``baton simulate`` on the Kairos page's cluster (2P2D DeepSeek-V2-Lite on A100, the
first 3,000 requests of Azure code at ``--rate`` req/s, ``pd``) and splits the TTFT of the
requests at or above its P95 into the records' parts: queueing for a prefill instance
(``queue_s``), prefilling (``prefill_s``), the KV transfer (``transfer_s``) and the decode
side (``decode_wait_s``), each as a share of their summed TTFT. Also the KV a token holds
under the preset and what the median tail prompt's transfer takes at the cluster's link.

Usage: python benchmarks/kairos_breakdown.py [--rate 6] [--traces DIR] [--record]
The last line is one JSON object: queue_share, prefill_share, transfer_share,
decode_share, tail_requests, p95_ttft_s, median_tail_prompt_tokens,
kv_bytes_per_token, median_tail_transfer_ms.
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


def breakdown(rows: list[dict]) -> dict:
    """Each part's share of the summed TTFT of the finished requests at or above P95 TTFT."""
    done = [r for r in rows if r["finished"] == "true"]
    ttft = np.array([float(r["ttft_s"]) for r in done])
    p95 = float(np.percentile(ttft, 95))
    tail = [r for r, t in zip(done, ttft) if t >= p95]
    total = sum(float(r["ttft_s"]) for r in tail)
    out = {f"{k}_share": sum(float(r[col]) for r in tail) / total for k, col in PARTS.items()}
    out.update(tail_requests=len(tail), p95_ttft_s=p95,
               median_tail_prompt_tokens=float(np.median([int(r["prompt_tokens"]) for r in tail])),
               median_tail_transfer_ms=float(np.median([float(r["transfer_s"]) for r in tail])) * 1e3)
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
            figures = breakdown(list(csv.DictReader(f)))
    figures.update(rate_rps=args.rate, kv_bytes_per_token=build(PRESET).kv_bytes_per_token)
    print(", ".join(f"{k} {figures[f'{k}_share']:.1%}" for k in PARTS) +
          f" of the TTFT of the {figures['tail_requests']} requests at or above P95 "
          f"({figures['p95_ttft_s']:.2f} s)")
    emit("kairos-breakdown", figures, started, args.record)


if __name__ == "__main__":
    main()
