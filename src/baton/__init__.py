"""Baton: scheduling policies for prefill/decode-disaggregated LLM serving clusters.

Layers (imports flow one way): ``core`` <- ``policies`` <- {``sim``, ``gateway``}.
``perf`` and ``predict`` are leaf helpers that policies and runtimes may both use.
"""

__version__ = "0.1.0"
