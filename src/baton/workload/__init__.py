"""Trace loaders and synthetic workload generators."""

from baton.workload.loaders import FORMATS, detect_format, load_trace
from baton.workload.stats import workload_stats
from baton.workload.synthetic import SyntheticSpec, generate, reasoning_spec
from baton.workload.transform import clip_lengths, clip_window, first, mean_rate_rps, scale_to_rate

__all__ = ["FORMATS", "SyntheticSpec", "clip_lengths", "clip_window", "detect_format",
           "first", "generate", "load_trace", "mean_rate_rps", "reasoning_spec", "scale_to_rate", "workload_stats"]
