"""Fidelity: Baton against Vidur 0.0.26 on the same requests, matched by id.

    python benchmarks/fidelity.py [--quick] [--requests N] [--real]

On first use it installs ``vidur==0.0.26`` into ``~/.cache/baton/vidur-venv`` and lays
out ``../shared/peers/vidur/*.csv`` as the offline hub cache Vidur loads its profiles from
(``~/.cache/baton/vidur-hub``; the first Vidur run trains its random forests there, a few
minutes, later runs reuse them). Setup: Llama-2-70B TP2 PP1 on A100, Sarathi chunk 512,
batch cap 128, round-robin over 1 and 4 replicas, Vidur's synthetic generator (seed 42,
uniform 256-4,096 total tokens at prefill:decode 10, Poisson at 0.3 req/s per replica).
Vidur 0.0.26 crashes on its first preemption (an assertion in ``entities/request.py``),
so the load stays below where it preempts (0.6 req/s per replica still ran here).

Baton reads Vidur's ``request_metrics.csv`` (``--format vidur-metrics``), runs
``colocated-rr`` on ``llama-2-70b-tp2@a100-80g`` with the same engine limits, and
compares TTFT, TPOT ((e2e - TTFT) / (output - 1) on both sides) and e2e per request:
MAPE and p50/p90/p99 ratios (Baton / Vidur). ``vidur_speedup`` is Vidur's CPU time (user
+ sys) over Baton's for the 1-replica run, median of 3 runs each.

``--real`` adds the real-engine check (``benchmarks/fidelity_real.py``: one vLLM CPU
instance profiled by ``baton profile``, a trace replayed through the gateway and simulated
with the fitted profile); without it ``real_*`` are null. ``make fidelity-real`` runs
``--quick --real``.

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.core.paths import cache_dir  # noqa: E402
from baton.core.info import InfoModel, ViewMode  # noqa: E402
from baton.sim import ClusterSpec, EngineConfig, simulate  # noqa: E402
from baton.workload import load_trace  # noqa: E402

CACHE = cache_dir()
VENV = CACHE / "vidur-venv"
HUB = CACHE / "vidur-hub"
PROFILES = ROOT.parent / "shared" / "peers" / "vidur"
SNAPSHOT = "7d47513363ec447a741ac5e47241580b47724fbf"
DATASETS = {
    ("compute", "vidur-a100-llama-2-70b"): ({"mlp.csv.xz": "a100_Llama-2-70b-hf_mlp.csv",
                                            "attention.csv.xz": "a100_attention_llama2-70b-tp2_from_commit_acb95f6.csv"},
                                           {"model": "meta-llama/Llama-2-70b-hf", "device_sku": "a100"}),
    ("network", "vidur-a100-dgx"): ({"all_reduce.csv.xz": "a100_dgx_all_reduce.csv",
                                    "send_recv.csv.xz": "a100_dgx_send_recv.csv"}, {"sku": "a100_dgx"}),
}


def ensure_vidur() -> Path:
    """The venv's python, installing vidur==0.0.26 on first use."""
    python = VENV / "bin" / "python"
    if not python.exists() or subprocess.run([python, "-c", "import vidur"], capture_output=True).returncode:
        print("fidelity: installing vidur==0.0.26 into", VENV, file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "vidur==0.0.26"], check=True)
    return python


def ensure_hub() -> None:
    """Vidur's profiles as an offline Hugging Face hub cache (see the peers README)."""
    if not PROFILES.is_dir():
        sys.exit(f"fidelity: Vidur's profiles are not in {PROFILES}")
    for (kind, name), (files, config) in DATASETS.items():
        base = HUB / "profiling_data" / kind / f"datasets--local--{name}"
        snap = base / "snapshots" / SNAPSHOT
        snap.mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text(SNAPSHOT)
        (snap / "config.json").write_text(json.dumps(config))
        for target, source in files.items():
            if not (snap / target).exists():
                (snap / target).write_bytes(lzma.compress((PROFILES / source).read_bytes()))


def vidur_args(replicas: int, requests: int, out: Path) -> list[str]:
    rf = "--random_forrest_execution_time_predictor_config_"  # sic: Vidur's spelling
    return [
        "--seed", "42", "--cluster_config_num_replicas", str(replicas),
        "--replica_config_model_name", "meta-llama/Llama-2-70b-hf", "--replica_config_device", "a100",
        "--replica_config_network_device", "a100_dgx", "--replica_config_tensor_parallel_size", "2",
        "--replica_config_num_pipeline_stages", "1", "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", "512", "--sarathi_scheduler_config_batch_size_cap", "128",
        "--global_scheduler_config_type", "round_robin", "--request_generator_config_type", "synthetic",
        "--synthetic_request_generator_config_num_requests", str(requests),
        "--length_generator_config_type", "uniform", "--uniform_request_length_generator_config_min_tokens", "256",
        "--uniform_request_length_generator_config_max_tokens", "4096",
        "--uniform_request_length_generator_config_prefill_to_decode_ratio", "10",
        "--interval_generator_config_type", "poisson",
        "--poisson_request_interval_generator_config_qps", str(0.3 * replicas),
        "--execution_time_predictor_config_type", "random_forrest",
        rf + "model_profiling_dataset", "local/vidur-a100-llama-2-70b",
        rf + "network_profiling_dataset", "local/vidur-a100-dgx", rf + "cache_dir", str(HUB),
        rf + "num_estimators", "250", rf + "max_depth", "16", "32", rf + "k_fold_cv_splits", "3",
        rf + "prediction_max_tokens_per_request", "4096",
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--metrics_config_output_dir", str(out)]


def child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_vidur(python: Path, replicas: int, requests: int, out: Path) -> tuple[Path, float]:
    """(request_metrics.csv, CPU seconds) of one Vidur run."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    cpu0 = child_cpu_s()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([python, "-m", "vidur.main", *vidur_args(replicas, requests, out)], env=env,
                          capture_output=True, text=True, cwd=out)
    cpu = child_cpu_s() - cpu0
    if proc.returncode:
        sys.exit(f"fidelity: Vidur failed ({replicas} replicas): {proc.stderr.strip().splitlines()[-1:]}")
    (run_dir,) = set(out.iterdir()) - before
    return run_dir / "request_metrics.csv", cpu


def vidur_latencies(path: Path) -> dict[int, tuple[float, float, float]]:
    """Request id -> (TTFT, TPOT, e2e) in seconds from Vidur's metrics."""
    import csv
    out = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            ttft, e2e, n = float(row["prefill_e2e_time"]), float(row["request_e2e_time"]), int(row["request_num_decode_tokens"])
            out[int(row["Request Id"])] = (ttft, (e2e - ttft) / (n - 1) if n > 1 else float("nan"), e2e)
    return out


def run_baton(metrics: Path, replicas: int) -> tuple[dict[int, tuple[float, float, float]], float]:
    """Baton on Vidur's requests: request id -> (TTFT, TPOT, e2e), and CPU seconds."""
    requests = load_trace(metrics, "vidur-metrics")
    cluster = ClusterSpec(prefill=0, decode=0, mixed=replicas, preset="llama-2-70b-tp2@a100-80g",
                          engine=EngineConfig(512, 128, 16, max_model_len=4096))
    cpu0 = time.process_time()
    result = simulate(requests, cluster, "colocated-rr", info=InfoModel(ViewMode.EXACT))
    cpu = time.process_time() - cpu0
    return {r.req_id: (r.ttft_s, r.tpot_s, r.e2e_s) for r in result.records if r.finished}, cpu


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2,000 requests instead of 10,000")
    p.add_argument("--requests", type=int, help="requests per run (overrides --quick)")
    p.add_argument("--real", action="store_true", help="also the real-engine check (vLLM CPU, SmolLM2)")
    p.add_argument("--no-vidur", action="store_true", help="skip the Vidur comparison (vidur_* null)")
    p.add_argument("--real-requests", type=int, default=200, help="requests in the real-engine trace")
    p.add_argument("--real-rate", type=float, default=1.0, help="their Poisson rate (req/s)")
    p.add_argument("--work", default="/tmp/baton-fidelity", help="scratch folder for Vidur's outputs")
    args = p.parse_args()
    n = args.requests or (2000 if args.quick else 10000)
    work = Path(args.work)
    real = None
    if args.real:
        from fidelity_real import run_real
        real = run_real(work / "real", args.real_requests, args.real_rate, compare)
    by_replicas, speed = vidur_part(n, work) if not args.no_vidur else ({}, None)
    print_figures(n, by_replicas, speed, real)


def vidur_part(n: int, work: Path) -> tuple[dict, float]:
    """Vidur and Baton on the same requests at 1 and 4 replicas, and the CPU-time ratio."""
    python = ensure_vidur()
    ensure_hub()
    by_replicas, speed = {}, None
    for replicas in (1, 4):
        metrics, vidur_cpu = run_vidur(python, replicas, n, work / f"r{replicas}")
        vidur = vidur_latencies(metrics)
        baton, baton_cpu = run_baton(metrics, replicas)
        by_replicas[replicas] = compare(vidur, baton)
        if replicas == 1:
            vc = [vidur_cpu] + [run_vidur(python, 1, n, work / "r1")[1] for _ in range(2)]
            bc = [baton_cpu] + [run_baton(metrics, 1)[1] for _ in range(2)]
            speed = statistics.median(vc) / statistics.median(bc)
            by_replicas[1].update(vidur_cpu_s=statistics.median(vc), baton_cpu_s=statistics.median(bc))
    return by_replicas, speed


def print_figures(n: int, by_replicas: dict, speed: float | None, real: dict | None) -> None:
    print(f"{'replicas':>8} {'matched':>8} {'TTFT MAPE':>10} {'TPOT MAPE':>10} {'e2e MAPE':>9}  p50/p90/p99 ratio TPOT")
    for r, m in by_replicas.items():
        print(f"{r:>8} {m['matched']:>8} {m['ttft_mape']:>10.3f} {m['tpot_mape']:>10.3f} {m['e2e_mape']:>9.3f}  "
              f"{m['tpot_p50_ratio']:.3f} / {m['tpot_p90_ratio']:.3f} / {m['tpot_p99_ratio']:.3f}")
    if real is not None:
        print(f"{'real':>8} {real['matched']:>8} {real['ttft_mape']:>10.3f} {real['tpot_mape']:>10.3f} "
              f"{real['e2e_mape']:>9.3f}  {real['tpot_p50_ratio']:.3f} / {real['tpot_p90_ratio']:.3f} / "
              f"{real['tpot_p99_ratio']:.3f}   (vLLM CPU, SmolLM2-135M, {real['failed']} failed)")
    if speed is not None:
        print(f"vidur_speedup (Vidur CPU / Baton CPU, 1 replica, median of 3): {speed:.1f}x")
    worst = {k: max((m[f"{k}_mape"] for m in by_replicas.values()), default=None) for k in ("ttft", "tpot", "e2e")}
    real_mape = {k: (real or {}).get(f"{k}_mape") for k in ("ttft", "tpot", "e2e")}
    print(json.dumps({"requests": n, "vidur_ttft_mape": worst["ttft"], "vidur_tpot_mape": worst["tpot"],
                      "vidur_e2e_mape": worst["e2e"], "vidur_by_replicas": {str(k): v for k, v in by_replicas.items()},
                      "vidur_speedup": speed, "real_ttft_mape": real_mape["ttft"],
                      "real_tpot_mape": real_mape["tpot"], "real_e2e_mape": real_mape["e2e"], "real": real}))


if __name__ == "__main__":
    main()
