"""Every figure a page quotes through a result marker is what its result file holds, and a
measured region quotes no figure by hand (first hour, item 1: figures that cannot go stale)."""

import pytest

from baton.report.result_markers import archive_pages, hand_written, names, pages, render, results_pages
from baton.report.results import ROOT

PAGES = pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_a_page_quotes_its_results_as_recorded(page):
    text = page.read_text()
    for name in names(text):
        assert (ROOT / "results" / f"{name}.json").is_file(), f"{page}: quotes results/{name}.json, which is missing"
    assert render(text, ROOT / "results") == text, f"{page}: stale figures: run python scripts/render_results.py"
    assert hand_written(text) == [], f"{page}: figures written by hand in a measured region"


@pytest.mark.parametrize("page", results_pages(), ids=[str(p.relative_to(ROOT)) for p in results_pages()])
def test_a_page_quotes_no_figure_by_hand_anywhere(page):
    """Not only in its measured regions: every decimal, percentage, ratio or large number on
    the README and the docs (the generated reference aside) comes from a marker, or is an
    input, a target or a paper's figure in a code span."""
    assert hand_written(page.read_text(), whole=True) == [], \
        f"{page}: figures written by hand (record them, quote them with a marker, or move an earlier run to archive/)"


def test_the_whole_page_check_covers_the_docs_but_the_reference_and_the_archive():
    checked = {str(p.relative_to(ROOT)) for p in results_pages()}
    assert {"README.md", "docs/results/fidelity-vidur.md", "docs/concepts/performance-models.md",
            "docs/how-to/reliability.md", "docs/getting-started.md"} <= checked
    assert not any(p.startswith(("docs/reference/", "docs/results/archive/")) for p in checked)


def test_archive_pages_say_they_are_earlier_runs():
    archive = archive_pages()
    assert archive, "docs/results/archive/ holds the earlier runs the results pages no longer quote"
    for page in archive:
        head = page.read_text().split("\n\n")[1]
        assert "not rerun" in head and "as written then" in head, f"{page}: its first paragraph must say so"


def test_whole_page_check_finds_a_figure_outside_the_measured_regions():
    text = "intro 12.5% faster\n<!--measured-->`1.5`x<!--/measured-->\n```\n9.9%\n```\n"
    assert hand_written(text) == []
    assert hand_written(text, whole=True) == ["12.5%"]


def test_the_measured_pages_are_the_ones_listed():
    """The pages whose figures all come from result files (the rest still quote runs in
    prose; docs/results/index.md says which)."""
    measured = {str(p.relative_to(ROOT)) for p in PAGES if "<!--measured-->" in p.read_text()}
    assert measured >= {"README.md", "docs/results/reproduce.md", "docs/results/demo.md"}
