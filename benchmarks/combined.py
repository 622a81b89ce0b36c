"""The combined scheduler against every single policy, workload by workload.

    python benchmarks/combined.py [--repeats 3] [--scales 8 64] [--workloads ...] [--out DIR]

Workloads (five regimes): the Azure code and conversation traces and the Mooncake
conversation trace (``../shared/traces/``; a workload whose trace is absent is skipped;
``--trace FILE`` runs on any trace instead), each repeat on its own consecutive part of the
trace with its arrivals rescaled (burst shape kept); a synthetic reasoning workload (long
outputs, SIBYL's); the sessions workload (prefix reuse), a fresh seed per repeat.

Steady windows: a rate is sustained when 90% of the requests arriving in a steady window
meet the SLO, the window spanning at least max(60 s, 10 mean e2e) of arrivals
(``baton.experiments.steady``): a rate that passes on the first window (the requests per
instance below) runs again on as many requests as that needs; one whose trace part holds
too few counts as a miss and is reported (a burst is not a sustained rate). Each cell also
says which policies were capped and which rejected more than 0.1% of their requests. Clusters of ``llama-3.1-8b@a100-80g``
instances, half prefill and half decode (4P4D, 32P32D): a fixed split the traffic may not
suit, as in a fleet configured yesterday.

Policies: ``combined``; the pool of single policies ``sibyl``, ``ares``, ``arrow``,
``kairos``, ``least-loaded``, ``least-outstanding`` and the best cache-aware policy in PD
(``prefix-precise``); ``cascade`` runs only on colocated instances and these clusters are
PD, so it is not in the pool. At 8 instances (``--ablation-scales``), the ablations:
combined with one component off at a time.

Runs above 8 instances use ``--large-fraction`` (0.4) of the requests per instance, so a
64-instance sweep costs about 3x an 8-instance one, not 8x. For each (workload, scale, policy, repeat) the max sustainable rate at 90% SLO attainment
is found by bisection on the rate (log scale) within a bracket around least-loaded's knee
of that repeat, to about 2% (a policy still attaining at the bracket's top after
``--widenings`` doublings is reported at the last rate verified and flagged as capped: a lower
bound, not a knee). Per workload and scale: every policy's mean and 95% interval
over repeats; the best single policy (highest mean); combined minus best as a paired
difference per repeat with its 95% interval (Student's t): "not below" when the interval
includes or exceeds 0, "above" when it excludes 0 above. The ablation table gives full
combined minus each ablation, paired. Each workload's combined run at least-loaded's knee
reports what each component did (deflections, flips, migrations, bindings that differ from
token load, matched prefix blocks).

Writes ``combined.png`` (max rate per policy relative to the best single policy) and
``results.json`` into ``--out``; the last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from baton.metrics import SLO  # noqa: E402
from baton.sim import ClusterSpec, simulate  # noqa: E402

PRESET = "llama-3.1-8b@a100-80g"
TRACES = ROOT.parent / "shared" / "traces"
POOL = ("sibyl", "ares", "arrow", "kairos", "least-loaded", "least-outstanding", "prefix-precise")
ABLATIONS = {
    "combined-no-prefix": {"prefill": "least-loaded"},
    "combined-no-deflect": {"deflect": False},
    "combined-no-flips": {"flips": False},
    "combined-token-binding": {"decode_binding": "token-load"},
    "combined-no-migrate": {"migrate": False},
}
# workload -> (requests per instance in a run, SLO, nominal max rate per instance req/s)
WORKLOADS = {
    "azure-code": (125, SLO(ttft_s=3.0, tpot_s=0.1), 1.0),
    "azure-conv": (150, SLO(ttft_s=3.0, tpot_s=0.1), 7.0),
    "mooncake": (100, SLO(ttft_s=10.0, tpot_s=0.1), 0.15),
    "reasoning": (300, SLO(ttft_s=2.0, tpot_s=0.1), 1.0),
    "sessions": (150, SLO(ttft_s=2.0, tpot_s=0.1), 1.5),
}
TRACE_FILES = {"azure-code": "azure_code_2023.csv", "azure-conv": "azure_conv_2023.csv",
               "mooncake": "mooncake_conversation.jsonl"}
BISECTIONS = [6]  # --bisections
CAPPED: dict = {}  # "workload@scale" -> policy -> repeats whose knee lay above the widened bracket
PARTS = [3]  # a trace is cut into this many consecutive parts, one per repeat (first_repeat + repeats)


def policy_config(name: str):
    if name in ABLATIONS:
        return {"name": name, "stages": [{"stage": "combined", **ABLATIONS[name]}]}
    return name


@lru_cache(maxsize=4)
def _trace(workload: str):
    from baton.workload import load_trace
    return load_trace(TRACES / TRACE_FILES[workload])


LARGE_FRACTION = [1.0]  # of the requests per instance at scales above 8 (--large-fraction)


def window_requests(workload: str, instances: int) -> int:
    """Requests in one repeat's first window (or synthetic draw) at this scale; a rate
    that passes on it runs again on a steady window (``baton.experiments.steady``)."""
    return int(WORKLOADS[workload][0] * (LARGE_FRACTION[0] if instances > 8 else 1.0) * instances)


def trace_part(workload: str) -> int:
    """Requests in each repeat's part of a trace (``PARTS`` consecutive parts)."""
    return len(_trace(workload)) // PARTS[0]


@lru_cache(maxsize=64)
def requests_for(workload: str, instances: int, repeat: int, n: int) -> tuple:
    """The first ``n`` requests of one repeat (arrivals rescaled later): of its part of a
    trace (fewer when the part holds fewer), or of its seeded synthetic draw."""
    if workload in TRACE_FILES:
        part = trace_part(workload)
        from baton.workload.transform import window
        return tuple(window(_trace(workload), repeat * part, min(n, part)))
    rng = np.random.default_rng(1000 + repeat)
    if workload == "reasoning":
        from baton.workload import generate, reasoning_spec
        return tuple(generate(reasoning_spec(n, 1.0), rng))
    from baton.workload.sessions import SessionsSpec, generate_sessions
    reqs = generate_sessions(SessionsSpec(sessions=max(20, n // 6)), rng)
    return tuple(reqs[:n])


def cluster_for(instances: int) -> ClusterSpec:
    return ClusterSpec(prefill=instances // 2, decode=instances - instances // 2, preset=PRESET)


def attainment(workload: str, instances: int, repeat: int, policy: str, rate: float,
               report: bool = False) -> tuple[float, dict]:
    """SLO attainment (0..1) of one run on a steady window (``steady_point``: a pass on a
    window shorter than max(60 s, 10 mean e2e) of arrivals runs again on a longer one; one
    that still is not steady counts as a miss: a burst, not a sustained rate), and the
    run's summary with the policy's report when asked."""
    from baton.experiments.steady import steady_point
    from baton.workload.transform import scale_to_rate
    reports = {}

    def run(n: int) -> dict:
        reqs = scale_to_rate(list(requests_for(workload, instances, repeat, n)), rate)
        result = simulate(reqs, cluster_for(instances), policy_config(policy), slo=WORKLOADS[workload][1])
        reports["policy"] = dict(result.policy_report)
        return result.summary(WORKLOADS[workload][1])
    summary = steady_point(run, rate, window_requests(workload, instances))
    info = {k: v for k, v in summary.items() if k.startswith("rejected") or k in ("requests", "steady")}
    return float(summary["slo_attainment"]), ({**info, **reports["policy"]} if report else info)


def passes(workload: str, instances: int, repeat: int, policy: str, rate: float, seen: dict) -> bool:
    """Whether ``rate`` is sustained: 90% attainment on a steady window. ``seen`` keeps
    the count of passes on windows that were not steady (``unsteady``) and the rejections
    of the last sustained rate (``dropped``)."""
    att, info = attainment(workload, instances, repeat, policy, rate)
    if att >= 0.9 and not info["steady"]:
        seen["unsteady"] = seen.get("unsteady", 0) + 1
    ok = att >= 0.9 and bool(info["steady"])
    if ok:
        seen["dropped"] = {k: v for k, v in info.items() if k.startswith("rejected") or k == "requests"}
    return ok


WIDENINGS = [3]  # --widenings: doublings of the bracket's top before a knee counts as capped


def knee(workload: str, instances: int, repeat: int, policy: str, lo: float, hi: float,
         seen: dict) -> tuple[float, bool]:
    """(the highest sustained rate (``passes``), capped), by bisection in log space within
    [lo, hi], widened while an end is on the wrong side: 0 when even lo/8 misses; when hi
    still attains after ``WIDENINGS`` doublings, the last rate verified and capped True
    (a lower bound, not a knee)."""
    def ok(rate: float) -> bool:
        return passes(workload, instances, repeat, policy, rate, seen)
    for _ in range(WIDENINGS[0]):
        if not ok(hi):
            break
        lo, hi = hi, hi * 2.0
    else:
        return lo, True
    for _ in range(3):
        if ok(lo):
            break
        lo, hi = lo / 2.0, lo
    else:
        return 0.0, False
    for _ in range(BISECTIONS[0]):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, False


def task(args: tuple) -> tuple:
    workload, instances, repeat, policy, center, fraction, bisections, widenings, parts = args
    LARGE_FRACTION[0], BISECTIONS[0], WIDENINGS[0], PARTS[0] = fraction, bisections, widenings, parts
    t0 = time.perf_counter()
    seen: dict = {}
    rate, capped = knee(workload, instances, repeat, policy, center / 2.0, center * 2.0, seen)
    return workload, instances, repeat, policy, rate, capped, time.perf_counter() - t0, seen


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, 95% low, 95% high) by Student's t."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return float(x.mean()) if x.size else math.nan, math.nan, math.nan
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def run_all(args) -> dict:
    """Every knee: {(workload, scale): {policy: [rate per repeat]}}."""
    from rich.progress import Progress

    rates: dict = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool, Progress() as bar:
        for instances in args.scales:
            for workload in args.workloads:
                repeats = range(args.first_repeat, args.first_repeat + args.repeats)
                cell = rates.setdefault((workload, instances), {})
                capped = CAPPED.setdefault(f"{workload}@{instances}", {})
                knobs = (args.large_fraction, args.bisections, args.widenings, PARTS[0])
                if args.center:  # a given bracket centre: least-loaded's knee is not run
                    centers = [(workload, instances, r, "least-loaded", args.center, False) for r in repeats]
                else:
                    centers = list(pool.map(task, [(workload, instances, r, "least-loaded",
                                                    WORKLOADS[workload][2] * instances, *knobs) for r in repeats]))
                    cell["least-loaded"] = [c[4] for c in centers]
                    capped["least-loaded"] = [c[2] for c in centers if c[5]]
                    for c in centers:
                        note_seen(workload, instances, "least-loaded", c[7])
                policies = ["combined", *[p for p in args.pool if p != "least-loaded"]]
                if instances in args.ablation_scales and not args.no_ablations:
                    policies += list(ABLATIONS)
                jobs = [(workload, instances, r, p, centers[k][4] or WORKLOADS[workload][2] * instances, *knobs)
                        for p in policies for k, r in enumerate(repeats)]
                progress = bar.add_task(f"{workload} @ {instances}", total=len(jobs))
                for fut in as_completed([pool.submit(task, j) for j in jobs]):
                    w, n, r, p, rate, was_capped, _, seen = fut.result()
                    cell.setdefault(p, [math.nan] * args.repeats)[r - args.first_repeat] = rate
                    note_seen(workload, instances, p, seen)
                    if was_capped:
                        capped.setdefault(p, []).append(r)
                    bar.advance(progress)
                report(workload, instances, cell)
                partial = {f"{w}@{n}": c for (w, n), c in rates.items()}
                (args.out / "partial.json").write_text(json.dumps(partial, indent=1))  # a long sweep keeps its cells
    return rates


UNSTEADY: dict = {}  # "workload@scale" -> policy -> rates that passed on a window too short to count
DROPPED: dict = {}  # "workload@scale" -> policy -> [rejected, requests, {reason: count}] at its knees


def note_seen(workload: str, instances: int, policy: str, seen: dict) -> None:
    """Fold one knee search's unsteady passes and its knee's rejections into the cell's."""
    key = f"{workload}@{instances}"
    if seen.get("unsteady"):
        UNSTEADY.setdefault(key, {})[policy] = UNSTEADY.get(key, {}).get(policy, 0) + seen["unsteady"]
    dropped = seen.get("dropped") or {}
    if dropped:
        entry = DROPPED.setdefault(key, {}).setdefault(policy, [0, 0, {}])
        entry[0] += dropped.get("rejected", 0)
        entry[1] += dropped.get("requests", 0)
        for k, v in dropped.items():
            if k.startswith("rejected_") and v:
                entry[2][k[len("rejected_"):]] = entry[2].get(k[len("rejected_"):], 0) + v


def dropped_lines(workload: str, instances: int) -> list[str]:
    """A line per policy that rejected more than 0.1% of its requests at its knees."""
    out = []
    for policy, (rejected, total, reasons) in DROPPED.get(f"{workload}@{instances}", {}).items():
        if total and rejected / total > 0.001:
            why = ", ".join(f"{r} {c:.0f}" for r, c in sorted(reasons.items()))
            out.append(f"  {policy}: rejected {rejected:.0f} of {total:.0f} requests at its knees "
                       f"({100 * rejected / total:.1f}%: {why}), counted as SLO misses")
    return out


def report(workload: str, instances: int, cell: dict) -> dict:
    """Print one (workload, scale) table; return its verdict figures."""
    print(f"\n{workload}, {instances} instances ({instances // 2}P{instances - instances // 2}D): max sustainable "
          f"rate at 90% attainment, req/s, mean [95% interval] over repeats")
    means = {p: interval(v)[0] for p, v in cell.items()}
    for p, v in cell.items():
        m, lo, hi = interval(v)
        print(f"  {p:<24} {m:8.3f} [{lo:8.3f}, {hi:8.3f}]   per repeat {[round(x, 3) for x in v]}")
    capped = {p: r for p, r in CAPPED.get(f"{workload}@{instances}", {}).items() if r}
    for p, r in capped.items():
        print(f"  {p}: CAPPED: repeats {sorted(r)} still attained at the bracket's top: their figure is the last "
              "rate verified, a lower bound")
    for p, count in UNSTEADY.get(f"{workload}@{instances}", {}).items():
        print(f"  {p}: {count} rate(s) passed only on a window shorter than max(60 s, 10 mean e2e) of arrivals "
              "(a trace part held no more, or the longer window's e2e asked for more still): counted as misses")
    for line in dropped_lines(workload, instances):
        print(line)
    singles = [p for p in POOL if p in cell]  # least-loaded (unless --center), the rest as --pool names
    best = max(singles, key=lambda p: means[p])
    diff = [a - b for a, b in zip(cell["combined"], cell[best])]
    m, lo, hi = interval(diff)
    verdict = "above" if lo > 0 else ("not below" if hi >= 0 else "BELOW")
    if math.isnan(lo):
        verdict = "no interval (one repeat)"
    if best in capped or ("combined" in capped and verdict != "above"):
        verdict += " (capped: see above)"
    unsteady = UNSTEADY.get(f"{workload}@{instances}", {})
    if best in unsteady or "combined" in unsteady:
        verdict += " (a knee may lie above what the trace can show: see above)"
    print(f"  combined - best single ({best}): {m:+.3f} [{lo:+.3f}, {hi:+.3f}] req/s -> {verdict}")
    out = {"best_single": best, "combined_minus_best": m, "ci95": [lo, hi], "verdict": verdict}
    for name in ABLATIONS:
        if name in cell:
            a_m, a_lo, a_hi = interval([a - b for a, b in zip(cell["combined"], cell[name])])
            print(f"  combined - {name}: {a_m:+.3f} [{a_lo:+.3f}, {a_hi:+.3f}] req/s")
            out[f"minus_{name}"] = [a_m, a_lo, a_hi]
    return out


def activity(args, rates: dict) -> dict:
    """What each component did in combined's run at least-loaded's knee (repeat 0)."""
    out = {}
    for (workload, instances), cell in rates.items():
        rate = (cell["least-loaded"][0] if "least-loaded" in cell else args.center) or WORKLOADS[workload][2] * instances
        _, rep = attainment(workload, instances, args.first_repeat, "combined", rate, report=True)
        out[f"{workload}@{instances}"] = rep
        print(f"  {workload} @ {instances} at {rate:.2f} req/s: " + ", ".join(
            f"{k.removeprefix('combined_')} {v:.3g}" for k, v in rep.items() if k.startswith("combined_")))
    return out


def plot(rates: dict, out_dir: Path) -> Path | None:
    from figures import pyplot

    plt = pyplot()
    if plt is None:
        return None
    cells = list(rates.items())
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 4.2), squeeze=False, sharey=True)
    for ax, ((workload, instances), cell) in zip(axes[0], cells):
        best = max(np.nanmean(cell[p]) for p in POOL if p in cell) or 1.0
        names = ["combined", *[p for p in POOL if p in cell]]
        vals = [np.nanmean(cell[p]) / best for p in names]
        ax.bar(range(len(names)), vals, color=["tab:red"] + ["tab:blue"] * (len(names) - 1))
        ax.set_xticks(range(len(names)), names, rotation=70, fontsize=7)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(f"{workload} @ {instances}", fontsize=9)
    axes[0][0].set_ylabel("max sustainable rate / best single policy")
    fig.tight_layout()
    path = out_dir / "combined.png"
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scales", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="index of the first repeat (trace window / seed): later indices are held out from tuning")
    ap.add_argument("--pool", nargs="+", default=list(POOL), choices=list(POOL),
                    help="the single policies to compare against (least-loaded always runs: it sets the bracket)")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--ablation-scales", type=int, nargs="+", default=[8],
                    help="instance counts at which the ablations run (default: 8)")
    ap.add_argument("--bisections", type=int, default=6, help="halvings of the rate bracket (6: about 2%%)")
    ap.add_argument("--center", type=float, default=None,
                    help="the rate bracket's centre, req/s (default: least-loaded's knee, measured first)")
    ap.add_argument("--widenings", type=int, default=3,
                    help="doublings of the bracket's top (least-loaded's knee x 2) before a knee counts as capped")
    ap.add_argument("--large-fraction", type=float, default=0.4,
                    help="share of the requests per instance in runs above 8 instances (the sweeps' cost)")
    ap.add_argument("--trace", type=Path, help="run on this trace instead (any format `baton list formats` "
                    "names; its SLO: --trace-slo)")
    ap.add_argument("--trace-slo", type=float, nargs=2, default=[3.0, 0.1], metavar=("TTFT_S", "TPOT_S"))
    ap.add_argument("--out", type=Path, default=Path("combined-results"))
    ap.add_argument("--record", metavar="NAME", help="also write the figures to results/NAME.json for the docs to quote")
    args = ap.parse_args()
    LARGE_FRACTION[0], PARTS[0] = args.large_fraction, args.first_repeat + args.repeats
    if args.trace is not None:  # anyone's own trace, as one more workload
        if not args.trace.is_file():
            print(f"combined.py: --trace {args.trace}: no such file", file=sys.stderr)
            return 2
        WORKLOADS["trace"] = (150, SLO(ttft_s=args.trace_slo[0], tpot_s=args.trace_slo[1]), 1.0)
        TRACE_FILES["trace"] = str(args.trace.resolve())
        args.workloads = ["trace"]
    args.workloads = [w for w in args.workloads
                      if w not in TRACE_FILES or (TRACES / TRACE_FILES[w]).is_file()]
    small = [f"{w}: {trace_part(w)} requests per repeat, {window_requests(w, n)} needed at {n} instances"
             for w in args.workloads if w in TRACE_FILES for n in args.scales
             if trace_part(w) < window_requests(w, n)]
    if small:  # each repeat runs on its own part of a trace: parts too small to hold a first window
        print(f"combined.py: too few requests for {PARTS[0]} repeat parts: {'; '.join(small)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rates = run_all(args)
    print("\ncomponent activity in combined's run at least-loaded's knee (repeat 0)")
    acts = activity(args, rates)
    verdicts = {f"{w}@{n}": report(w, n, cell) for (w, n), cell in rates.items()}
    above = sum(v["verdict"].startswith("above") for v in verdicts.values())  # caveated ones too
    caveated = sum(v["verdict"].startswith("above (") for v in verdicts.values())
    below = [k for k, v in verdicts.items() if v["verdict"].startswith("BELOW")]
    print(f"\ncombined significantly above the best single policy on {above} of {len(verdicts)} "
          f"(workload, scale) cells ({caveated} of them with a caveat above); significantly below on "
          f"{below or 'none'} ({time.perf_counter() - t0:.0f} s)")
    png = plot(rates, args.out)
    figures = {"cells": verdicts, "above": above, "below": below, "capped": CAPPED, "unsteady": UNSTEADY,
               "dropped": DROPPED,
               "rates": {f"{w}@{n}": cell for (w, n), cell in rates.items()}, "activity": acts,
               "plot": str(png) if png else None}
    (args.out / "results.json").write_text(json.dumps(figures, indent=1))
    if args.record:
        from baton.report.results import record
        record(args.record, json.loads(json.dumps(figures, default=str)), time.perf_counter() - t0,
               "python benchmarks/combined.py " + " ".join(sys.argv[1:]))
    print(json.dumps({"above": above, "below": below, "cells": len(verdicts),
                      **{f"{k}_combined_minus_best": v["combined_minus_best"] for k, v in verdicts.items()}}))


if __name__ == "__main__":
    sys.exit(main())
