"""Model and hardware descriptions for the analytic performance model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from baton.core.errors import ConfigError


@dataclass(slots=True, frozen=True)
class MoESpec:
    """Mixture-of-experts FFNs: ``layers`` MoE layers, each with ``routed`` experts of which
    ``top_k`` serve a token, plus ``shared`` experts every token uses; every expert is a
    gated MLP of width ``expert_ffn``."""

    layers: int
    routed: int
    top_k: int
    shared: int
    expert_ffn: int

    def expert_params(self, hidden: int) -> float:
        """Weights of one expert (gate, up and down projections)."""
        return 3.0 * hidden * self.expert_ffn

    def touched(self, tokens: int) -> float:
        """Expected distinct routed experts one layer reads for a batch of ``tokens``
        tokens, if each token picks ``top_k`` of ``routed`` uniformly: a decode step at
        batch 16 with top-6 of 64 touches about 50 of them."""
        if tokens <= 0:
            return 0.0
        return self.routed * (1.0 - (1.0 - self.top_k / self.routed) ** tokens)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A decoder-only transformer. ``params`` counts all weights, embeddings included.

    ``moe`` makes its FFNs mixtures of experts (only the routed experts a batch touches
    are read, and each token computes with ``top_k`` of them); ``kv_elems_per_layer``
    overrides the K+V elements cached per token per layer (MLA caches one compressed
    latent: 512 + 64 for DeepSeek-V2). ``compute_dtype`` picks the GPU's FLOP/s for the
    weight matmuls (``HardwareSpec.flops_for``; attention then runs at 16 bits); None
    keeps ``peak_flops`` for both, as the named presets do. With ``tie_word_embeddings``
    the LM head's matmul is the embedding's weights, counted once in ``params``."""

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
    moe: MoESpec | None = None
    kv_elems_per_layer: int | None = None
    compute_dtype: str | None = None  # the weight matmuls' dtype ("bf16", "fp8", "int8", ...)
    tie_word_embeddings: bool = False  # the LM head reuses the input embedding

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers."""
        per_layer = self.kv_elems_per_layer or 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * per_layer * self.kv_bytes_per_elem

    @property
    def weight_bytes(self) -> float:
        return self.params * self.weight_bytes_per_param

    @property
    def matmul_params(self) -> float:
        """Weights each token computes with (the input embedding is a lookup; an MoE
        token uses ``top_k`` of the routed experts)."""
        idle = 0.0
        if self.moe is not None:
            idle = (self.moe.routed - self.moe.top_k) * self.moe.expert_params(self.hidden) * self.moe.layers
        lookup = 0.0 if self.tie_word_embeddings else self.vocab * self.hidden
        return self.params - lookup - idle

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one iteration of ``tokens`` batched tokens reads: everything for a
        dense model; for an MoE model, the routed experts no token of the batch uses stay
        unread."""
        if self.moe is None:
            return self.weight_bytes
        m = self.moe
        unread = (m.routed - m.touched(tokens)) * m.expert_params(self.hidden) * m.layers
        return self.weight_bytes - unread * self.weight_bytes_per_param


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    """One accelerator and its links. Rates are per GPU.

    ``peak_flops`` is the dense tensor rate (FLOP/s) the named presets use;
    ``dtype_flops`` lists the dense rate per matmul dtype ((dtype, FLOP/s) pairs) where the
    GPU runs some dtype at another rate. Tensor parallelism needs a measured all-reduce
    (``allreduce_latency_s``); a GPU without one serves at TP 1 only."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    nic_bytes_per_s: float = 25e9 / 8
    nic_latency_s: float = 20e-6
    interconnect_bytes_per_s: float = 300e9
    allreduce_latency_s: tuple[tuple[int, float], ...] = ()
    collective_launch_s: float = 0.0
    dtype_flops: tuple[tuple[str, float], ...] = ()

    def flops_for(self, dtype: str | None) -> float:
        """Dense tensor FLOP/s for matmuls in ``dtype``; ``peak_flops`` for None or a dtype
        not listed."""
        return next((f for d, f in self.dtype_flops if d == dtype), self.peak_flops)

    def allreduce_call_s(self, workers: int) -> float:
        """Fixed cost of one all-reduce among ``workers`` GPUs (latency + CPU launch), s.
        Only measured worker counts are known; anything else is a configuration error."""
        for n, latency_s in self.allreduce_latency_s:
            if n == workers:
                return latency_s + self.collective_launch_s
        known = ", ".join(str(n) for n, _ in self.allreduce_latency_s) or "none"
        raise ConfigError(f"hardware {self.name}: no measured all-reduce latency for "
                          f"tensor parallelism {workers} (known: {known}); use tp 1 on this GPU "
                          "or a GPU with measured all-reduce (baton list gpus)")


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
    - ``attn_per_seq_s``: decode-attention cost per layer per sequence in the batch (its
      work partition, block-table walk and partial-tile reads), on top of the KV bytes.
    - ``prefill_chunk_s``: prefill-attention cost per layer per chunk (launch and the
      under-filled waves of a short chunk).
    - ``attn_diag_compute``: of peak FLOP/s for the pairs inside a chunk's own causal
      triangle (masked tiles); None: ``attn_compute``.
    - ``tile_tokens`` / ``tile_waste``: the weight matmuls run on tiles of
      ``tile_tokens`` rows; a partly filled tile costs ``tile_waste`` of its empty rows
      (0: no quantisation, 1: a full tile's compute).
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
    attn_per_seq_s: float = 0.0
    prefill_chunk_s: float = 0.0
    attn_diag_compute: float | None = None
    tile_tokens: int = 1
    tile_waste: float = 0.0

    def compute_tokens(self, tokens: int) -> float:
        """Rows the weight matmuls compute for ``tokens`` batched tokens, with the empty
        rows of the last tile counted at ``tile_waste``."""
        pad = -tokens % self.tile_tokens
        return tokens + self.tile_waste * pad
