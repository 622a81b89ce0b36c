"""The comparison figures: SLO lines, readable log ticks, named duplicates, plain labels."""

import numpy as np

from baton.experiments.run import RunData
from baton.metrics import SLO
from baton.report.plots import latency_cdfs, tbt_percentiles, throughput_bars


def run(name, ttft, tpot, tbt_ms=(16.0, 16.5, 17.0, 17.4), tok_s=123456.0):
    qs = (50.0, 90.0, 99.0, 99.9)
    return RunData(name, {"throughput_tok_s": tok_s, "goodput_rps": 12.3}, np.array(ttft), np.array(tpot),
                   dict(zip(qs, np.array(tbt_ms) / 1e3)), np.zeros(0), np.zeros((0, 1)), ["i0"])


def test_cdfs_draw_the_slos_and_name_identical_curves():
    a = run("least-loaded", [0.1, 0.2, 0.3], [0.01, 0.02])
    b = run("least-kv", [0.1, 0.2, 0.3], [0.01, 0.02])  # exactly the same results
    fig = latency_cdfs([a, b], SLO(ttft_s=1.0, tpot_s=0.05))
    ttft_ax, tpot_ax = fig.axes
    assert any(line.get_xdata()[0] == 1000.0 for line in ttft_ax.get_lines())  # TTFT SLO at 1,000 ms
    assert any(line.get_xdata()[0] == 50.0 for line in tpot_ax.get_lines())
    labels = [t.get_text() for t in ttft_ax.get_legend().get_texts()]
    assert "least-kv (same as least-loaded)" in labels and "TTFT SLO (1000 ms)" in labels


def test_tbt_log_axis_has_three_labels_on_a_narrow_range():
    fig = tbt_percentiles([run("a", [0.1], [0.01]), run("b", [0.1], [0.01], tbt_ms=(16.2, 16.8, 17.1, 17.9))])
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert len(shown) >= 3, [t.get_text() for t in shown]


def test_bar_labels_have_no_scientific_notation():
    fig = throughput_bars([run("a", [0.1], [0.01], tok_s=1234567.0), run("b", [0.1], [0.01], tok_s=98.7)])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "1,234,567" in texts and "98.7" in texts
    assert not any("e+" in t for t in texts)


def test_log_axes_label_without_scientific_notation():
    fig = latency_cdfs([run("a", [0.05, 0.5, 3.0], [0.01, 0.02])], SLO())
    fig.canvas.draw()
    labels = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    assert labels and not any("e+" in t for t in labels), labels


def test_role_counts_follow_the_log_and_keep_the_last_state_of_a_moment():
    from baton.report.plots import role_counts
    log = [(0.0, 0, "prefill"), (0.0, 1, "decode"), (0.0, 2, "decode"), (5.0, 1, "prefill"), (9.0, 1, "decode")]
    t, counts = role_counts(log, 12.0)
    assert list(t) == [0.0, 5.0, 9.0, 12.0]
    assert list(counts["prefill"]) == [1, 2, 1, 1] and list(counts["decode"]) == [2, 1, 2, 2]


def test_pool_figure_appears_only_for_runs_that_changed_roles():
    from baton.experiments.run import RunData
    from baton.report.plots import compare_figures
    base = dict(summary={"throughput_tok_s": 1.0, "goodput_rps": 1.0}, ttft_s=np.array([0.1, 0.2]),
                tpot_s=np.array([0.01, 0.02]), tbt_percentiles_s={50: 0.01, 99: 0.02},
                load_times_s=np.array([0.0, 1.0]), load_tokens=np.ones((2, 1)), instance_labels=["instance 0"],
                arrival_s=np.array([0.0, 1.0, 2.0]), prompt_tokens=np.array([10, 20, 30]))
    still = RunData("static", role_log=[(0.0, 0, "prefill"), (0.0, 1, "decode")], **base)
    moved = RunData("arrow", role_log=[(0.0, 0, "prefill"), (0.0, 1, "decode"), (1.5, 1, "prefill")], **base)
    names = [f.name for f in compare_figures([still, moved])]
    assert names[-1] == "pools_1" and not any(n == "pools_0" for n in names)
    pools = compare_figures([still, moved])[-1].figure
    counts_ax = next(ax for ax in pools.axes if ax.get_ylabel() == "instances")
    pools.canvas.draw()
    assert all(float(t).is_integer() for t in counts_ax.get_yticks())  # instance counts are whole


def test_twelve_policies_get_twelve_colours_in_every_figure():
    from matplotlib.colors import to_hex
    runs = [run(f"p{i}", [0.1, 0.2 + i / 100], [0.01, 0.02 + i / 1000]) for i in range(12)]
    cdf_lines = [ln for ln in latency_cdfs(runs).axes[0].get_lines() if ln.get_label().startswith("p")]
    assert len({to_hex(ln.get_color()) for ln in cdf_lines}) == 12
    bars = throughput_bars(runs).axes[0].patches
    assert len({to_hex(b.get_facecolor()) for b in bars}) == 12


def test_the_claims_figure_puts_each_claim_on_a_log_axis_against_the_paper():
    from baton.experiments.config import Experiment
    from baton.experiments.reproduce import Claim, Outcome
    from baton.report.plots import claims_figure

    def outcome(claim, ratios):
        return Outcome(Claim("c", "fig", "", Experiment(), "a", "b", "m", claim), 1.0, 1.0, 0, ratios)

    fig = claims_figure([outcome(-0.5, [-0.7, -0.6, -0.8]), outcome(1.0, [0.1, 0.3, 0.2]), outcome(0.2, [0.4])])
    ax = fig.figure.axes[0]
    assert ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in ax.get_lines()}
    paper = lines["paper"].get_ydata()
    assert list(paper) == [0.5, 2.0, 1.2]  # ratios: 1 + the claimed change
    assert "Baton (no interval)" in lines  # one repeat: a point without an interval
    import matplotlib.pyplot as plt
    plt.close(fig.figure)
