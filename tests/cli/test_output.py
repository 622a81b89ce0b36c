"""Terminal tables that do not break: first hour, item 7."""

import pytest
from rich.console import Console

from baton.cli.claims_text import ClaimLine, claim_lines
from baton.cli.output import rows_table, summary_table
from baton.report.table import change_text

BASE = {"finished": 300, "rejected": 0, "p95_ttft_s": 0.012, "p99_tpot_s": 0.02, "goodput_rps": 4.1,
        "slo_attainment": 0.99, "preemptions": 0, "migrations": 0}
OVERLOADED = dict(BASE, p95_ttft_s=2.013, p99_tpot_s=0.3, goodput_rps=0.2, slo_attainment=0.1, rejected=12,
                  preemptions=1234)


def _render(table, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text().splitlines()


@pytest.mark.parametrize("pct, text", [(5.4, "+5%"), (-95.2, "-95%"), (99.0, "+99%"), (150.0, "2.5x"),
                                       (1400.0, "15x"), (16675.0, "168x"), (167400.0, "1,675x")])
def test_large_changes_are_ratios(pct, text):
    assert change_text(pct) == text


@pytest.mark.parametrize("width", [80, 100, 140])
def test_a_table_against_a_tiny_first_row_keeps_every_name_whole_and_no_cell_wraps(width):
    """+16675% against a first row wrapped every row at 80 and 100 columns and cut names."""
    results = {"least-loaded": BASE, "cache-aware-prefix-precise": OVERLOADED,
               "combined": dict(OVERLOADED, p95_ttft_s=20.1), "sibyl": BASE}
    lines = _render(summary_table(results, "t", width=width), width)
    assert all(len(line) <= width for line in lines)
    for name in results:
        (row,) = [line for line in lines if f" {name} " in line]
        assert "…" not in row
    text = "\n".join(lines)
    assert "168x" in text and "16675" not in text and "1,675x" in text
    values = [line for line in lines if " cache-aware-prefix-precise " in line][0]
    assert "2013.0" in values and "1234" in values  # values on the policy's own line


def test_changes_stay_beside_their_values_when_they_fit():
    results = {"least-loaded": BASE, "kairos": dict(BASE, p95_ttft_s=0.015)}
    text = "\n".join(_render(summary_table(results, "t", width=100), 100))
    assert "15.0 (+25%)" in text


@pytest.mark.parametrize("width", [80, 100])
def test_reproduce_rows_keep_numbers_on_one_line_and_prose_under_them(width):
    claims = [ClaimLine("arrow/ablation-conv-vs-minimal-load (matched)", "-34.3%", "+217.9% [+67.9, +501.8]",
                        "not reproduced", "Arrow Fig. 12, conversation; goodput: arrow vs minimal-load; matched: "
                        "rate_rps = 3.5; minimal-load goodput 2.1 vs the paper's 2.4; 10 repeats after 3"),
              ClaimLine("sibyl/fig6", "-36.3%", "+92.6% [-0.9, +274.2]", "inconclusive", "SIBYL Fig. 6")]
    lines = claim_lines(claims, width)
    assert all(len(text) <= width for text, _ in lines)
    head, *rest = [text for text, described in lines if not described and "]" in text]
    assert lines[0][0].startswith("figure") and len(rest) == 2
    columns = {text.index(word) for text, word in zip([head, *rest], ["verdict", "not reproduced", "inconclusive"])}
    assert len(columns) == 1  # verdicts left-aligned in one column, on the numbers' own line
    assert [t for t, described in lines if described][0].startswith("    Arrow Fig. 12")


def test_rows_table_left_aligns_prose_and_right_aligns_numbers():
    table = rows_table("t", ["policy", "max rate", "note"], [["a", "3.5", "a long sentence"], ["b", ">= 4", "x"]])
    assert [c.justify for c in table.columns] == ["left", "right", "left"]
