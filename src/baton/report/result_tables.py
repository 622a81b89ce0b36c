"""Markdown tables built from result files (``<!--rt NAME:TABLE-->`` markers): one
renderer per kind of result, registered by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.report.results import fmt
from baton.experiments.repeats import includes_zero
from baton.experiments.steady import BELOW
from baton.report.table import change_pct, change_text, headers, table_rows


def _md(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def claims_table(data: dict[str, Any]) -> str:
    """``baton reproduce --record``: one row per claim (paper's change, Baton's with its
    interval, the verdict with its repeats)."""
    rows = []
    for c in data["figures"]["claims"]:
        baton = "-" if c["baton"] is None else fmt(c["baton"], "pct")
        if c["baton"] is not None and None not in c["ci95"]:
            baton += " " + fmt(c["ci95"], "ci")
        rows.append([c["name"], c["figure"].replace("|", "/"), fmt(c["claim"], "pct"), baton, c["verdict_text"]])
    return _md(["claim", "figure", "paper", "Baton [95% CI]", "verdict"], rows)


DEMO_COLUMNS = (("mean / P99 TPOT ms", lambda s: f"{s['mean_tpot_s'] * 1e3:.1f} / {s['p99_tpot_s'] * 1e3:.1f}"),
                ("P95 TTFT ms", lambda s: f"{s['p95_ttft_s'] * 1e3:,.0f}"),
                ("tok/s", lambda s: f"{s['throughput_tok_s']:,.0f}"),
                ("goodput rps", lambda s: f"{s['goodput_rps']:.2f}"),
                ("SLO %", lambda s: f"{s['slo_attainment'] * 100:.1f}"),
                ("OAR tok", lambda s: f"{s['oar_tokens']:.2f}" if s.get("oar_tokens") is not None else "-"))


def demo_table(data: dict[str, Any]) -> str:
    """``baton demo --record``: one row per policy."""
    rows = [[name, *(cell(s) for _, cell in DEMO_COLUMNS)] for name, s in data["figures"].items()]
    return _md(["policy", *(title for title, _ in DEMO_COLUMNS)], rows)


def summary_table(data: dict[str, Any]) -> str:
    """``baton compare --record NAME``: the terminal's summary table (its narrow columns),
    rows after the first with their change against the first (``~``: the paired 95%
    interval over repeats includes 0)."""
    policies = data["figures"]["policies"]
    means = {name: {k: v for k, v in s.items() if k != "paired"} for name, s in policies.items()}
    paired = {name: s.get("paired", {}) for name, s in policies.items()}
    return _md(headers(False, means), [[name, *cells] for name, cells in table_rows(means, paired, wide=False)])


def overhead_table(data: dict[str, Any]) -> str:
    """``benchmarks/gateway_overhead.py --record``: one row per system and stream shape, then
    the paced shape's rows (tokens shown as ``512 paced``) where the run measured it."""
    figures, out = data["figures"], []

    def add(name: str, tokens: str, r: dict, base: dict | None) -> None:
        ratio = f"{r['rps'] / base['rps']:.2f}x" if base else "-"
        out.append([name, tokens, f"{r['rps']:,.0f}", f"{r['tok_s']:,.0f}", f"{r['cpu_ms_per_req']:.3f}",
                    f"{r['cpu_s_per_mtok']:.2f}", ratio])
    router = figures["rows"].get("vllm-router")
    for name, shapes in figures["rows"].items():
        for tokens, r in shapes.items():
            add(name, tokens, r, router[tokens] if router else None)
    paced = figures.get("paced") or {}
    for name, r in paced.items():
        add(name, "512 paced", r, paced.get("vllm-router"))
    return _md(["system", "tokens", "req/s", "tokens/s", "CPU-ms per request", "CPU-s per million tokens",
                "x vllm-router"], out)


def sustainable_table(data: dict[str, Any]) -> str:
    """``benchmarks/arrow_sustainable.py --record``: each system's highest rate at 90% SLO
    attainment on each trace (``>=`` where the sweep's top rate still passed), and Arrow's
    rate over each other system's."""
    traces = [t for t in ("code", "conv") if t in data["figures"]]
    systems = list(data["figures"][traces[0]]) if traces else []
    systems = [s for s in systems if isinstance(data["figures"][traces[0]][s], dict)]

    def rate(trace: str, system: str) -> str:
        r = data["figures"][trace][system]
        value = r["max_sustainable_rate_rps"]
        return "-" if value is None else (">= " if r["max_rate_status"] == "capped" else "") + f"{value:.1f}"
    rows = [[s, *(rate(t, s) for t in traces)] for s in systems]
    for other in systems[1:]:
        ratios = []
        for t in traces:
            a, b = (data["figures"][t][k]["max_sustainable_rate_rps"] for k in (systems[0], other))
            ratios.append(f"{a / b:.2f}x" if a and b else "-")
        rows.append([f"{systems[0]} / {other}", *ratios])
    return _md(["system (req/s at 90% attainment)", *(f"Azure {t}" for t in traces)], rows)


CACHE_POLICIES = ("round-robin", "least-loaded", "prefix-precise", "prefix-approx", "kv-cost", "cache-aware")


def _repeats(values: list, statuses: list | None = None) -> str:
    """The mean of the measured repeats, then each (``< r``: it missed the target already
    at the lowest rate swept, ``r``, where the benchmark records statuses)."""
    below = [s == BELOW for s in statuses] if statuses else [False] * len(values)
    measured = [v for v, b in zip(values, below) if v is not None and not b]
    shown = ", ".join("no steady window" if v is None else ("< " if b else "") + f"{v:.2f}"
                      for v, b in zip(values, below))
    if not measured:
        return f"- ({shown})"
    return f"{sum(measured) / len(measured):.2f} ({shown})"


def cache_rates_table(data: dict[str, Any]) -> str:
    """``benchmarks/cache_aware.py --record``: each policy's max sustainable rate on the
    sessions workload, colocated and PD, the mean over the repeats that measured one, then
    every repeat (a knee whose rate could not hold a steady window of the fixed requests
    measures nothing)."""
    f = data["figures"]
    rows = [[name, *(_repeats(f.get(f"sessions_{col}_{name.replace('-', '_')}_max_rate_per_repeat", []))
                     for col in ("colocated", "pd"))] for name in CACHE_POLICIES]
    return _md(["policy", "8 colocated (req/s: mean (repeats))", "2P6D"], rows)


def _cache_rows(f: dict[str, Any], layouts: tuple[str, str], digits: int, rates: bool) -> list[list[str]]:
    """Per policy, for each of two layouts (key prefixes): hit rate, P50 / P95 TTFT (s), the
    first layout's load CV, and (``rates``) the max sustainable rate over the repeats."""
    rows = []
    for name in CACHE_POLICIES:
        cells = []
        for col in layouts:
            k = f"{col}_{name.replace('-', '_')}_"
            cells += [f"{f[k + 'prefix_cache_hit_rate']:.3f}",
                      f"{f[k + 'p50_ttft_s']:.{digits}f} / {f[k + 'p95_ttft_s']:.{digits}f}"]
            if col == layouts[0]:
                cells.append(f"{f[k + 'load_cv']:.2f}")
            if rates:
                cells.append(_repeats(f.get(k + "max_rate_per_repeat", []), f.get(k + "max_rate_status_per_repeat")))
        rows.append([name, *cells])
    return rows


def cache_fixed_table(data: dict[str, Any]) -> str:
    """``benchmarks/cache_aware.py --record``: at the fixed rate below every knee, each
    policy's prefix-cache hit rate, P50 / P95 TTFT (s) and load CV, colocated then PD."""
    rows = _cache_rows(data["figures"], ("sessions_colocated", "sessions_pd"), 3, rates=False)
    return _md(["policy", "hit rate (8 colocated)", "P50 / P95 TTFT (s)", "load CV", "hit rate (2P6D)",
                "P50 / P95 TTFT (s)"], rows)


def cache_mooncake_table(data: dict[str, Any]) -> str:
    """``benchmarks/cache_aware.py --record``: the Mooncake windows at the trace's own
    arrival times (hit rate, P50 / P95 TTFT, load CV) and each policy's max sustainable
    rate with the arrivals rescaled, 16 colocated instances and 4P12D."""
    rows = _cache_rows(data["figures"], ("mooncake", "mooncake_pd"), 2, rates=True)
    return _md(["policy", "hit rate (16 colocated)", "P50 / P95 TTFT (s)", "load CV", "max rate (req/s: mean (windows))",
                "hit rate (4P12D)", "P50 / P95 TTFT (s)", "max rate"], rows)


def decisions_table(data: dict[str, Any]) -> str:
    """``benchmarks/cache_aware.py --skip-mooncake --skip-sessions --record``: each prefix
    policy's decision cost (median / p99, us) at 64 and 1,024 instances."""
    f = data["figures"]
    sizes = sorted({int(k.split("_")[-3]) for k in f if k.startswith("decision_") and k.endswith("_median_us")})
    def cell(name: str, n: int) -> str:
        k = f"decision_{name.replace('-', '_')}_{n}_"
        return f"{f[k + 'median_us']:.1f} / {f[k + 'p99_us']:.0f}"
    rows = [[f"`{name}`", *(cell(name, n) for n in sizes)] for name in CACHE_POLICIES[2:]]
    return _md(["policy", *(f"{n:,} instances: median / p99 (us)" for n in sizes)], rows)


CASCADE_POLICIES = ("colocated-rr", "cascade", "cascade-guarded")


def cascade_rates_table(data: dict[str, Any]) -> str:
    """``benchmarks/cascade_regime.py --record``: each policy's max sustainable rate on the
    ShareGPT-like workload, the mean and each repeat (``< r``: below the lowest rate swept)."""
    f = data["figures"]
    rows = [[f"`{name}`", _repeats(f[f"sharegpt_{name.replace('-', '_')}_max_rate_per_repeat"],
                                   f.get(f"sharegpt_{name.replace('-', '_')}_max_rate_status"))]
            for name in CASCADE_POLICIES]
    return _md(["policy", "ShareGPT-like, cap 256 (req/s: mean (repeats))"], rows)


def cascade_throughput_table(data: dict[str, Any]) -> str:
    """``benchmarks/cascade_regime.py --record``: completed requests a second under heavy
    load per regime and policy (the paper's Figure 10 measure; the SLO attainment in
    brackets where recorded), and the guarded planner over round-robin."""
    f, rows = data["figures"], []

    def cell(key: str, policy: str) -> str:
        k = key + "_" + policy.replace("-", "_")
        att = f.get(k + "_slo_attainment")
        return f"{f[k + '_throughput_rps']:.1f}" + ("" if att is None else f" ({att:.2f})")
    for key, label in (("heavy_256", "ShareGPT-like, `max_num_seqs` 256"), ("heavy_1024", "the same, `max_num_seqs` 1,024"),
                       ("sessions", "long multi-turn sessions")):
        cells = [cell(key, p) for p in CASCADE_POLICIES]
        rows.append([label, *cells, f"{f[f'{key}_cascade_guarded_throughput_over_rr']:.2f}x"])
    return _md(["regime (req/s (attainment))", *(f"`{p}`" for p in CASCADE_POLICIES), "guarded / rr"], rows)


def sweep_table(data: dict[str, Any]) -> str:
    """``baton sweep --record NAME``: each policy's highest rate at the target attainment
    (``>=``: the top rate still passed; ``-``: none measured), then at each rate its
    attainment and mean TTFT (``*``: that point had no steady window)."""
    rates = data["figures"]["rates_rps"]
    rows = []
    for name, p in data["figures"]["policies"].items():
        best = p["max_sustainable_rate_rps"]
        cells = ["-" if best is None else (">= " if p["max_rate_status"] == "capped" else "") + f"{best:,.0f}"]
        for pt in p["points"]:
            ttft = pt.get("mean_ttft_s")
            cells.append(f"{pt['slo_attainment'] * 100:.0f}% / " + ("-" if ttft is None else f"{ttft * 1e3:,.1f}")
                         + ("" if pt.get("steady", 1.0) else " *"))
        rows.append([name, *cells])
    return _md(["policy", "max rate (req/s)", *(f"{r:g} req/s: attainment / mean TTFT ms" for r in rates)], rows)


def migration_table(data: dict[str, Any]) -> str:
    """``baton compare --record NAME`` with migrating policies: P99 TPOT (with its paired
    change against the first row), mean TPOT, preemptions, migrations and the KV they moved."""
    policies = data["figures"]["policies"]
    first = next(iter(policies.values()))["p99_tpot_s"]
    rows = []
    for i, (name, s) in enumerate(policies.items()):
        p99, pct = f"{s['p99_tpot_s'] * 1e3:.1f}", change_pct(s["p99_tpot_s"], first)
        if i and pct is not None:
            p99 += f" ({'~' if includes_zero(s.get('paired', {}).get('p99_tpot_s')) else ''}{change_text(pct)})"
        rows.append([name, p99, f"{s['mean_tpot_s'] * 1e3:.1f}", f"{s['preemptions']:,.1f}".removesuffix(".0"),
                     f"{s['migrations']:,.0f}", f"{(s.get('migration_bytes') or 0) / 1e9:,.0f}"])
    return _md(["policy", "P99 TPOT ms (change)", "mean TPOT ms", "preemptions", "migrations", "moved GB"], rows)


def decode_bound_table(data: dict[str, Any]) -> str:
    """``benchmarks/arrow_decode_bound.py --record``: per rate and system, SLO attainment,
    role changes, the share of handoffs that waited for decode blocks (median wait),
    median TTFT and whether the run had a steady window."""
    rows = []
    for rate, systems in data["figures"].items():
        if not isinstance(systems, dict):
            continue
        for name, r in systems.items():
            wait = f"{r['waited_for_blocks'] * 100:.1f}%" + (f" ({r['p50_block_wait_s']:.1f} s)"
                                                              if r["waited_for_blocks"] else "")
            rows.append([rate, name, f"{r['slo_attainment']:.3f}", str(r["role_changes"]), wait,
                         f"{r['p50_ttft_s']:.2f}", "yes" if r["steady"] else "no"])
    return _md(["rate (req/s)", "system", "attainment", "role changes", "handoffs that waited (median wait)",
                "P50 TTFT s", "steady"], rows)


def combined_table(data: dict[str, Any]) -> str:
    """``benchmarks/combined.py --record NAME``: per (workload, scale) cell, the best single
    policy's and combined's mean max sustainable rate, their paired difference with its
    95% interval, the verdict, and the passes that ran short of a steady window."""
    f, rows = data["figures"], []
    for cell, v in f["cells"].items():
        rates = f["rates"][cell]
        mean = lambda p: sum(rates[p]) / len(rates[p])  # noqa: E731
        lo, hi = v["ci95"]
        short = ", ".join(f"{p} {n}" for p, n in f.get("unsteady", {}).get(cell, {}).items()) or "-"
        rows.append([cell.replace("@", " @ "), f"{v['best_single']} {mean(v['best_single']):.2f}",
                     f"{mean('combined'):.2f}", f"{v['combined_minus_best']:+.2f} [{lo:+.2f}, {hi:+.2f}]",
                     v["verdict"].split(" (")[0], short])
    return _md(["workload @ instances", "best single (req/s)", "combined", "combined - best, 95% interval",
                "verdict", "passes short of a steady window"], rows)


# combined.py's ablations (its ABLATIONS names) as the component each one turns off
_ABLATED = {"combined-no-prefix": "prefix-aware placement", "combined-no-deflect": "deflection",
            "combined-no-flips": "flips", "combined-token-binding": "iteration-time decode binding (token load instead)",
            "combined-no-migrate": "overflow-triggered migration"}


def combined_ablations_table(data: dict[str, Any]) -> str:
    """``benchmarks/combined.py --record NAME`` with its ablations: per component, combined
    minus combined without it (paired over the repeats, req/s, with its 95% interval) in
    each (workload, scale) cell that ran the ablations."""
    cells = {c: v for c, v in data["figures"]["cells"].items() if any(k.startswith("minus_") for k in v)}
    rows = []
    for name, label in _ABLATED.items():
        row = [label]
        for v in cells.values():
            m, lo, hi = v.get(f"minus_{name}") or (None, None, None)
            row.append("-" if m is None else "0.00 (identical rates)" if m == lo == hi == 0
                       else f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        rows.append(row)
    return _md(["component off (combined minus the ablation, paired, req/s)",
                *(c.replace("@", " @ ") for c in cells)], rows)


def vidur_table(data: dict[str, Any]) -> str:
    """``benchmarks/fidelity.py --record NAME``: per Vidur case, its load, Baton's MAPE
    against Vidur per request (TTFT, TPOT, e2e), the p50 / p90 / p99 ratios and the
    whole-process and in-process speed-ups."""
    rows = []
    for m in data["figures"]["vidur_cases"]:
        ratios = lambda k: " / ".join(f"{m[f'{k}_p{q}_ratio']:.2f}" for q in (50, 90, 99))  # noqa: E731
        rows.append([f"`{m['case']}`", "light" if not m.get("load") else f"{m['load']:.2f}",
                     f"{m['ttft_mape'] * 100:.1f}%", ratios("ttft"), f"{m['tpot_mape'] * 100:.1f}%",
                     f"{m['e2e_mape'] * 100:.1f}%", ratios("e2e"),
                     f"{m['speedup_whole']:.1f}x / {m['speedup_in_process']:.1f}x"])
    return _md(["case", "load", "TTFT MAPE", "TTFT p50 / p90 / p99", "TPOT MAPE", "e2e MAPE",
                "e2e p50 / p90 / p99", "speed-up whole / in-process"], rows)


def real_fidelity_table(data: dict[str, Any]) -> str:
    """``benchmarks/fidelity.py --real ... --record NAME``: Baton against real vLLM per case
    (one instance at each load, the sessions case at load, two instances, 1P1D)."""
    loaded = data["figures"]["real"]["loaded"]
    fleet = loaded.get("fleet") or {}
    cases = [(f"one instance, {key}% load", m) for key, m in (loaded.get("cases") or {}).items()]
    if loaded.get("prefix"):
        cases.append(("one instance, sessions with prefix caching", loaded["prefix"]))
    names = {"colocated": "two instances, least-loaded", "colocated-rr": "two instances, round-robin",
             "pd": "1 prefill + 1 decode (ExampleConnector)"}
    cases += [(label, fleet[key]) for key, label in names.items() if key in fleet]
    rows = []
    for label, m in cases:
        rate = m.get("rate_rps", fleet.get("rate_rps"))
        target = f" (target {m['target_rps']:.2f})" if m.get("target_rps") is not None else ""
        rows.append([label, f"{rate:.2f}{target}", *(f"{m[f'{k}_mape'] * 100:.1f}%" for k in ("ttft", "tpot", "e2e")),
                     " / ".join(f"{m[f'e2e_p{q}_ratio']:.2f}" for q in (50, 90, 99)), str(m["failed"])])
    return _md(["case", "req/s", "TTFT MAPE", "TPOT MAPE", "e2e MAPE", "e2e p50 / p90 / p99 (Baton / real)",
                "failed"], rows)


def deflection_table(data: dict[str, Any]) -> str:
    """``baton sweep --record NAME`` of prefill-deflecting policies: each policy's highest
    rate at the target, its deflected share at the middle rate, the range of its P95 TBT
    over the rates, and at each rate its P95 TTFT (s) and SLO attainment (``*``: no steady
    window at that point)."""
    f = data["figures"]
    rates, mid = f["rates_rps"], len(f["rates_rps"]) // 2
    rows = []
    for name, p in f["policies"].items():
        best, pts = p["max_sustainable_rate_rps"], p["points"]
        tbt = [pt["p95_tbt_s"] * 1e3 for pt in pts if pt.get("p95_tbt_s") is not None]
        cells = [f"{pt['p95_ttft_s']:.2f} / {pt['slo_attainment'] * 100:.0f}" + ("" if pt.get("steady", 1.0) else " *")
                 for pt in pts]
        rows.append([f"`{name}`", "-" if best is None else (">= " if p["max_rate_status"] == "capped" else "")
                     + f"{best:.1f}", f"{pts[mid].get('deflected_fraction', 0.0) * 100:.0f}%",
                     f"{min(tbt):.0f}-{max(tbt):.0f}" if tbt else "-", *cells])
    target = next(iter(f["policies"].values()))["target_attainment"]
    return _md(["policy", f"max rate at {target * 100:.0f}% (req/s)", f"deflected at {rates[mid]:g} req/s",
                "P95 TBT ms", f"{rates[0]:g} req/s (P95 TTFT s / SLO %)", *(f"{r:g} req/s" for r in rates[1:])], rows)


_PREDICTORS = {"mlp_last": "last-layer hidden state", "survival": "E[L - g \\| L > g], training lengths",
               "mlp_first": "embedding layer", "prompt_only": "ridge: prompt length, g, hashed prompt tokens",
               "mean": "training mean"}


def predictor_mae_table(data: dict[str, Any]) -> str:
    """``benchmarks/length_predictor.py --record``: each predictor's MAE on the test split
    (tokens, best first) with its bootstrap interval, and below / from 512 generated tokens."""
    f = data["figures"]
    rows = []
    for name, mae in sorted(f["mae_tokens"].items(), key=lambda kv: kv[1]):
        lo, hi = f["mae_ci95"][name]
        below, above = f["mae_split_at_512"][name]
        rows.append([f"`{name}` ({_PREDICTORS.get(name, '')})".replace(" ()", ""), f"{mae:.1f}",
                     f"{lo:.1f}-{hi:.1f}", f"{below:.0f}", f"{above:.0f}"])
    return _md([f"predictor (test split, {f['requests']['test']:,} requests)", "MAE, tokens",
                "95% CI (bootstrap over requests)", "g < 512", "g >= 512"], rows)


def predictor_by_generated_table(data: dict[str, Any]) -> str:
    """``benchmarks/length_predictor.py --record``: MAE (mean prediction) by tokens
    generated so far, for the last-layer MLP, the survival table and the mean."""
    buckets = data["figures"]["by_generated"]
    rows = [[f"`{name}`", *(f"{b[f'{name}_mae']:.0f} ({b[f'{name}_mean']:.0f})" for b in buckets)]
            for name in ("mlp_last", "survival", "mean") if f"{name}_mae" in buckets[0]]
    rows.append(["true mean", *(f"{b['true_mean']:.0f}" for b in buckets)])
    rows.append(["samples", *(f"{b['samples']:,}" for b in buckets)])
    return _md(["g", *(b["generated"] for b in buckets)], rows)


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {"migration": migration_table, "decode_bound": decode_bound_table,
                                                      "combined": combined_table, "vidur": vidur_table,
                                                      "combined_ablations": combined_ablations_table,
                                                      "cache_mooncake": cache_mooncake_table,
                                                      "decisions": decisions_table,
                                                      "cascade_rates": cascade_rates_table,
                                                      "cascade_throughput": cascade_throughput_table,
                                                      "cache_rates": cache_rates_table, "sweep": sweep_table,
                                                      "cache_fixed": cache_fixed_table,
                                                      "claims": claims_table, "demo": demo_table,
                                                      "summary": summary_table, "overhead": overhead_table,
                                                      "sustainable": sustainable_table, "real_fidelity": real_fidelity_table,
                                                      "predictor_mae": predictor_mae_table,
                                                      "deflection": deflection_table,
                                                      "predictor_by_generated": predictor_by_generated_table}
