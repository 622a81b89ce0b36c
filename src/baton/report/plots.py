"""The figures of compare, sweep and workload reports. Every axis has a title, units and a
legend; latencies use log scales because their tails span orders of magnitude."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: reports are written to files, never shown

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure as MplFigure  # noqa: E402

from baton.experiments.run import RunData  # noqa: E402
from baton.experiments.sweep import SweepResult  # noqa: E402
from baton.report.html import Figure  # noqa: E402

from cycler import cycler  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

MAX_LINES = 12  # above this many instances, the load plot shows a min/median/max band
# Twelve distinguishable colours (matplotlib's ten, then black and Kelly's yellow), so a
# comparison of up to 12 policies never gives two of them one colour.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#000000", "#ffe119")


def _subplots(*args, **kwargs):
    """``plt.subplots`` whose axes cycle through ``PALETTE`` (set per figure, not globally)."""
    with plt.rc_context({"axes.prop_cycle": cycler(color=PALETTE)}):
        return plt.subplots(*args, **kwargs)


def plain_log_labels(ax, which: str = "y") -> None:
    """Plain numbers on a log axis; minor ticks labelled only when it spans under 1.5
    decades, and at least three labelled ticks even on a narrow range."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
    fmt = FuncFormatter(lambda v, _: _plain_number(v))
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(fmt if lo > 0 and hi / lo < 30 else NullFormatter())
    if lo > 0 and hi > lo and len([t for t in axis.get_majorticklocs() if lo <= t <= hi]) < 3 \
            and hi / lo < 30:
        ticks = np.geomspace(lo * 1.02, hi / 1.02, 4)
        (ax.set_yticks if which == "y" else ax.set_xticks)(ticks)
        axis.set_minor_formatter(NullFormatter())
        axis.set_major_formatter(fmt)


def _same_as(runs: Sequence[RunData], i: int, attr: str) -> str:
    """`` (same as X)`` when run i's values equal an earlier run's (its curve hides)."""
    mine = getattr(runs[i], attr)
    for other in runs[:i]:
        theirs = getattr(other, attr)
        if mine.shape == theirs.shape and np.array_equal(mine, theirs):
            return f" (same as {other.name})"
    return ""


def _cdf(ax, values: np.ndarray, label: str) -> None:
    if values.size:
        xs = np.sort(values)
        ax.step(xs * 1e3, np.arange(1, xs.size + 1) / xs.size, where="post", label=label)


def latency_cdfs(runs: Sequence[RunData], slo=None) -> MplFigure:
    """TTFT and TPOT CDFs; dashed lines at the SLOs; identical curves say so in the legend."""
    fig, axes = _subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for i, run in enumerate(runs):
        _cdf(axes[0], run.ttft_s, run.name + _same_as(runs, i, "ttft_s"))
        _cdf(axes[1], run.tpot_s, run.name + _same_as(runs, i, "tpot_s"))
    limits = (slo.ttft_s, slo.tpot_s) if slo is not None else (None, None)
    for ax, what, limit in zip(axes, ("TTFT", "TPOT"), limits):
        if limit is not None:
            ax.axvline(limit * 1e3, color="black", ls="--", lw=1, label=f"{what} SLO ({limit * 1e3:g} ms)")
        ax.set(xscale="log", xlabel=f"{what} (ms, log scale)", ylabel="fraction of requests",
               title=f"CDF of {what}", ylim=(0, 1.01))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        plain_log_labels(ax, "x")
    return fig


def tbt_percentiles(runs: Sequence[RunData]) -> MplFigure:
    fig, ax = _subplots(figsize=(8, 4.5), layout="constrained")
    qs = sorted(runs[0].tbt_percentiles_s) if runs else []
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        vals = [run.tbt_percentiles_s[q] * 1e3 for q in qs]
        ax.bar(np.arange(len(qs)) + i * width - 0.4 + width / 2, vals, width, label=run.name)
    ax.set_xticks(np.arange(len(qs)), [f"P{q:g}" for q in qs])
    ax.set(yscale="log", ylabel="time between tokens (ms, log scale)",
           title="Time between tokens (TBT) percentiles, all tokens")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plain_log_labels(ax)
    return fig


def _load_panel(ax, run: RunData) -> None:
    t, m = run.load_times_s, run.load_tokens
    if m.size == 0:
        ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
    elif m.shape[1] <= MAX_LINES:
        for j in range(m.shape[1]):
            ax.plot(t, m[:, j] / 1e3, lw=0.9, label=run.instance_labels[j])
    else:
        ax.fill_between(t, m.min(axis=1) / 1e3, m.max(axis=1) / 1e3, alpha=0.3, label="min-max")
        ax.plot(t, np.median(m, axis=1) / 1e3, lw=1.2, label="median")
    ax.set(title=f"{run.name}", xlabel="time (s)", ylabel="token load (k tokens)")
    ax.grid(True, alpha=0.3)


def instance_load(runs: Sequence[RunData]) -> MplFigure:
    cols = min(len(runs), 3) or 1
    rows = (len(runs) + cols - 1) // cols or 1
    fig, axes = _subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), layout="constrained",
                             sharey=True, squeeze=False)
    for ax, run in zip(axes.flat, runs):
        _load_panel(ax, run)
        if run.instance_labels != runs[0].instance_labels:
            ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 8), fontsize=8)
    fig.suptitle("Token load per decode instance over time (context tokens held)")
    return fig


def throughput_bars(runs: Sequence[RunData]) -> MplFigure:
    fig, axes = _subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    names = [r.name for r in runs]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(runs))]
    for ax, key, label in ((axes[0], "throughput_tok_s", "output tokens/s"),
                           (axes[1], "goodput_rps", "requests/s meeting both SLOs")):
        vals = [r.summary.get(key, float("nan")) for r in runs]
        bars = ax.bar(names, vals, color=colors)
        ax.bar_label(bars, labels=[_plain_number(v) for v in vals], fontsize=8)
        ax.set(ylabel=label, title="Throughput" if key.startswith("throughput") else "Goodput")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return fig


def _plain_number(v: float) -> str:
    """A bar label without scientific notation: thousands separators, or 3 digits."""
    if v != v:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def role_counts(role_log: Sequence[tuple[float, int, str]], end_s: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Step series of how many instances hold each role, from a role log."""
    roles: dict[int, str] = {}
    times, counts = [], {r: [] for r in ("prefill", "decode", "mixed")}
    for t, inst, role in sorted(role_log, key=lambda e: e[0]):
        roles[inst] = role
        if times and times[-1] == t:  # several changes at one moment: keep the last state
            times.pop()
            for r in counts:
                counts[r].pop()
        times.append(t)
        for r in counts:
            counts[r].append(sum(1 for v in roles.values() if v == r))
    times.append(end_s)
    for r in counts:
        counts[r].append(counts[r][-1] if counts[r] else 0)
    return np.array(times), {r: np.array(v) for r, v in counts.items()}


def pool_sizes(run: RunData) -> MplFigure:
    """Instances per role over time, under the arrival rate and prompt tokens per second."""
    end = float(run.arrival_s.max()) if run.arrival_s.size else 1.0
    bin_s = max(1.0, end / 200)
    edges = np.arange(0.0, end + bin_s, bin_s)
    fig, (top, bottom) = _subplots(2, 1, figsize=(11, 6), sharex=True, layout="constrained")
    rate, _ = np.histogram(run.arrival_s, edges)
    tokens, _ = np.histogram(run.arrival_s, edges, weights=run.prompt_tokens)
    top.plot(edges[:-1], rate / bin_s, lw=1, color="C0", label="arrivals (req/s)")
    top.set(ylabel="requests/s", title=f"{run.name}: load and pool sizes")
    twin = top.twinx()
    twin.plot(edges[:-1], tokens / bin_s / 1e3, lw=1, color="C3", label="prompt tokens/s (k)")
    twin.set_ylabel("prompt k tokens/s")
    fig.legend(loc="outside upper right", fontsize=8)
    t, counts = role_counts(run.role_log, end)
    for i, (role, series) in enumerate(counts.items()):
        if series.any():
            bottom.step(t, series, where="post", lw=1.6, color=f"C{i + 1}", ls=("-", "--", ":")[i],
                        label=f"{role} instances")
    bottom.set(xlabel="time (s)", ylabel="instances")
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))  # instance counts are whole
    bottom.legend(fontsize=8)
    bottom.grid(True, alpha=0.3)
    return fig


def compare_figures(runs: Sequence[RunData], slo=None) -> list[Figure]:
    """The four figures of a comparison report, plus pool sizes over time for every run
    that changed instance roles."""
    figures = [Figure("latency_cdf", "TTFT and TPOT distributions", latency_cdfs(runs, slo)),
               Figure("tbt_percentiles", "Time between tokens, P50 to P99.9", tbt_percentiles(runs)),
               Figure("instance_load", "Load balance over time", instance_load(runs)),
               Figure("throughput_goodput", "Throughput and goodput", throughput_bars(runs))]
    for k, run in enumerate(runs):
        if any(t > 0 for t, _, _ in run.role_log):
            figures.append(Figure(f"pools_{k}", f"{run.name}: instances per role over time, with the "
                                  f"arrival rate and prompt tokens per second", pool_sizes(run)))
    return figures


def sweep_figures(sweep: SweepResult) -> list[Figure]:
    """SLO attainment, P99 TPOT and P95 TTFT against request rate, one line per policy."""
    fig, axes = _subplots(1, 3, figsize=(16, 4.5), layout="constrained")
    panels = (("slo_attainment", 100, "SLO attainment (%)", "SLO attainment vs rate", "linear"),
              ("p99_tpot_s", 1e3, "P99 TPOT (ms, log scale)", "P99 TPOT vs rate", "log"),
              ("p95_ttft_s", 1e3, "P95 TTFT (ms, log scale)", "P95 TTFT vs rate", "log"))
    for ax, (key, scale, ylabel, title, yscale) in zip(axes, panels):
        for name in sweep.points:
            ax.plot(sweep.rates_rps, np.array(sweep.series(name, key), dtype=float) * scale,
                    marker="o", label=name)
        ax.set(xlabel="request rate (req/s)", ylabel=ylabel, title=title, yscale=yscale)
        ax.grid(True, which="both", alpha=0.3)
        if yscale == "log":
            plain_log_labels(ax)
    axes[0].axhline(sweep.target_attainment * 100, color="grey", ls="--", lw=1,
                    label=f"{sweep.target_attainment:.0%} target")
    for ax in axes:
        ax.legend(fontsize=8)
    axes[0].set_ylim(0, 102)
    return [Figure("sweep", "Latency and SLO attainment against request rate", fig)]


def workload_figure(prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                    arrival_s: np.ndarray, title: str) -> Figure:
    """Histograms of prompt and output lengths (log bins) and the arrival rate over time."""
    fig, axes = _subplots(1, 3, figsize=(16, 4.2), layout="constrained")
    for ax, vals, what in ((axes[0], prompt_tokens, "prompt"), (axes[1], output_tokens, "output")):
        vals = np.maximum(vals, 1)
        bins = np.logspace(0, np.log10(vals.max() + 1), 50) if vals.size else 10
        ax.hist(vals, bins=bins, color="C0" if what == "prompt" else "C1")
        ax.set(xscale="log", xlabel=f"{what} length (tokens, log scale)", ylabel="requests",
               title=f"{what.capitalize()} lengths")
        ax.grid(True, which="both", alpha=0.3)
    span = float(arrival_s.max() - arrival_s.min()) if arrival_s.size > 1 else 1.0
    bins = max(10, min(200, int(span)))
    counts, edges = np.histogram(arrival_s, bins=bins)
    axes[2].plot(edges[:-1], counts / np.diff(edges), drawstyle="steps-post")
    axes[2].set(xlabel="time (s)", ylabel="arrivals per second", title="Arrival rate over time")
    axes[2].grid(True, alpha=0.3)
    fig.suptitle(title)
    return Figure("workload", title, fig)


def claims_figure(outcomes) -> Figure:
    """Each claim as a point: Baton's ratio (1 + relative change) with its 95% interval
    against the paper's, on a log axis (a halving and a doubling sit equally far from 1)."""
    fig, ax = _subplots(figsize=(max(6.0, 1.2 * len(outcomes) + 2), 4.5), layout="constrained")
    x = np.arange(len(outcomes))
    paper = np.array([1.0 + o.claim.claim for o in outcomes])
    baton = np.array([1.0 + o.baton for o in outcomes])
    lo = np.array([1.0 + o.ci95[0] if not np.isnan(o.ci95[0]) else np.nan for o in outcomes])
    hi = np.array([1.0 + o.ci95[1] if not np.isnan(o.ci95[1]) else np.nan for o in outcomes])
    floor = 1e-3  # a -100% change has no place on a log axis: drawn at the floor
    baton, lo, hi, paper = (np.maximum(v, floor) for v in (baton, lo, hi, paper))
    has = ~np.isnan(lo)
    ax.errorbar(x[has], baton[has], yerr=[baton[has] - lo[has], hi[has] - baton[has]], fmt="o", capsize=4,
                color="C0", label="Baton (95% CI)")
    ax.plot(x[~has], baton[~has], "o", mfc="none", color="C0", label="Baton (no interval)" if (~has).any() else None)
    ax.plot(x, paper, "D", color="C3", label="paper")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    low = min(lo[has].min(initial=1), paper.min(), baton.min()) / 1.25
    high = max(hi[has].max(initial=1), paper.max(), baton.max()) * 1.25
    ticks = [t for t in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2, 4, 10, 20, 100)
             if low <= t <= high]
    # every label in one style, the change in percent: the log axis's own minor labels
    # (6x10^-1 and the like) would appear beside them on a range under a decade
    ax.set_yticks(ticks, [f"{(t - 1) * 100:+.0f}%" for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    names = [o.claim.name + (" (matched)" if getattr(o, "calibration", None) else "") for o in outcomes]
    ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="relative change of the metric (log scale of the ratio)", title="Claimed against reproduced")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return Figure("claims", "The paper's claims and Baton's results", fig)
