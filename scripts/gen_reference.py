"""Write the documentation's reference pages (docs/reference/*.md) from the code: commands
and flags, YAML keys, policies and their parameters, gateway metrics. Run it after changing
any of them; the test suite fails while a committed page is out of date.

    python scripts/gen_reference.py
"""

from __future__ import annotations

from pathlib import Path

from baton.cli.reference import render

DOCS = Path(__file__).resolve().parents[1] / "docs"

if __name__ == "__main__":
    for path, text in render().items():
        (DOCS / path).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / path).write_text(text)
        print(f"wrote docs/{path} ({text.count(chr(10))} lines)")
