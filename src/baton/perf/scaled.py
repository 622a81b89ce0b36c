"""A performance model whose iterations take ``scale`` times as long: a GPU ``scale`` times
slower. KV sizes and capacity, the model's context limit and link transfers are the base
model's. The emulator's ``--time-scale`` and the conformance suite's slowed presets are
this model, so the emulator and the simulator time the same iterations the same way."""

from __future__ import annotations

from baton.perf.memory import MemoryFlags
from baton.perf.model import BatchShape, PerfModel


class ScaledPerf(PerfModel):
    """``base`` with every iteration ``scale`` times as long (scale > 0)."""

    def __init__(self, base: PerfModel, scale: float) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        self.base, self.scale = base, scale
        self.kv_bytes_per_token, self.kv_capacity_tokens = base.kv_bytes_per_token, base.kv_capacity_tokens
        self.max_model_len = base.max_model_len

    def iteration_time_s(self, shape: BatchShape) -> float:
        return self.base.iteration_time_s(shape) * self.scale

    def kv_tokens_for(self, flags: MemoryFlags) -> int:
        return self.base.kv_tokens_for(flags)


def scaled(base: PerfModel, scale: float) -> PerfModel:
    """``base`` itself at scale 1, else ``ScaledPerf(base, scale)``."""
    return base if scale == 1 else ScaledPerf(base, scale)
