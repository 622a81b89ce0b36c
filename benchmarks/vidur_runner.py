"""Vidur 0.0.26 as the fidelity benchmark drives it: install, offline profiles, one run.

On first use ``ensure_vidur`` installs ``vidur==0.0.26`` into ``~/.cache/baton/vidur-venv``
and ``ensure_hub`` lays out ``../shared/peers/vidur/*.csv`` as the offline hub cache Vidur
loads its profiles from (``~/.cache/baton/vidur-hub``; the first run of each model trains
its random forests there, a few minutes, later runs reuse them).

A run is described by a ``VidurCase``: model, replicas, Sarathi chunk and batch cap,
Vidur's synthetic uniform length generator and a Poisson rate. ``run_vidur`` times it as a
whole process (wall and CPU, start-up included) and returns its ``request_metrics.csv``,
or ``None`` when Vidur crashed on its first preemption (0.0.26's ``Request.restart()``
assertion), which is how the rate search finds the highest rate Vidur can run.
"""

from __future__ import annotations

import csv
import json
import lzma
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the shared folder beside the repository; BATON_SHARED names another (a clone elsewhere)
PROFILES = Path(os.environ.get("BATON_SHARED", ROOT.parent / "shared")) / "peers" / "vidur"
SNAPSHOT = "7d47513363ec447a741ac5e47241580b47724fbf"
ATTENTION_70B_TP2 = "a100_attention_llama2-70b-tp2_from_commit_acb95f6.csv"
# (kind, dataset) -> (files: hub name -> file in PROFILES, the dataset's config.json).
# CodeLlama-34B has Llama-2-70B's attention shape per GPU at TP2 (64 query heads, 8 KV
# heads, head dimension 128), so the 70B attention profile serves both (peers README).
DATASETS = {
    ("compute", "vidur-a100-llama-2-70b"): (
        {"mlp.csv.xz": "a100_Llama-2-70b-hf_mlp.csv", "attention.csv.xz": ATTENTION_70B_TP2},
        {"model": "meta-llama/Llama-2-70b-hf", "device_sku": "a100"}),
    ("compute", "vidur-a100-codellama-34b"): (
        {"mlp.csv.xz": "a100_codellama_CodeLlama-34b-Instruct-hf_mlp.csv", "attention.csv.xz": ATTENTION_70B_TP2},
        {"model": "codellama/CodeLlama-34b-Instruct-hf", "device_sku": "a100"}),
    ("network", "vidur-a100-dgx"): (
        {"all_reduce.csv.xz": "a100_dgx_all_reduce.csv", "send_recv.csv.xz": "a100_dgx_send_recv.csv"},
        {"sku": "a100_dgx"}),
}
# Vidur's model name -> its compute dataset
MODEL_DATASET = {"meta-llama/Llama-2-70b-hf": "vidur-a100-llama-2-70b",
                 "codellama/CodeLlama-34b-Instruct-hf": "vidur-a100-codellama-34b"}


def cache_root() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from baton.core.paths import cache_dir
    return cache_dir()


VENV = cache_root() / "vidur-venv"
HUB = cache_root() / "vidur-hub"


@dataclass(frozen=True)
class VidurCase:
    """One configuration both simulators run: Vidur's model name, TP degree, replicas,
    Sarathi chunk (tokens) and batch cap, uniform total tokens per request in
    [min_tokens, max_tokens] split prefill:decode = ``pd_ratio``, Poisson ``rate_rps``
    for the whole cluster, and how many requests."""

    model: str
    replicas: int
    rate_rps: float
    requests: int
    min_tokens: int = 256
    max_tokens: int = 4096
    pd_ratio: float = 10.0
    tp: int = 2
    chunk: int = 512
    batch_cap: int = 128
    seed: int = 42


@dataclass
class VidurRun:
    """A finished Vidur process: its per-request metrics and its whole-process cost."""

    metrics: Path
    wall_s: float
    cpu_s: float


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


def vidur_args(case: VidurCase, out: Path) -> list[str]:
    """Vidur's command line for ``case``, writing under ``out``."""
    rf = "--random_forrest_execution_time_predictor_config_"  # sic: Vidur's spelling
    uniform = "--uniform_request_length_generator_config_"
    return [
        "--seed", str(case.seed), "--cluster_config_num_replicas", str(case.replicas),
        "--replica_config_model_name", case.model, "--replica_config_device", "a100",
        "--replica_config_network_device", "a100_dgx", "--replica_config_tensor_parallel_size", str(case.tp),
        "--replica_config_num_pipeline_stages", "1", "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", str(case.chunk),
        "--sarathi_scheduler_config_batch_size_cap", str(case.batch_cap),
        "--global_scheduler_config_type", "round_robin", "--request_generator_config_type", "synthetic",
        "--synthetic_request_generator_config_num_requests", str(case.requests),
        "--length_generator_config_type", "uniform", uniform + "min_tokens", str(case.min_tokens),
        uniform + "max_tokens", str(case.max_tokens), uniform + "prefill_to_decode_ratio", str(case.pd_ratio),
        "--interval_generator_config_type", "poisson",
        "--poisson_request_interval_generator_config_qps", str(case.rate_rps),
        "--execution_time_predictor_config_type", "random_forrest",
        rf + "model_profiling_dataset", f"local/{MODEL_DATASET[case.model]}",
        rf + "network_profiling_dataset", "local/vidur-a100-dgx", rf + "cache_dir", str(HUB),
        rf + "num_estimators", "250", rf + "max_depth", "16", "32", rf + "k_fold_cv_splits", "3",
        rf + "prediction_max_tokens_per_request", str(max(4096, case.max_tokens)),
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--metrics_config_output_dir", str(out)]


def _child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_vidur(python: Path, case: VidurCase, out: Path) -> VidurRun | None:
    """One Vidur process; None when it crashed on a preemption, exit on any other failure."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    cpu0, wall0 = _child_cpu_s(), time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([python, "-m", "vidur.main", *vidur_args(case, out)], env=env,
                          capture_output=True, text=True, cwd=out)
    wall, cpu = time.perf_counter() - wall0, _child_cpu_s() - cpu0
    if proc.returncode:
        if "entities/request.py" in proc.stderr and "AssertionError" in proc.stderr:
            return None
        tail = proc.stderr.strip().splitlines()[-3:]
        sys.exit(f"fidelity: Vidur failed on {case}: {tail}")
    (run_dir,) = set(out.iterdir()) - before
    return VidurRun(run_dir / "request_metrics.csv", wall, cpu)


def vidur_latencies(path: Path) -> dict[int, tuple[float, float, float]]:
    """Request id -> (TTFT, TPOT, e2e) in seconds from Vidur's metrics."""
    out = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            ttft, e2e = float(row["prefill_e2e_time"]), float(row["request_e2e_time"])
            n = int(row["request_num_decode_tokens"])
            out[int(row["Request Id"])] = (ttft, (e2e - ttft) / (n - 1) if n > 1 else float("nan"), e2e)
    return out
