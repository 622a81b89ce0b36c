"""Named model/hardware presets: ``baton.perf.presets.build("llama-3.1-8b@a100-80g")``.

Efficiency factors are calibrated against figures the seed papers publish; the
calibration tests in ``tests/perf/test_calibration.py`` pin them.
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.errors import ConfigError
from baton.perf.roofline import RooflineModel
from baton.perf.specs import Efficiency, HardwareSpec, ModelSpec

MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3.2-3b": ModelSpec("llama-3.2-3b", 3.21e9, 28, 3072, 24, 8, 128, 8192, 128256),
    "qwen3-32b": ModelSpec("qwen3-32b", 32.8e9, 64, 5120, 64, 8, 128, 25600, 151936),
    "deepseek-r1-distill-qwen-7b-w8a8": ModelSpec(
        "deepseek-r1-distill-qwen-7b-w8a8", 7.62e9, 28, 3584, 28, 4, 128, 18944, 152064,
        weight_bytes_per_param=1.0),
    "llama-2-70b": ModelSpec("llama-2-70b", 68.98e9, 80, 8192, 64, 8, 128, 28672, 32000),
}

HARDWARE: dict[str, HardwareSpec] = {
    "a100-80g": HardwareSpec("a100-80g", 312e12, 2.039e12, 80e9, interconnect_bytes_per_s=300e9),
    "h100": HardwareSpec("h100", 989e12, 3.35e12, 80e9, interconnect_bytes_per_s=450e9),
    "h20": HardwareSpec("h20", 148e12, 4.0e12, 141e9, interconnect_bytes_per_s=450e9),
    # W8A8 runs the matmuls on INT8 tensor cores.
    "rtx4090d": HardwareSpec("rtx4090d", 297e12, 1.008e12, 24e9, interconnect_bytes_per_s=32e9),
}


@dataclass(slots=True, frozen=True)
class Preset:
    """A model on a GPU type at a tensor-parallel degree, with calibrated efficiencies."""

    model: str
    hardware: str
    tp: int
    efficiency: Efficiency

    def build(self) -> RooflineModel:
        return RooflineModel(MODELS[self.model], HARDWARE[self.hardware], self.tp, self.efficiency)


PRESETS: dict[str, Preset] = {
    "llama-3.1-8b@a100-80g": Preset("llama-3.1-8b", "a100-80g", 1, Efficiency()),
    "llama-3.1-8b@h100": Preset("llama-3.1-8b", "h100", 1, Efficiency()),
    "llama-3.2-3b@h100": Preset("llama-3.2-3b", "h100", 1, Efficiency(
        memory=0.8, attn_memory=0.75, attn_launch_s=12e-6, iteration_overhead_s=0.0)),
    "qwen3-32b@h20": Preset("qwen3-32b", "h20", 1, Efficiency(
        compute=0.65, memory=0.85, iteration_overhead_s=3e-3)),
    "deepseek-r1-distill-qwen-7b-w8a8@rtx4090d": Preset(
        "deepseek-r1-distill-qwen-7b-w8a8", "rtx4090d", 1,
        Efficiency(activation_reserve_bytes=1.5e9)),
    "llama-2-70b-tp2@a100-80g": Preset("llama-2-70b", "a100-80g", 2, Efficiency(
        gpu_memory_fraction=0.95, activation_reserve_bytes=1e9)),
}

DEFAULT_PRESET = "llama-3.1-8b@a100-80g"


def build(name: str) -> RooflineModel:
    """Build a named preset; the error lists the known names."""
    try:
        return PRESETS[name].build()
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"preset: unknown preset {name!r}; known presets: {known}") from None
