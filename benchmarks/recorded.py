"""The last step of a small benchmark: print its figures as one JSON line and, with
``--record``, write them to ``results/<name>.json`` with the command that made them."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def emit(name: str, figures: dict[str, Any], started_s: float, record: bool) -> None:
    """Print ``figures``; when ``record``, also write them (``started_s``: the run's
    ``time.perf_counter()`` at its start)."""
    print(json.dumps(figures))
    if record:
        from baton.report.results import record as write
        script = sys.argv[0].split("/")[-1]
        write(name, figures, time.perf_counter() - started_s, f"python benchmarks/{script} " + " ".join(sys.argv[1:]))
