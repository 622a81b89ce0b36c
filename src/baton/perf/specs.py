"""Model and hardware descriptions for the analytic performance model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from baton.core.errors import ConfigError


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer. ``params`` counts all weights, embeddings included."""

    name: str
    params: float
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_elem: int = 2
    max_model_len: int | None = None  # the longest context the model serves (tokens)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.kv_bytes_per_elem

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_param

    @property
    def matmul_params(self) -> float:
        """Weights used in per-token matmuls (the input embedding is a lookup)."""
        return self.params - self.vocab * self.hidden


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    """One accelerator and its links. Rates are per GPU."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    nic_bytes_per_s: float = 25e9 / 8
    nic_latency_s: float = 20e-6
    interconnect_bytes_per_s: float = 300e9
    allreduce_latency_s: tuple[tuple[int, float], ...] = ()
    collective_launch_s: float = 0.0

    def allreduce_call_s(self, workers: int) -> float:
        """Fixed cost of one all-reduce among ``workers`` GPUs (latency + CPU launch), s.
        Only measured worker counts are known; anything else is a configuration error."""
        for n, latency_s in self.allreduce_latency_s:
            if n == workers:
                return latency_s + self.collective_launch_s
        known = ", ".join(str(n) for n, _ in self.allreduce_latency_s) or "none"
        raise ConfigError(f"hardware {self.name}: no measured all-reduce latency for "
                          f"tensor parallelism {workers} (known: {known})")


@dataclass(slots=True, frozen=True)
class Efficiency:
    """Fractions of peak actually reached, and fixed overheads, calibrated per preset.

    - ``compute`` / ``memory``: of peak FLOP/s and HBM bandwidth for the weight matmuls.
    - ``attn_memory``: of HBM bandwidth while reading KV in decode attention.
    - ``attn_compute``: of peak FLOP/s in prefill attention.
    - ``attn_launch_s``: fixed attention-kernel cost per layer per iteration.
    - ``heterogeneity``: extra decode-attention cost per unit of squared coefficient of
      variation of the batch's context lengths; ``heterogeneity_cap`` bounds the CV2 used.
    - ``roofline_p``: how the weight matmuls' compute and memory times combine: their
      p-norm; infinity is max() (perfect overlap), 2 rounds the corner as measured GEMMs do.
    - ``iteration_overhead_s``: scheduler and sampling cost per iteration.
    """

    compute: float = 0.6
    memory: float = 0.8
    attn_memory: float = 0.7
    attn_compute: float = 0.5
    attn_launch_s: float = 10e-6
    heterogeneity: float = 0.0
    heterogeneity_cap: float = 2.5
    roofline_p: float = math.inf
    iteration_overhead_s: float = 1e-3
