"""Fill the result markers of the README and the docs from results/*.json (see
src/baton/report/results.py). Run it after recording a result (`--record`); the test suite
fails while a page's marker says something its result file does not.

    python scripts/render_results.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from baton.core.errors import BatonError
from baton.report.result_markers import pages, render

ROOT = Path(__file__).resolve().parents[1]


if __name__ == "__main__":
    changed = 0
    for page in pages():
        text = page.read_text()
        try:
            new = render(text, ROOT / "results")
        except BatonError as err:
            sys.exit(f"{page.relative_to(ROOT)}: {err}")
        if new != text:
            page.write_text(new)
            changed += 1
            print(f"rendered {page.relative_to(ROOT)}")
    print(f"{changed} page(s) changed")
