"""Reports: PNG figures (matplotlib) and a self-contained HTML page."""

from baton.report.html import Figure, Report, write_report
from baton.report.plots import compare_figures, sweep_figures, workload_figure

__all__ = ["Figure", "Report", "compare_figures", "sweep_figures", "workload_figure", "write_report"]
