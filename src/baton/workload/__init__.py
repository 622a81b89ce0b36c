"""Trace loaders and synthetic workload generators."""

from baton.workload.loaders import FORMATS, detect_format, load_trace
from baton.workload.source_engine import SourceEngine, mismatches, source_engine
from baton.workload.stats import workload_stats
from baton.workload.synthetic import SyntheticSpec, generate, reasoning_spec
from baton.workload.transform import clip_lengths, clip_window, first, mean_rate_rps, scale_to_rate

__all__ = ["FORMATS", "SourceEngine", "SyntheticSpec", "clip_lengths", "clip_window", "detect_format",
           "first", "generate", "load_trace", "mean_rate_rps", "mismatches", "reasoning_spec", "scale_to_rate",
           "source_engine", "workload_stats"]
