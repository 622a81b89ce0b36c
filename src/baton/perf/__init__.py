"""Performance models: iteration time of a batch, KV bytes per token, prefill and transfer time."""

from baton.perf.model import (BatchShape, PerfModel, batch_shape, chunk_attn_pairs, chunk_diag_pairs, length_cv2,
                              prefill_shape)
from baton.perf.presets import DEFAULT_PRESET, PRESETS, build
from baton.perf.roofline import RooflineModel
from baton.perf.specs import Efficiency, HardwareSpec, ModelSpec

__all__ = [
    "BatchShape", "DEFAULT_PRESET", "Efficiency", "HardwareSpec", "ModelSpec", "PRESETS",
    "PerfModel", "RooflineModel", "batch_shape", "build", "chunk_attn_pairs", "chunk_diag_pairs", "length_cv2",
    "prefill_shape",
]
