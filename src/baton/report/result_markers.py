"""Fill the result markers of a Markdown page from ``results/*.json`` and find figures
written by hand where only recorded ones may stand (``report.results`` describes both)."""

from __future__ import annotations

import re
from pathlib import Path

from baton.core.errors import ConfigError
from baton.report.result_tables import TABLES
from baton.report.results import ROOT, fmt, load, lookup

VALUE = re.compile(r"<!--r ([^:>\s]+):([^:>\s]+)(?::([^>\s]*))?-->(.*?)<!--/r-->", re.S)
TABLE = re.compile(r"<!--rt ([^:>\s]+):([^:>\s]+)-->\n(.*?)<!--/rt-->", re.S)
MEASURED = re.compile(r"<!--measured-->(.*?)<!--/measured-->", re.S)
# what a measured figure looks like: a decimal, a percentage, a ratio, thousands separators
# (integers such as "3 repeats" or "Fig. 6" are descriptions, not figures)
FIGURE = re.compile(r"(?<![\w.])[-+−]?(?:\d[\d,]*(?:\.\d+)?x(?![\w])|\d[\d,]*(?:\.\d+)?%|\d[\d,]*\.\d+(?!-\w)"
                    r"|\d{1,3}(?:,\d{3})+)")  # (a version, as in Llama-3.1-8B, is no figure)
# code spans (wrapping lines, never a paragraph), link targets and autolinks: inputs, addresses
_CODE = re.compile(r"`(?:[^`\n]|\n(?!\s*\n))*`|\]\([^)]*\)|<https?://[^>\s]+>")
_FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def render(text: str, folder: Path | None = None) -> str:
    """``text`` with every marker's content replaced by what its result file says."""
    cache: dict[str, dict] = {}

    def data(name: str) -> dict:
        if name not in cache:
            cache[name] = load(name, folder)
        return cache[name]

    def table(m: re.Match) -> str:
        name, kind = m.group(1), m.group(2)
        if kind not in TABLES:
            raise ConfigError(f"<!--rt {name}:{kind}-->: no table renderer {kind!r} (known: {', '.join(TABLES)})")
        return f"<!--rt {name}:{kind}-->\n{TABLES[kind](data(name))}\n<!--/rt-->"

    def value(m: re.Match) -> str:
        name, path, spec = m.group(1), m.group(2), m.group(3) or ""
        return f"<!--r {name}:{path}{':' + spec if spec else ''}-->{fmt(lookup(data(name), path), spec)}<!--/r-->"

    return VALUE.sub(value, TABLE.sub(table, text))


def hand_written(text: str, whole: bool = False) -> list[str]:
    """Figures that no marker fills (outside code spans, link targets and, with ``whole``,
    fenced code blocks): inside ``<!--measured-->`` regions, or anywhere on the page with
    ``whole``; each one a published number that no result file holds."""
    regions = [_FENCED.sub(" ", text)] if whole else MEASURED.findall(text)
    found = []
    for region in regions:
        bare = _CODE.sub(" ", VALUE.sub(" ", TABLE.sub(" ", region)))
        found += [m.group(0) for m in FIGURE.finditer(bare)]
    return found


def names(text: str) -> set[str]:
    """The result files a page quotes."""
    return {m.group(1) for m in VALUE.finditer(text)} | {m.group(1) for m in TABLE.finditer(text)}


def results_pages() -> list[Path]:
    """The pages that quote only recorded figures, every one through a marker: the README
    and every docs page but the reference (generated from the code: its numbers are the
    settings' defaults and bounds) and the earlier runs in ``docs/results/archive/``."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md")
                                        if p.parent not in (docs / "reference", docs / "results" / "archive"))]


def archive_pages() -> list[Path]:
    """Earlier runs as written then, each page saying so in its first paragraph."""
    return sorted((ROOT / "docs" / "results" / "archive").glob("*.md"))


def pages() -> list[Path]:
    """Every page that may quote a result: the README and the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
