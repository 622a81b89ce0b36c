"""Cache-aware routing: when routing on prefixes pays, and what a decision costs.

    python benchmarks/cache_aware.py [--repeats 3] [--out DIR] [--skip-mooncake] [--quick]

(1) The sessions workload (its defaults: Zipf-popular system prompts, multi-turn sessions,
agent loops) on 8 colocated Llama-3.1-8B (A100-80G) instances, TTFT SLO 2 s, TPOT SLO 0.1 s:
each policy's max sustainable rate at 90% SLO attainment over a rate grid, per repeat
(seeds draw different sessions), with 95% intervals, and the best cache-aware policy over
least-loaded as paired per-repeat ratios (target >= 1.3x). The same in PD (2P6D: the
prefill instance chosen by prefix, the decode instance by token load).
(2) At a rate below every knee: hit rate against the unbounded-cache bound (the reuse the
workload offers), P50/P95 TTFT and load CV (across-instance coefficient of variation of token
load, mean over time), colocated and PD.
(3) The Mooncake conversation trace (``../shared/traces/``; skipped when absent): windows of
``--mooncake-requests`` requests (one per repeat, at successive offsets), 16 colocated
instances (and 4P12D): the same figures at the trace's own arrival times, and max sustainable rates
(arrivals rescaled, burst shape kept) with a TTFT SLO of 10 s (its prompts average 12k
tokens: 2 s is out of reach for many whatever the load).
(4) Decision cost at 64 and 1,024 prefill instances with 1M blocks indexed (as the gateway's
KV-event index holds them, and as the routers' own histories hold them for the policies that
match on those): per decision, hashing the prompt's token ids into block keys (2,000
tokens, half of them a cached prefix) and the policy's choice; median and p99 (us).
Targets: median <= 50 us, p99 <= 500 us. ``--steps`` also times each step of a
``prefix-precise`` decision at 64 instances. Tokenizing does not count (a request that gives
``prompt_token_ids`` needs none); with ``--tokenizer PATH`` (a local ``tokenizer.json`` or its
folder, e.g. the SmolLM2 one ``make real-vllm`` leaves in ``~/.cache/baton/smollm2-hf``) what
the gateway pays to tokenize a text prompt of about 2,000 tokens is reported separately.

Writes ``attainment.png`` (attainment against rate per policy) and ``results.json`` into
``--out``; the last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.core import ClusterView, InstanceState, Request, RequestState, Role  # noqa: E402
from baton.core.info import InfoModel, ViewMode  # noqa: E402
from baton.core.prefix import reuse_offered, token_block_keys  # noqa: E402
from baton.core.prefix_index import PrefixIndex  # noqa: E402
from baton.experiments.config import Experiment, WorkloadConfig  # noqa: E402
from baton.experiments.steady import CAPPED, UNMEASURABLE, sustained  # noqa: E402
from baton.experiments.sweep import run_sweep  # noqa: E402
from baton.metrics import SLO  # noqa: E402
from baton.perf import build  # noqa: E402
from baton.policies import PolicyContext, build_scheduler  # noqa: E402
from baton.policies.selection import argmax_of  # noqa: E402
from baton.sim import ClusterSpec  # noqa: E402
from baton.workload import load_trace  # noqa: E402
from baton.workload.transform import window  # noqa: E402
from baton.workload.sessions import SessionsSpec, generate_sessions  # noqa: E402

PRESET = "llama-3.1-8b@a100-80g"
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
SLO_2S = SLO(ttft_s=2.0, tpot_s=0.1)
MOONCAKE_SLO = SLO(ttft_s=10.0, tpot_s=0.1)
CACHE_AWARE = ("prefix-precise", "prefix-approx", "kv-cost", "cache-aware")
COLOCATED = {"round-robin": "colocated-rr", "least-loaded": "colocated", **{p: p for p in CACHE_AWARE}}
PD = {"round-robin": "round-robin", "least-loaded": "least-loaded", **{p: p for p in CACHE_AWARE}}
SESSION_RATES = [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0]
MOONCAKE_RATES = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
MOONCAKE_PD_RATES = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0]


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, 95% low, 95% high) by Student's t; NaNs where fewer than two values."""
    from scipy import stats

    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan, math.nan
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def ratio_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Paired ratio a/b: the geometric mean and its 95% interval (on log ratios)."""
    logs = [math.log(x / y) for x, y in zip(a, b) if x and y and x > 0 and y > 0]
    m, lo, hi = interval(logs)
    return math.exp(m), math.exp(lo), math.exp(hi)


def sweep(base: Experiment, policies: dict, rates: list[float], seeds: int, label: str) -> dict:
    """Max sustainable rate per policy per seed, and the attainment curves of seed 0."""
    per_seed: dict[str, list[float | None]] = {name: [] for name in policies}
    curves: dict[str, list[float]] = {}
    for seed in range(seeds):
        t0 = time.perf_counter()
        result = run_sweep(replace(base, seed=seed), policies, rates)
        for name, rate in result.max_rates_rps().items():
            per_seed[name].append(rate)
        if seed == 0:
            curves = {name: result.series(name, "slo_attainment") for name in policies}
        print(f"  {label}: repeat {seed + 1}/{seeds} swept in {time.perf_counter() - t0:.0f} s", flush=True)
    return {"max_rate": per_seed, "curves": curves}


def report_rates(label: str, res: dict, out: dict, key: str) -> None:
    rates = res["max_rate"]
    print(f"{label}: max sustainable rate at 90% attainment (req/s; mean [95% interval] over repeats)")
    for name, values in rates.items():
        m, lo, hi = interval([v if v is not None else 0.0 for v in values])
        print(f"  {name:<16} {m:6.2f} [{lo:6.2f}, {hi:6.2f}]   per repeat {values}")
        out[f"{key}_{name.replace('-', '_')}_max_rate_rps"] = m
        out[f"{key}_{name.replace('-', '_')}_max_rate_per_repeat"] = values  # None: no steady window at the knee
    best = max(CACHE_AWARE, key=lambda p: interval([v or 0.0 for v in rates[p]])[0])
    g, lo, hi = ratio_interval([v or 0.0 for v in rates[best]], [v or 0.0 for v in rates["least-loaded"]])
    print(f"  best cache-aware ({best}) over least-loaded: {g:.2f}x [{lo:.2f}, {hi:.2f}] (target >= 1.3x)")
    out[f"{key}_best_cache_aware"] = best
    out[f"{key}_best_over_least_loaded"] = g
    out[f"{key}_best_over_least_loaded_ci95"] = [lo, hi]


def at_rate(base: Experiment, policies: dict, rate: float, seeds: int, label: str, out: dict, key: str,
            bound: list[float]) -> None:
    """Hit rate, P50/P95 TTFT and load CV of every policy at one rate."""
    from baton.experiments.sweep import run_point

    b_m, _, _ = interval(bound)
    print(f"{label} at {rate:g} req/s (reuse offered, an unbounded cache: {b_m:.3f})")
    print(f"  {'policy':<16} {'hit rate':>16} {'P50 TTFT s':>18} {'P95 TTFT s':>18} {'load CV':>14}")
    for name, policy in policies.items():
        figures_row(name, [run_point(replace(base, policy=policy, seed=s), rate) for s in range(seeds)], out, key)


def figures_row(name: str, runs: list[dict], out: dict, key: str) -> None:
    """Print one policy's hit rate, P50/P95 TTFT and load CV (mean [95% interval])."""
    cells = []
    for metric in ("prefix_cache_hit_rate", "p50_ttft_s", "p95_ttft_s", "load_cv"):
        m, lo, hi = interval([r[metric] for r in runs])
        cells.append(f"{m:6.3f} [{lo:5.3f},{hi:5.3f}]" if math.isfinite(lo) else f"{m:6.3f}")
        out[f"{key}_{name.replace('-', '_')}_{metric}"] = m
    print(f"  {name:<16} " + " ".join(f"{c:>18}" for c in cells))


def sessions(args, out: dict, plots: dict) -> None:
    spec = SessionsSpec()
    bound = [reuse_offered(generate_sessions(spec, np.random.default_rng(s))) for s in range(args.repeats)]
    for layout, cluster, policies in (("colocated", ClusterSpec(prefill=0, decode=0, mixed=8, preset=PRESET), COLOCATED),
                                      ("pd", ClusterSpec(prefill=2, decode=6, preset=PRESET), PD)):
        base = Experiment(cluster=cluster, workload=WorkloadConfig(sessions=spec), slo=SLO_2S)
        label = f"sessions, 8 instances {layout}"
        res = sweep(base, policies, SESSION_RATES, args.repeats, label)
        report_rates(label, res, out, f"sessions_{layout}")
        plots[label] = (SESSION_RATES, res["curves"])
        at_rate(base, policies, args.sessions_rate, args.repeats, label, out, f"sessions_{layout}", bound)


def mooncake(args, out: dict, plots: dict) -> None:
    if not TRACE.is_file():
        print(f"mooncake: skipped ({TRACE} not found)")
        return
    whole = load_trace(TRACE)
    n = args.mooncake_requests
    windows = []
    for k in range(args.repeats):
        part = window(whole, k * n, n)
        if len(part) == n:
            windows.append(part)
    bound = [reuse_offered(w) for w in windows]
    cluster = ClusterSpec(prefill=0, decode=0, mixed=16, preset=PRESET)
    label = f"mooncake conversation, windows of {n} requests, 16 instances colocated"
    print(f"{label}, at the trace's own arrival times (reuse offered, an unbounded cache: "
          f"{np.mean(bound):.3f}; per window {[round(b, 3) for b in bound]})")
    print(f"  {'policy':<16} {'hit rate':>16} {'P50 TTFT s':>18} {'P95 TTFT s':>18} {'load CV':>14}")
    for name, policy in COLOCATED.items():
        figures_row(name, _map(_summary, [(w, cluster, policy, None) for w in windows]), out, "mooncake")
    pd = ClusterSpec(prefill=4, decode=12, preset=PRESET)
    print(f"{label.replace('colocated', '4P12D')}, at the trace's own arrival times")
    for name, policy in PD.items():
        figures_row(name, _map(_summary, [(w, pd, policy, None) for w in windows]), out, "mooncake_pd")
    per_seed: dict[str, list[float | None]] = {name: [] for name in COLOCATED}
    curves: dict[str, list[float]] = {}
    for k, part in enumerate(windows):
        for name, (rate, att, status) in _sweep_requests(part, cluster, MOONCAKE_RATES).items():
            per_seed[name].append(rate)
            out.setdefault(f"mooncake_{name.replace('-', '_')}_max_rate_status_per_repeat", []).append(status)
            if k == 0:
                curves[name] = att
        print(f"  mooncake: window {k + 1}/{len(windows)} swept", flush=True)
    report_rates(f"{label} (TTFT SLO {MOONCAKE_SLO.ttft_s:g} s: its prompts average 12k tokens)",
                 {"max_rate": per_seed}, out, "mooncake")
    pd_rates = {name: [] for name in PD}
    for part in windows:
        for name, (rate, _, status) in _sweep_requests(part, pd, MOONCAKE_PD_RATES, PD).items():
            pd_rates[name].append(rate)
            out.setdefault(f"mooncake_pd_{name.replace('-', '_')}_max_rate_status_per_repeat", []).append(status)
    report_rates(f"{label.replace('colocated', '4P12D')} (TTFT SLO {MOONCAKE_SLO.ttft_s:g} s)",
                 {"max_rate": pd_rates}, out, "mooncake_pd")
    plots[label] = (MOONCAKE_RATES, curves)
    out["mooncake_reuse_offered"] = float(np.mean(bound)) if bound else math.nan


def _sweep_requests(reqs: list[Request], cluster: ClusterSpec, rates: list[float], policies: dict = COLOCATED) -> dict:
    """Per policy: (max sustainable rate, attainment per rate) of fixed requests rescaled.
    The window is fixed, so a rate whose window is not steady (shorter than max(60 s, 10
    mean e2e) of arrivals) cannot be measured on it: a knee next to one is None (counted as
    0 in the means) and said on stdout, as is a capped search."""
    points = [(name, pol, rate) for name, pol in policies.items() for rate in rates]
    results = _map(_summary, [(reqs, cluster, pol, rate) for _, pol, rate in points])
    out = {}
    for name in policies:
        runs = [r for (nm, _, _), r in zip(points, results) if nm == name]
        knee = sustained(rates, runs, 0.9)
        if knee.status in (UNMEASURABLE, CAPPED):
            print(f"  {name}: {knee.text()} req/s ({knee.status})", flush=True)
        out[name] = (knee.rate_rps, [r["slo_attainment"] for r in runs], knee.status)
    return out


def _map(fn, args: list) -> list:
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        return list(pool.map(fn, args))


def _summary(arg) -> dict:
    """The summary of one run: fixed requests, rescaled to ``rate`` req/s unless None."""
    from baton.sim import simulate
    from baton.workload.transform import scale_to_rate

    reqs, cluster, policy, rate = arg
    reqs = scale_to_rate(reqs, rate) if rate is not None else reqs
    return simulate(reqs, cluster, policy).summary(MOONCAKE_SLO)


def decision_view(instances: int, indexed_blocks: int, rng: np.random.Generator) -> tuple[ClusterView, list]:
    """A gateway's view with ``indexed_blocks`` engine blocks indexed, queues and KV usage
    drawn, and 16 cached 1,000-token prefixes (each on three instances)."""
    index = PrefixIndex()
    per = indexed_blocks // instances
    for i in range(instances):  # every instance holds its share of distinct blocks
        index.add(i, range(i * per, (i + 1) * per))
    states = {}
    insts = {i: InstanceState(i, Role.MIXED, 40_000, 16) for i in range(instances)}
    for i, inst in insts.items():
        inst.kv_blocks_used = int(rng.integers(0, 30_000))
        for j in range(int(rng.integers(0, 8))):
            inst.queue_prefill(1_000_000 + 100 * i + j, int(rng.integers(100, 4000)))
    for inst in insts.values():  # the gateway's view: engine metrics as last scraped
        inst.set_sample(inst.engine_sample(0.0))
    view = ClusterView(insts, states, InfoModel(ViewMode.SCRAPED, 1.0), prefix_source=index)
    prefixes = [rng.integers(0, 50_000, 1000).tolist() for _ in range(16)]
    for p_i, prefix in enumerate(prefixes):  # 16 cached 1,000-token prefixes, each on a few instances
        keys = token_block_keys(prefix, 16)
        for i in rng.choice(instances, size=3, replace=False):
            index.add(int(i), keys)
    return view, prefixes


def fill_history(sched, view: ClusterView, indexed_blocks: int, prompt_blocks: int = 125) -> None:
    """Stages that match on their own routing history (``prefix-approx``, ``cache-aware``)
    start with the blocks the engine index holds recorded there too: each instance its share
    of ``indexed_blocks``, as prompts of ``prompt_blocks`` distinct blocks."""
    ids = view.prefill_ids
    per = indexed_blocks // len(ids)
    for stage in sched.stages:
        history = getattr(stage, "history", None)
        for i in ids if history is not None else ():
            for start in range(i * per, (i + 1) * per, prompt_blocks):
                history.record(i, range(start, min(start + prompt_blocks, (i + 1) * per)),
                               view.instance(i).kv_blocks_total)


def decision_cost(instances: int, indexed_blocks: int, decisions: int, rng: np.random.Generator) -> dict:
    """Median and p99 (us) of hashing a prompt and choosing its instance, per policy."""
    view, prefixes = decision_view(instances, indexed_blocks, rng)
    out = {}
    perf = build(PRESET)
    for policy in CACHE_AWARE:
        sched = build_scheduler(policy, PolicyContext(np.random.default_rng(0), perf))
        fill_history(sched, view, indexed_blocks)
        times = np.empty(decisions)
        for k in range(decisions):
            tokens = prefixes[k % len(prefixes)] + rng.integers(0, 50_000, 1000).tolist()
            st = RequestState(Request(k, 0.0, len(tokens), 100))
            t0 = time.perf_counter()
            st.block_keys = tuple(token_block_keys(tokens, 16))
            sched.plan_arrival(view, st)
            times[k] = time.perf_counter() - t0
        out[policy] = (float(np.median(times) * 1e6), float(np.percentile(times, 99) * 1e6))
    return out


def decision_steps(instances: int, decisions: int, rng: np.random.Generator) -> dict[str, float]:
    """Median us of each step of a ``prefix-precise`` decision (its ``pick_prefill`` and
    ``record_placement``, spelled out), on the view ``decision_cost`` times."""
    view, prefixes = decision_view(instances, 1_000_000, rng)
    stage = build_scheduler("prefix-precise", PolicyContext(np.random.default_rng(0), build(PRESET))).stages[0]
    times: dict[str, list[float]] = {}

    def timed(step, f):
        t0 = time.perf_counter()
        value = f()
        times.setdefault(step, []).append(time.perf_counter() - t0)
        return value
    for k in range(decisions):
        tokens = prefixes[k % len(prefixes)] + rng.integers(0, 50_000, 1000).tolist()
        keys = timed("hash the token ids", lambda: tuple(token_block_keys(tokens, 16)))
        ids = view.prefill_ids
        engines = timed("match the engine index", lambda: view.prefix_matches(keys))
        predicted = timed("match the predicted entries", lambda: stage.predicted.matches(view.now_s, keys))
        cached = timed("merge the two", lambda: stage.merged(engines, predicted))
        score = timed("KV and queue scores, prefix term, argmax",
                      lambda: argmax_of(ids, stage.scores(view, ids, cached, len(keys))))
        timed("record the predicted entries", lambda: stage.predicted.add(view.now_s, score, keys))
    return {step: float(np.median(v) * 1e6) for step, v in times.items()}


def tokenize_cost(path: Path, prompts: int, rng: np.random.Generator) -> tuple[float, float, int]:
    """(median us, p99 us, mean tokens) of the gateway's tokenization of a text prompt
    (``HFTokenizer.ids`` with special tokens, as ``GatewayApp.prompt_keys`` calls it) for
    prompts of 1,900 words drawn from a small vocabulary (about 2,000 tokens)."""
    from baton.workload.tokens import HFTokenizer

    tok = HFTokenizer(path)
    words = ["cache", "prefix", "routing", "decode", "tokens", "latency", "the", "of", "instance", "engine",
             "request", "scheduler", "batch", "memory", "block", "quantile", "gateway", "server", "policy", "model"]
    times, counts = np.empty(prompts), []
    for k in range(prompts):
        text = " ".join(words[j] for j in rng.integers(0, len(words), 1900)) + f" {k}"
        t0 = time.perf_counter()
        ids = tok.ids(text, special=True)
        times[k] = time.perf_counter() - t0
        counts.append(len(ids))
    return float(np.median(times) * 1e6), float(np.percentile(times, 99) * 1e6), int(np.mean(counts))


def plot(plots: dict, out_dir: Path) -> Path | None:
    from figures import pyplot

    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(plots), figsize=(6 * len(plots), 4.2), squeeze=False)
    for ax, (label, (rates, curves)) in zip(axes[0], plots.items()):
        for name, att in curves.items():
            ax.plot(rates, att, marker="o", label=name)
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("SLO attainment (TTFT 2 s, TPOT 0.1 s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "attainment.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sessions-rate", type=float, default=6.0, help="the fixed rate of (2), req/s")
    ap.add_argument("--mooncake-requests", type=int, default=1500)
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--skip-sessions", action="store_true")
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--steps", action="store_true",
                    help="also time each step of a prefix-precise decision at 64 instances")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="also time tokenizing a 2,000-token text prompt with this tokenizer.json (or folder)")
    ap.add_argument("--out", type=Path, default=Path("cache-aware-results"))
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    plots: dict = {}
    if not args.skip_sessions:
        sessions(args, out, plots)
    if not args.skip_mooncake:
        mooncake(args, out, plots)
    print("decision cost (us; hashing 2,000 token ids included), 1M blocks indexed")
    rng = np.random.default_rng(0)
    for n in (64, 1024):
        costs = decision_cost(n, 1_000_000, args.decisions, rng)
        for policy, (med, p99) in costs.items():
            print(f"  {n:5d} instances {policy:<16} median {med:7.1f}  p99 {p99:8.1f}")
            key = policy.replace("-", "_")
            out[f"decision_{key}_{n}_median_us"], out[f"decision_{key}_{n}_p99_us"] = med, p99
    if args.steps:
        print("prefix-precise at 64 instances, median us per step:")
        for step, us in decision_steps(64, args.decisions, np.random.default_rng(0)).items():
            print(f"  {step:<40} {us:6.1f}")
            out[f"step_{step.replace(' ', '_').replace(',', '')}_us"] = us
    if args.tokenizer is not None:
        med, p99, tokens = tokenize_cost(args.tokenizer, args.decisions, np.random.default_rng(0))
        print(f"tokenizing a text prompt of {tokens:,} tokens (not part of a decision): median {med:.1f} us, "
              f"p99 {p99:.1f} us")
        out["tokenize_median_us"], out["tokenize_p99_us"], out["tokenize_prompt_tokens"] = med, p99, tokens
    png = plot(plots, args.out) if plots else None
    if png:
        print(f"plot: {png}")
    (args.out / "results.json").write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}, default=str))
    if args.record:
        from baton.report.results import record
        # the decision costs alone (quiet-machine figures) go to their own file
        name = "cache-aware-decisions" if args.skip_sessions and args.skip_mooncake else "cache-aware"
        record(name, json.loads(json.dumps(out, default=str)), time.perf_counter() - started,
               "python benchmarks/cache_aware.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
