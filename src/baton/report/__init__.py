"""Reports: PNG figures (matplotlib) and a self-contained HTML page.

Names are imported on first use: matplotlib costs most of a second at import, and the
CLI reaches this package for its tables on every call."""

from importlib import import_module
from typing import Any

_WHERE = {"Figure": "html", "Report": "html", "write_report": "html",
          "compare_figures": "plots", "sweep_figures": "plots", "workload_figure": "plots"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'baton.report' has no attribute {name!r}")
    return getattr(import_module(f"baton.report.{_WHERE[name]}"), name)
