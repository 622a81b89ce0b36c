"""Every figure a page quotes through a result marker is what its result file holds, and a
measured region quotes no figure by hand (first hour, item 1: figures that cannot go stale)."""

import pytest

from baton.report.result_markers import hand_written, names, pages, render
from baton.report.results import ROOT

PAGES = pages()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_a_page_quotes_its_results_as_recorded(page):
    text = page.read_text()
    for name in names(text):
        assert (ROOT / "results" / f"{name}.json").is_file(), f"{page}: quotes results/{name}.json, which is missing"
    assert render(text, ROOT / "results") == text, f"{page}: stale figures: run python scripts/render_results.py"
    assert hand_written(text) == [], f"{page}: figures written by hand in a measured region"


def test_the_measured_pages_are_the_ones_listed():
    """The pages whose figures all come from result files (the rest still quote runs in
    prose; docs/results/index.md says which)."""
    measured = {str(p.relative_to(ROOT)) for p in PAGES if "<!--measured-->" in p.read_text()}
    assert measured >= {"README.md", "docs/results/reproduce.md", "docs/results/demo.md"}
