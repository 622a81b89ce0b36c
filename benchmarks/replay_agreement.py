"""Simulator vs live: the replay test's trace through the simulator and through
``baton serve`` + three ``baton emulate`` processes (1P2D, least-loaded).

Prints each request's placement and TTFT/end-to-end latency on both sides; the last line
is one JSON object with the placement match and the largest differences (ms).
Usage: python benchmarks/replay_agreement.py [--record]  (``--record``: results/replay-agreement.json)
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.core.request import Request  # noqa: E402
from baton.gateway.replay import replay  # noqa: E402
from baton.sim import ClusterSpec  # noqa: E402
from baton.sim.runner import simulate  # noqa: E402
from tests.gateway.test_replay import TRACE  # noqa: E402
from tests.live import get, servers, start_emulator, start_gateway  # noqa: E402


def main() -> None:
    started = time.perf_counter()
    requests = [Request(i, t, p, o) for i, (t, p, o) in enumerate(TRACE)]
    sim = sorted(simulate(requests, ClusterSpec(prefill=1, decode=2), "least-loaded").records,
                 key=lambda r: r.req_id)
    tmp = Path(tempfile.mkdtemp(prefix="baton-replay-"))
    emus = [start_emulator(tmp) for _ in range(3)]
    engines = [{"name": n, "url": e.url, "role": r}
               for n, e, r in zip(("p0", "d0", "d1"), emus, ("prefill", "decode", "decode"))]
    gw = start_gateway(tmp, {"engines": engines, "policy": "least-loaded", "admin_token": "admin-token-for-tests"})
    with servers(*emus, gw):
        live = asyncio.run(replay(gw.url, requests))
        log = get(gw.url + "/admin/decisions", headers={"Authorization": "Bearer admin-token-for-tests"})[1]["decisions"]
    names = ["prefill-0", "decode-0", "decode-1"]  # the simulator's names of instances 0, 1, 2
    placed: dict[int, list[str]] = {}
    for entry in log:
        placed.setdefault(entry["req_id"], []).append(names[entry["instance_id"]])
    d_e2e, d_ttft = [], []
    for s, g in zip(sim, live):
        d_e2e.append((g.e2e_s - s.e2e_s) * 1e3)
        d_ttft.append((g.ttft_s - s.ttft_s) * 1e3)
        print(f"req {s.req_id}: sim {s.path} ttft {s.ttft_s * 1e3:7.1f} e2e {s.e2e_s * 1e3:7.1f} ms | "
              f"live {'>'.join(placed[s.req_id])} ttft {g.ttft_s * 1e3:7.1f} e2e {g.e2e_s * 1e3:7.1f} ms")
    match = all(">".join(placed[s.req_id]) == s.path for s in sim)
    figures = {"placements_match": match, "e2e_diff_ms_min": round(min(d_e2e), 1),
               "e2e_diff_ms_max": round(max(d_e2e), 1), "ttft_diff_ms_min": round(min(d_ttft), 1),
               "ttft_diff_ms_max": round(max(d_ttft), 1), "requests": len(sim),
               "sim_e2e_s_min": min(s.e2e_s for s in sim), "sim_e2e_s_max": max(s.e2e_s for s in sim),
               "per_decode_instance": sorted(Counter(s.path.split(">")[-1] for s in sim).values(), reverse=True)}
    print(json.dumps(figures))
    if "--record" in sys.argv[1:]:
        from baton.report.results import record
        record("replay-agreement", figures, time.perf_counter() - started,
               "python benchmarks/replay_agreement.py --record")


if __name__ == "__main__":
    main()
