"""`make loadtest`: the field's load tools, unchanged, against `baton serve` in front of three
`baton emulate` engines (1 prefill + 2 decode, least-loaded), with SmolLM2's tokenizer offline.

    python scripts/loadtest.py [--requests N] [--rate R] [--tokenizer DIR] [--guidellm BIN]
                               [--inference-perf BIN]

Runs guidellm (and inference-perf when installed: it needs Python >= 3.12), checks that
every request succeeded with exactly the output tokens asked for, prints each tool's TTFT,
ITL and TPOT, and ends with one JSON line. Exits 1 if a check fails, 2 if a tool is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.core.paths import cache_dir  # noqa: E402
from tests.live import Server, servers, start_emulator, start_gateway  # noqa: E402

CACHE = cache_dir()

MODEL = "smollm2"
PROMPT_TOKENS, OUTPUT_TOKENS = 128, 32


def cluster(work: Path) -> tuple[list[Server], str]:
    """Three emulators serving `smollm2` and a gateway in front of them, launched
    (``servers`` waits until they answer, then stops them)."""
    emulators = [start_emulator(work, "--model", MODEL) for _ in range(3)]
    engines = [{"name": name, "url": e.url, "role": role}
               for e, (name, role) in zip(emulators, (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")))]
    gateway = start_gateway(work, {"policy": "least-loaded", "engines": engines})
    return [*emulators, gateway], gateway.url


def run_guidellm(binary: str, url: str, tokenizer: Path, n: int, rate: float, work: Path) -> dict:
    out = work / "guidellm.json"
    cmd = [binary, "run", "--backend", f"kind=openai_http,target={url},model={MODEL}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--profile", f"kind=constant,rate={rate}", "--constraint", f"kind=max_requests,count={n}",
           "--output", f"kind=json,path={out}", "--disable-console"]
    tool(cmd, work / "guidellm.log")
    m = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = m["request_totals"]
    ok = (totals["successful"] == n and totals["errored"] == 0
          and m["output_token_count"]["successful"]["mean"] == OUTPUT_TOKENS)
    med = lambda key: m[key]["successful"]["median"]  # noqa: E731
    return {"ok": ok, "successful": totals["successful"], "errored": totals["errored"],
            "ttft_ms": med("time_to_first_token_ms"), "itl_ms": med("inter_token_latency_ms"),
            "tpot_ms": med("time_per_output_token_ms"),
            "output_tokens_mean": m["output_token_count"]["successful"]["mean"]}


def run_inference_perf(binary: str, url: str, tokenizer: Path, n: int, rate: float, work: Path) -> dict:
    out = work / "inference-perf"
    config = {"api": {"type": "completion", "streaming": True},
              "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
              "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
              "data": {"type": "random",
                       "input_distribution": {"type": "fixed", "mean": PROMPT_TOKENS, "min": PROMPT_TOKENS,
                                              "max": PROMPT_TOKENS},
                       "output_distribution": {"type": "fixed", "mean": OUTPUT_TOKENS, "min": OUTPUT_TOKENS,
                                               "max": OUTPUT_TOKENS}},
              "load": {"type": "concurrent", "stages": [{"num_requests": n, "concurrency_level": max(1, int(rate))}],
                       "num_workers": 2, "base_seed": 42},
              "storage": {"local_storage": {"path": str(out)}}}
    (work / "inference-perf.yaml").write_text(json.dumps(config))  # YAML is a superset of JSON
    tool([binary, "-c", str(work / "inference-perf.yaml")], work / "inference-perf.log")
    d = json.loads((out / "summary_lifecycle_metrics.json").read_text())
    s = d["successes"]
    ok = (s["count"] == n and d["failures"]["count"] == 0 and s["output_len"]["mean"] == OUTPUT_TOKENS
          and s["token_count_mismatches"] == 0)
    lat = s["latency"]
    return {"ok": ok, "successful": s["count"], "errored": d["failures"]["count"],
            "ttft_ms": lat["time_to_first_token"]["median"] * 1e3,
            "itl_ms": lat["inter_token_latency"]["median"] * 1e3,
            "tpot_ms": lat["time_per_output_token"]["median"] * 1e3,
            "output_tokens_mean": s["output_len"]["mean"], "token_count_mismatches": s["token_count_mismatches"]}


def tool(cmd: list[str], log: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as handle:
        rc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=600).returncode
    if rc:
        sys.exit(f"loadtest: {Path(cmd[0]).name} failed (rc {rc}): {log.read_text()[-1500:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=4.0, help="requests/s (inference-perf: concurrency)")
    ap.add_argument("--tokenizer", type=Path, default=CACHE / "smollm2-tokenizer")
    ap.add_argument("--guidellm", default=shutil.which("guidellm") or str(Path(sys.executable).parent / "guidellm"))
    ap.add_argument("--inference-perf", default=shutil.which("inference-perf"))
    args = ap.parse_args()
    if not Path(args.guidellm).exists():
        print("loadtest: guidellm is not installed (pip install -e '.[loadtest]')", file=sys.stderr)
        sys.exit(2)
    if not (args.tokenizer / "tokenizer.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_tokenizer.py"), str(args.tokenizer)], check=True)
    work = Path(tempfile.mkdtemp(prefix="baton-loadtest-"))
    procs, url = cluster(work)
    results = {}
    try:
        with servers(*procs):
            results["guidellm"] = run_guidellm(args.guidellm, url, args.tokenizer, args.requests, args.rate, work)
            if args.inference_perf:
                results["inference_perf"] = run_inference_perf(args.inference_perf, url, args.tokenizer,
                                                               args.requests, args.rate, work)
            else:
                print("loadtest: inference-perf not installed (it needs Python >= 3.12); skipped")
    except RuntimeError as exc:  # a server did not come up
        sys.exit(f"loadtest: {exc}")
    for name, r in results.items():
        print(f"{name}: {r['successful']} ok, {r['errored']} errors, {r['output_tokens_mean']:.0f} output tokens "
              f"per request; median TTFT {r['ttft_ms']:.1f} ms, ITL {r['itl_ms']:.2f} ms, TPOT {r['tpot_ms']:.2f} ms"
              f"{'' if r['ok'] else '  <- CHECK FAILED'}")
    print(f"logs and outputs: {work}")
    print(json.dumps({"requests": args.requests, **results}))
    sys.exit(0 if all(r["ok"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
