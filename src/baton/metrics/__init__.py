"""Per-request records, token-gap distribution, run summaries."""

from baton.metrics.records import RequestRecord, write_records
from baton.metrics.summary import SLO, LoadSeries, RunCounters, summarize
from baton.metrics.tbt import GapHistogram

__all__ = ["GapHistogram", "LoadSeries", "RequestRecord", "RunCounters", "SLO", "summarize",
           "write_records"]
