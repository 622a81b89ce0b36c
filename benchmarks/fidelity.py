"""Fidelity: Baton against Vidur 0.0.26 on the same requests, matched by id.

    python benchmarks/fidelity.py [--quick] [--requests N] [--cases NAME,...] [--real]

Vidur is installed and its profiles laid out on first use (``benchmarks/vidur_runner.py``;
the first run of each model trains its random forests, a few minutes). Every case runs
Vidur's synthetic generator (seed 42, uniform total tokens split at a prefill:decode
ratio, Poisson arrivals) with Sarathi (chunk 512, batch cap 128) and round-robin over the
replicas; Baton reads Vidur's ``request_metrics.csv`` (``--format vidur-metrics``) and runs
``colocated-rr`` with the same engine limits and the KV capacity Vidur's memory planner gave
each replica (53,248 tokens for Llama-2-70B TP2, 446,464 for CodeLlama-34B TP2;
``baton.workload.source_engine``). Per request it compares TTFT, TPOT ((e2e -
TTFT) / (output - 1) on both sides) and e2e: MAPE and p50/p90/p99 ratios (Baton / Vidur).

Cases (``CASES``):
- ``70b-light`` (1 and 4 replicas): Llama-2-70B TP2 on A100, 256-4,096 tokens at 10:1,
  0.3 req/s per replica: the configuration the A100 preset was first checked on;
- held-out style, each on one replica at 70-85% of capacity: Llama-2-70B TP2 (the preset)
  and CodeLlama-34B TP2 (its ``config.json`` through the ``hf:`` route with ``--gpu
  a100-80g --tp 2``, no preset of its own), each prefill-heavy (1,024-4,096 tokens at 20:1)
  and decode-heavy (256-4,096 at 1:1). Capacity is Baton's saturated throughput on the same
  requests (all arriving at once); the rate steps down from 85% of it by 5 points until
  Vidur runs through (Vidur 0.0.26 crashes on its first preemption), so each case sits just
  below that, and ``load`` reports where it landed.

Speed: ``speedup_whole`` is Vidur's wall time over ``baton simulate``'s on the same
requests, both as whole processes (start-up included; Vidur's forests already trained);
``speedup_in_process`` is Vidur's whole process over Baton's in-process simulation, the
figure this benchmark used to report. ``--real`` adds the real-engine check
(``benchmarks/fidelity_real.py``); ``make fidelity-real`` runs ``--quick --real``.

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from baton.core.info import InfoModel, ViewMode  # noqa: E402
from baton.sim import ClusterSpec, EngineConfig, simulate  # noqa: E402
from baton.workload import load_trace, source_engine  # noqa: E402
from fidelity_real import CASES as REAL_CASES, print_real, real_keys  # noqa: E402
from fidelity_fleet import FLEET_CASES  # noqa: E402
from vidur_runner import VidurCase, ensure_hub, ensure_vidur, run_vidur, vidur_latencies  # noqa: E402

LLAMA70 = "meta-llama/Llama-2-70b-hf"
CODELLAMA = "codellama/CodeLlama-34b-Instruct-hf"
PRESETS = {LLAMA70: "llama-2-70b-tp2@a100-80g",
           CODELLAMA: f"hf:{ROOT / 'tests' / 'perf' / 'fixtures' / 'codellama-34b'}@a100-80g:tp2"}
LOAD_STEPS = (0.85, 0.80, 0.75, 0.70, 0.65, 0.60, 0.55, 0.50)


@dataclass(frozen=True)
class Case:
    """A fidelity case: Vidur's model, replicas, request mix; ``rate_rps`` fixed, or None:
    found by the load search."""

    name: str
    model: str
    replicas: int
    min_tokens: int
    max_tokens: int
    pd_ratio: float
    rate_rps: float | None = None


CASES = [
    Case("70b-light", LLAMA70, 1, 256, 4096, 10.0, 0.3),
    Case("70b-light-4r", LLAMA70, 4, 256, 4096, 10.0, 1.2),
    Case("70b-prefill-heavy", LLAMA70, 1, 1024, 4096, 20.0),
    Case("70b-decode-heavy", LLAMA70, 1, 256, 4096, 1.0),
    Case("34b-prefill-heavy", CODELLAMA, 1, 1024, 4096, 20.0),
    Case("34b-decode-heavy", CODELLAMA, 1, 256, 4096, 1.0),
]


def cluster_for(case: Case, kv_tokens: int | None) -> ClusterSpec:
    return ClusterSpec(prefill=0, decode=0, mixed=case.replicas, preset=PRESETS[case.model],
                       engine=EngineConfig(512, 128, 16, max_model_len=4096, kv_tokens=kv_tokens))


def vidur_kv(metrics: Path) -> int | None:
    """The KV capacity Vidur's memory planner gave each replica of this run (tokens)."""
    src = source_engine(metrics, "vidur-metrics")
    return src.kv_tokens if src is not None else None


def run_baton(metrics: Path, case: Case, squeeze: bool = False):
    """Baton on Vidur's requests: request id -> (TTFT, TPOT, e2e), CPU seconds, and the
    makespan (s). ``squeeze``: every request arrives at 0 (the saturated throughput)."""
    requests = load_trace(metrics, "vidur-metrics")
    if squeeze:
        requests = [replace(r, arrival_s=0.0) for r in requests]
    cpu0 = time.process_time()
    result = simulate(requests, cluster_for(case, vidur_kv(metrics)), "colocated-rr", info=InfoModel(ViewMode.EXACT))
    cpu = time.process_time() - cpu0
    done = [r for r in result.records if r.finished]
    makespan = max(r.arrival_s + r.e2e_s for r in done) - min(r.arrival_s for r in done)
    return {r.req_id: (r.ttft_s, r.tpot_s, r.e2e_s) for r in done}, cpu, makespan


def baton_whole_process_s(metrics: Path, case: Case) -> float:
    """Wall seconds of ``baton simulate`` on the same requests, start-up included."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(Path(sys.executable).with_name("baton")), "simulate", "--trace", str(metrics), "--format", "vidur-metrics",
               "--mixed", str(case.replicas), "--preset", PRESETS[case.model], "--policy", "colocated-rr",
               "--max-num-batched-tokens", "512", "--max-num-seqs", "128", "--max-model-len", "4096",
               "--view", "exact", "--quiet", "--json", "--out", out]
        if vidur_kv(metrics) is not None:
            cmd += ["--kv-tokens", str(vidur_kv(metrics))]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        return time.perf_counter() - t0


def compare(vidur: dict, baton: dict) -> dict[str, float]:
    ids = sorted(set(vidur) & set(baton))
    out: dict[str, float] = {"matched": len(ids), "vidur_requests": len(vidur), "baton_finished": len(baton)}
    for k, name in enumerate(("ttft", "tpot", "e2e")):
        v = np.array([vidur[i][k] for i in ids])
        b = np.array([baton[i][k] for i in ids])
        ok = np.isfinite(v) & np.isfinite(b) & (v > 0)
        out[f"{name}_mape"] = float(np.mean(np.abs(b[ok] - v[ok]) / v[ok]))
        for q in (50, 90, 99):
            out[f"{name}_p{q}_ratio"] = float(np.percentile(b[ok], q) / np.percentile(v[ok], q))
    return out


def vidur_case(case: Case, rate: float, n: int) -> VidurCase:
    return VidurCase(case.model, case.replicas, rate, n, case.min_tokens, case.max_tokens, case.pd_ratio)


def run_case(python: Path, case: Case, n: int, work: Path) -> dict:
    """One case: find its rate if it has none, run both, compare, time both."""
    capacity = None
    if case.rate_rps is None:
        probe = run_vidur(python, vidur_case(case, 0.05, n), work / case.name / "probe")
        assert probe is not None, "Vidur preempted at 0.05 req/s"
        _, _, makespan = run_baton(probe.metrics, case, squeeze=True)
        capacity = n / makespan
        steps = [capacity * f for f in LOAD_STEPS]
    else:
        steps = [case.rate_rps]
    for rate in steps:
        run = run_vidur(python, vidur_case(case, rate, n), work / case.name)
        if run is not None:
            break
        print(f"fidelity: {case.name}: Vidur preempted (and crashed) at {rate:.3f} req/s; stepping down",
              file=sys.stderr, flush=True)
    else:
        return {"case": case.name, "error": "Vidur preempted at every rate tried"}
    baton, baton_cpu, _ = run_baton(run.metrics, case)
    figures = {"case": case.name, "rate_rps": rate, "capacity_rps": capacity,
               "load": rate / capacity if capacity else None, **compare(vidur_latencies(run.metrics), baton)}
    whole = baton_whole_process_s(run.metrics, case)
    figures.update(vidur_wall_s=run.wall_s, vidur_cpu_s=run.cpu_s, baton_cpu_s=baton_cpu, baton_wall_s=whole,
                   speedup_whole=run.wall_s / whole, speedup_in_process=run.cpu_s / baton_cpu)
    return figures


def print_figures(rows: list[dict], real: dict | None) -> dict:
    print(f"{'case':<18} {'load':>5} {'TTFT MAPE':>9} {'p50/p90/p99':>15} {'TPOT MAPE':>9} {'p50/p90/p99':>15} "
          f"{'e2e MAPE':>8} {'speed':>6}")
    for m in rows:
        if "error" in m:
            print(f"{m['case']:<18} {m['error']}")
            continue
        ratios = lambda k: "/".join(f"{m[f'{k}_p{q}_ratio']:.2f}" for q in (50, 90, 99))  # noqa: E731
        load = f"{m['load']:.2f}" if m["load"] else "-"
        print(f"{m['case']:<18} {load:>5} {m['ttft_mape']:>9.3f} {ratios('ttft'):>15} {m['tpot_mape']:>9.3f} "
              f"{ratios('tpot'):>15} {m['e2e_mape']:>8.3f} {m['speedup_whole']:>5.1f}x")
    if real is not None:
        print_real(real)
    ok = [m for m in rows if "error" not in m]
    worst = {k: max((m[f"{k}_mape"] for m in ok), default=None) for k in ("ttft", "tpot", "e2e")}
    real_mape = {k: (real or {}).get(f"{k}_mape") for k in ("ttft", "tpot", "e2e")}
    light = next((m for m in ok if m["case"] == "70b-light"), None)
    loaded_worst = {k: max((m[f"{k}_mape"] for m in ok if m.get("load")), default=None) for k in ("ttft", "tpot", "e2e")}
    figures = {"vidur_ttft_mape": worst["ttft"], "vidur_tpot_mape": worst["tpot"], "vidur_e2e_mape": worst["e2e"],
             **{f"vidur_light_{k}_mape": light[f"{k}_mape"] if light else None for k in ("ttft", "tpot", "e2e")},
             **{f"vidur_loaded_worst_{k}_mape": v for k, v in loaded_worst.items()},
             "vidur_cases": ok, "vidur_speedup": light["speedup_whole"] if light else None,
             "real_ttft_mape": real_mape["ttft"], "real_tpot_mape": real_mape["tpot"],
             "real_e2e_mape": real_mape["e2e"], **real_keys(real), "real": real}
    print(json.dumps(figures, default=str))
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2,000 requests per case instead of 10,000")
    p.add_argument("--requests", type=int, help="requests per case (overrides --quick)")
    p.add_argument("--cases", help=f"comma-separated case names (default: all: {', '.join(c.name for c in CASES)})")
    p.add_argument("--real", action="store_true", help="also the real-engine check (vLLM CPU, SmolLM2)")
    p.add_argument("--no-vidur", action="store_true", help="skip the Vidur comparison (vidur_* null)")
    p.add_argument("--real-requests", type=int, default=60, help="requests in the real-engine light trace")
    p.add_argument("--real-rate", type=float, default=None,
                   help="their Poisson rate (req/s; default: where their prefills alone, as the profile times "
                        "them, keep the engine 15%% busy)")
    p.add_argument("--no-loaded", action="store_true",
                   help="skip the real engine's rate search and its 50/70/85%% load cases")
    p.add_argument("--real-cases", default=",".join(REAL_CASES),
                   help="the real-engine cases to run (default all: %(default)s)")
    p.add_argument("--fleet-cases", default=None, metavar="A,B",
                   help="with the fleet case: which of colocated, colocated-rr, pd (default all)")
    p.add_argument("--real-sustainable", type=float, metavar="RPS",
                   help="the engine's sustainable rate, measured before (skips the rate search)")
    p.add_argument("--work", default=None, help="scratch folder for Vidur's outputs (default: a temporary one)")
    p.add_argument("--record", metavar="NAME", help="also write the figures to results/NAME.json for the docs to quote")
    args = p.parse_args()
    started = time.perf_counter()
    n = args.requests or (2000 if args.quick else 10000)
    work = Path(args.work or tempfile.mkdtemp(prefix="baton-fidelity-"))
    names = args.cases.split(",") if args.cases else [c.name for c in CASES]
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown:
        sys.exit(f"fidelity: unknown case(s) {', '.join(unknown)}; known: {', '.join(c.name for c in CASES)}")
    real = None
    if args.real:
        from fidelity_real import run_real
        cases = tuple(args.real_cases.split(","))
        if set(cases) - set(REAL_CASES):
            sys.exit(f"fidelity: unknown real case(s) {', '.join(sorted(set(cases) - set(REAL_CASES)))}; "
                     f"known: {', '.join(REAL_CASES)}")
        fleet = tuple(args.fleet_cases.split(",")) if args.fleet_cases else None
        if fleet and set(fleet) - set(FLEET_CASES):
            sys.exit(f"fidelity: unknown fleet case(s) {', '.join(sorted(set(fleet) - set(FLEET_CASES)))}; "
                     f"known: {', '.join(FLEET_CASES)}")
        real = run_real(work / "real", args.real_requests, args.real_rate, compare, loaded=not args.no_loaded,
                        cases=cases, sustainable_rps=args.real_sustainable, fleet_kinds=fleet)
    rows = []
    if not args.no_vidur:
        python = ensure_vidur()
        ensure_hub()
        for case in (c for c in CASES if c.name in names):
            print(f"fidelity: {case.name} ...", file=sys.stderr, flush=True)
            rows.append(run_case(python, case, n, work))
    figures = print_figures(rows, real)
    if args.record:
        from baton.report.results import record
        record(args.record, json.loads(json.dumps(figures, default=str)), time.perf_counter() - started,
               "python benchmarks/fidelity.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
