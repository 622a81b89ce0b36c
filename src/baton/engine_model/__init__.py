"""The engine model: one vLLM-style engine (continuous batching, chunked prefill, paged KV
with prefix caching, admission and preemption), below both runtimes. The simulator
advances it on its event clock, many iterations per segment in closed form; the emulator
advances it one iteration at a time on wall-clock time (``emulator/engine_loop.py``)."""

from baton.engine_model.engine import Engine
from baton.engine_model.work import DecodeJoin, DecodeRow, EngineConfig, PrefillItem, PrefillKind, SegmentResult

__all__ = ["DecodeJoin", "DecodeRow", "Engine", "EngineConfig", "PrefillItem", "PrefillKind", "SegmentResult"]
