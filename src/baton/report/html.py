"""A self-contained HTML report: figures embedded as PNG data, also written as files."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.report.table import headers, table_rows

DPI = 110

# Marks the page once every figure has decoded, so a headless browser test can check it.
_CHECK = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.querySelectorAll('img.figure')];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute('data-figures-loaded', ok + '/' + imgs.length);
});
</script>"""

_STYLE = """<style>
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f2f2f2} tr:first-child td{font-weight:600}
figure{margin:2em 0} img.figure{max-width:100%} figcaption{font-weight:600;margin-bottom:.5em}
.meta{color:#555}
</style>"""


@dataclass(slots=True)
class Figure:
    """One matplotlib figure with its file stem and caption."""

    name: str
    caption: str
    figure: Any


@dataclass(slots=True)
class Report:
    """A titled page: a summary table (policy -> metrics), figures, and metadata lines."""

    title: str
    summaries: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    meta: list[str] = field(default_factory=list)
    extra_tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return buf.getvalue()


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def write_report(out_dir: str | Path, report: Report, stem: str = "report") -> Path:
    """Write ``stem``.html and one PNG per figure into ``out_dir``; returns the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"<h1>{html.escape(report.title)}</h1>"]
    parts += [f"<p class='meta'>{html.escape(line)}</p>" for line in report.meta]
    if report.summaries:
        rows = [[name, *cells] for name, cells in table_rows(report.summaries)]
        parts.append("<h2>Summary</h2><p class='meta'>Changes in parentheses are against the first "
                     "row.</p>" + _table(headers(), rows))
    for caption, head, rows in report.extra_tables:
        parts.append(f"<h2>{html.escape(caption)}</h2>" + _table(head, rows))
    for fig in report.figures:
        data = _png(fig.figure)
        (out / f"{fig.name}.png").write_bytes(data)
        src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        parts.append(f"<figure><figcaption>{html.escape(fig.caption)}</figcaption>"
                     f"<img class='figure' alt='{html.escape(fig.caption)}' src='{src}'></figure>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}"
            f"</title>{_STYLE}</head><body>{''.join(parts)}{_CHECK}</body></html>")
    path = out / f"{stem}.html"
    path.write_text(page)
    return path
