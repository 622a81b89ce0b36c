"""A long live run of one policy: gateway + emulators on 127.0.0.1 under steady traffic.

Starts ``--prefill`` prefill and ``--decode`` decode emulators (or ``--mixed`` colocated
ones) and ``baton serve`` with ``--policy`` (default ``ares``), then sends Poisson traffic
at ``--rate`` requests/s for ``--seconds``: prompts uniform in [64, ``--prompt-high``]
tokens, outputs uniform in [``--output-low``, ``--output-high``] (``ignore_eos``), half
completions (token-id prompts) and half chat, each streamed or not. The defaults are
ARES's regime, long outputs on few decode instances (256-4,096 tokens at 2 requests/s on
1P2D), where the simulator migrates a request every few seconds; with short outputs ARES
rarely finds a move worth its cost, live or simulated.
Every ``--report-s`` seconds it reads the gateway's /metrics and prints the policy's tick
count (successful and failed), migrations by result, deflections, role flips, stale
decisions and requests by outcome, so a policy that stops acting shows as a flat line.
At the end it waits for the requests in flight, then checks the residue (the gateway's
bookings and held prefills, and the emulators' running and waiting requests) is zero.

With ``--chaos`` a decode engine is hurt every ``--chaos-every-s`` seconds, in turn:
SIGKILLed and restarted on its port 5 s later, or SIGSTOPped for 8 s (a hang with its
connections open). Requests on it continue on the other decode engines, token-exact.
With ``--workers 2`` (``baton serve --workers``) the chaos also SIGKILLs a relay worker
every third time (the supervisor starts another): the requests that relay carried (listed
by ``/admin/requests`` just before) lose their connection; every other request must be
answered whole. The client opens a connection per request, as a fleet's load balancer
spreads them; a request whose connection the dying relay had accepted but whose body it
had not read yet (sent within ``ACCEPT_WINDOW_S`` of the kill) is counted apart.

Checks (exit 1 when one fails): every request answered 200 with exactly its tokens (with
relay kills: every request that was not on the killed relay), the policy ticked in every
report window (when it has ticks), no tick failed, zero residue.

Usage: python benchmarks/live_soak.py [--policy ares] [--seconds 600] [--rate 2] [--chaos] [--workers 2]
                                      [--output-low 256] [--output-high 4096] [--prompt-high 1024]
The last line is one JSON object of the run's figures.
"""

from __future__ import annotations

import argparse
from collections import Counter
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.live import get, metric, servers, start_emulator, start_gateway  # noqa: E402

AUTH = {"Authorization": "Bearer live-soak-admin-token"}
RELAY_BITS = 40  # gateway.relay.ID_BITS: a request id's relay start number sits above these bits
# report key -> (counter family, a label that must match, or None)
WATCHED = {"ticks": ("baton_policy_ticks", None), "tick_errors": ("baton_policy_tick_errors", None),
           "migrations_ok": ("baton_migrations", ("result", "ok")),
           "migrations_failed": ("baton_migrations", ("result", "failed")),
           "migrations_refused": ("baton_migrations", ("result", "refused")),
           "deflections": ("baton_deflections", None), "role_flips": ("baton_role_flips", None),
           "stale": ("baton_stale_decisions", None), "ok": ("baton_requests", ("outcome", "ok")),
           "ended": ("baton_requests", None)}


def scrape(url: str) -> dict[str, float]:
    """The watched counters (sums over their label sets)."""
    out = dict.fromkeys(WATCHED, 0.0)
    for family in text_string_to_metric_families(str(get(url + "/metrics")[1])):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            for key, (name, label) in WATCHED.items():
                if family.name == name and (label is None or sample.labels.get(label[0]) == label[1]):
                    out[key] += sample.value
    return out


async def one(session: aiohttp.ClientSession, url: str, rng: random.Random, rid: int,
              shape: argparse.Namespace) -> tuple[str, str | None]:
    """Send one request: its X-Request-Id, and None when it was answered whole, else what
    went wrong."""
    xid = f"soak-{rid}"
    try:
        return xid, await _one(session, url, rng, rid, shape, xid)
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        return xid, f"disconnected: {type(err).__name__}: {err}"


async def _one(session: aiohttp.ClientSession, url: str, rng: random.Random, rid: int,
               shape: argparse.Namespace, xid: str) -> str | None:
    prompt, out = rng.randint(64, shape.prompt_high), rng.randint(shape.output_low, shape.output_high)
    ids = [1000 + (rid * 7 + i) % 5000 for i in range(prompt)]
    chat, stream = rng.random() < 0.5, rng.random() < 0.5
    body = {"max_tokens": out, "ignore_eos": True, "stream": stream}
    body.update({"messages": [{"role": "user", "content": "x " * (prompt // 2)}]} if chat else {"prompt": ids})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with session.post(url + path, json=body, headers={"X-Request-Id": xid},
                            timeout=aiohttp.ClientTimeout(total=600)) as resp:
        if resp.status != 200:
            return f"status {resp.status}: {(await resp.text())[:200]}"
        usage = None
        if not stream:
            usage = (await resp.json()).get("usage")
        else:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    usage = json.loads(line[6:]).get("usage") or usage
    got = (usage or {}).get("completion_tokens")
    return None if got == out else f"{got} tokens instead of {out}"


async def traffic(url: str, args: argparse.Namespace) -> dict:
    rate, seconds, report_s = args.rate, args.seconds, args.report_s
    rng, errors, tasks, rows, sent_s = random.Random(args.seed), [], [], [], {}
    # with relay workers, a connection per request: a kept-alive one may lead to a relay killed since
    connector = aiohttp.TCPConnector(limit=0, force_close=args.workers > 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.monotonic()
        next_report, rid = t0 + report_s, 0
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(rng.expovariate(rate))
            tasks.append(asyncio.create_task(one(session, url, rng, rid, args)))
            sent_s[f"soak-{rid}"] = time.monotonic()
            rid += 1
            if time.monotonic() >= next_report:
                rows.append(await asyncio.to_thread(scrape, url))
                print(f"t={time.monotonic() - t0:5.0f}s sent {rid:5d} " +
                      " ".join(f"{k}={v:.0f}" for k, v in rows[-1].items()), flush=True)
                next_report += report_s
        for res in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(res, BaseException):
                errors.append(("?", repr(res)))
            elif res[1] is not None:
                errors.append(res)
    return {"sent": rid, "errors": errors, "rows": rows, "sent_s": sent_s}


ACCEPT_WINDOW_S = 0.25  # a request sent this long before a relay kill may sit unlisted in its accept queue


class RelayKills:
    """SIGKILL the relay worker carrying the most requests; remember which requests it had."""

    def __init__(self, url: str) -> None:
        self.url, self.doomed, self.kill_s = url, set(), []

    def __call__(self) -> str:
        import os
        import signal
        relays = get(self.url + "/admin/workers", headers=AUTH)[1]["relays"]
        victim = max(relays, key=lambda r: r["requests"])
        gen = int(victim["identity"].rsplit("-", 1)[1])
        carried = [r["x_request_id"] for r in get(self.url + "/admin/requests", headers=AUTH)[1]["requests"]
                   if r["req_id"] >> RELAY_BITS == gen]
        self.doomed.update(carried)
        self.kill_s.append(time.monotonic())
        os.kill(victim["pid"], signal.SIGKILL)
        return f"killed relay {victim['identity']} carrying {len(carried)} requests"

    def classify(self, errors: list[tuple[str, str]], sent_s: dict[str, float]) -> dict[str, list]:
        """Failed requests: on a killed relay, in its accept queue, or neither (a loss)."""
        out: dict[str, list] = {"on_killed_relay": [], "in_accept_window": [], "lost": []}
        for xid, err in errors:
            if xid in self.doomed:
                out["on_killed_relay"].append(xid)
            elif err.startswith("disconnected") and any(0 <= k - sent_s.get(xid, -1e9) <= ACCEPT_WINDOW_S
                                                        for k in self.kill_s):
                out["in_accept_window"].append(xid)
            else:
                out["lost"].append((xid, err))
        return out


def chaos(victims, every_s: float, stop: threading.Event, log: list[str], relay_kill=None) -> None:
    """Hurt one of ``victims`` every ``every_s`` seconds: kill-and-restart, then a hang
    (and with ``relay_kill``, every third time, a relay worker killed instead)."""
    for n in range(10**9):
        if stop.wait(every_s):
            return
        victim = victims[n % len(victims)]
        if relay_kill is not None and n % 3 == 2:
            log.append(relay_kill())
        elif n % 2 == 0:
            victim.kill()
            log.append(f"killed {victim.url}")
            if stop.wait(5.0):
                victim.restart()
                return
            victim.restart()
        else:
            victim.pause()
            log.append(f"paused {victim.url}")
            stop.wait(8.0)
            victim.resume()
        print(f"chaos: {log[-1]} (back now)", flush=True)


def residue(gw_url: str, engines) -> dict[str, float]:
    """What is still booked or running anywhere (all zero when idle)."""
    body = get(gw_url + "/admin/instances", headers=AUTH)[1]
    out = {f"gateway_{k}": float(v) for k, v in body["in_flight"].items()}
    out.update({f"gateway_{k}_prefills": float(v) for k, v in body["held_prefills"].items()})
    out["engines_running"] = sum(metric(e.url, "vllm:num_requests_running") for e in engines)
    out["engines_waiting"] = sum(metric(e.url, "vllm:num_requests_waiting") for e in engines)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="ares")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s")
    ap.add_argument("--prompt-high", type=int, default=1024)
    ap.add_argument("--output-low", type=int, default=256)
    ap.add_argument("--output-high", type=int, default=4096)
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--mixed", type=int, default=0)
    ap.add_argument("--report-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chaos", action="store_true", help="kill/restart or hang a decode engine periodically")
    ap.add_argument("--chaos-every-s", type=float, default=45.0)
    ap.add_argument("--workers", type=int, default=1, help="baton serve --workers (relay processes)")
    ap.add_argument("--record", metavar="NAME", help="write the figures into results/NAME.json for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="baton-soak-"))
    roles = ["prefill"] * args.prefill + ["decode"] * args.decode + ["mixed"] * args.mixed
    engines = [start_emulator(work) for _ in roles]
    gw = start_gateway(work, {"engines": [{"name": f"{r}{i}", "url": e.url, "role": r}
                                          for i, (e, r) in enumerate(zip(engines, roles))],
                              "policy": args.policy, "admin_token": "live-soak-admin-token", "scrape_interval_s": 0.5,
                              "workers": args.workers})
    kills = RelayKills(gw.url) if args.workers > 1 else None
    stop, hurt = threading.Event(), []
    victims = [e for e, r in zip(engines, roles) if r != "prefill"][:1] or engines[-1:]
    with servers(*engines, gw):
        if args.chaos:
            threading.Thread(target=chaos, args=(victims, args.chaos_every_s, stop, hurt, kills), daemon=True).start()
        run = asyncio.run(traffic(gw.url, args))
        stop.set()
        if args.chaos:
            for e in victims:
                e.wait_ready()
        time.sleep(2.0)  # engines finish aborted work and the last scrape lands
        final, left = scrape(gw.url), residue(gw.url, engines)
        tracebacks = gw.log.read_text().count("Traceback")
    ticked = [b["ticks"] - a["ticks"] for a, b in zip(run["rows"], run["rows"][1:])]
    failed = kills.classify(run["errors"], run["sent_s"]) if kills else {"lost": run["errors"]}
    checks = {"all_answered": not failed["lost"], "no_tick_failed": final["tick_errors"] == 0,
              "ticked_every_window": final["ticks"] == 0 or all(t > 0 for t in ticked),
              "zero_residue": all(v == 0 for v in left.values()), "no_traceback": tracebacks == 0}
    for err in failed["lost"][:10]:
        print("lost:", err)
    kinds = Counter(e.split(":")[0] if e.startswith(("status", "disconnected")) else "short answer"
                    for _, e in run["errors"])
    print("errors by kind:", dict(kinds), {k: len(v) for k, v in failed.items()})
    print("residue:", left, "checks:", checks, "logs in", work)
    figures = {"policy": args.policy, "seconds": args.seconds, "rate_rps": args.rate,
               "output_tokens": [args.output_low, args.output_high], "sent": run["sent"],
               "answered": run["sent"] - len(run["errors"]), "failed": len(run["errors"]), "lost": len(failed["lost"]),
               "on_killed_relays": len(failed.get("on_killed_relay", [])),
               "in_accept_window": len(failed.get("in_accept_window", [])), "workers": args.workers,
               "chaos_events": len(hurt), **final, **checks}
    print(json.dumps(figures))
    if args.record:
        from baton.report.results import record
        record(args.record, figures, time.perf_counter() - started,
               "python benchmarks/live_soak.py " + " ".join(sys.argv[1:]))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
