"""Analytic roofline performance model with efficiency factors and tensor parallelism."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from baton.core.errors import ConfigError
from baton.perf.memory import MemoryFlags, kv_capacity_tokens
from baton.perf.model import BatchShape, PerfModel
from baton.perf.specs import Efficiency, HardwareSpec, ModelSpec


@dataclass(slots=True, frozen=True)
class IterationBreakdown:
    """Seconds spent per part of one iteration."""

    linear_s: float
    prefill_attn_s: float
    decode_attn_s: float
    attn_launch_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def attention_s(self) -> float:
        return self.prefill_attn_s + self.decode_attn_s + self.attn_launch_s

    @property
    def total_s(self) -> float:
        return (self.linear_s + self.attention_s + self.allreduce_s + self.overhead_s)


_TOKEN_TERMS_KEPT = 1 << 16  # token counts whose terms are kept (a batch has at most max_num_batched_tokens)


def _combine(compute_s: float, memory_s: float, p: float) -> float:
    """max(compute, memory) when ``p`` is infinite (perfect overlap), else their p-norm,
    which rounds the roofline's corner the way measured GEMMs do."""
    if math.isinf(p):
        return max(compute_s, memory_s)
    return (compute_s ** p + memory_s ** p) ** (1.0 / p)


class RooflineModel(PerfModel):
    """Iteration time = max(compute, memory) of the weight matmuls + prefill attention
    (compute-bound) + decode attention (KV reads, memory-bound, slowed by length
    heterogeneity) + per-layer kernel launches + tensor-parallel all-reduces + overhead.

    With tensor parallelism ``tp`` the weights, KV heads and FLOPs split evenly across
    GPUs and two all-reduces of the activations are paid per layer.
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                 efficiency: Efficiency | None = None) -> None:
        if tp < 1:
            raise ConfigError(f"tp: expected a positive integer, got {tp}")
        self.model, self.hardware, self.tp = model, hardware, tp
        self.eff = efficiency or Efficiency()
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.max_model_len = model.max_model_len
        self._allreduce_call_s = hardware.allreduce_call_s(tp) if tp > 1 else 0.0
        self._by_tokens: dict[int, tuple[float, float]] = {}  # see _token_terms
        if model.weight_bytes >= hardware.hbm_bytes * tp:
            raise ConfigError(f"model {model.name} does not fit on {tp} x {hardware.name}")
        self.kv_capacity_tokens = self.kv_tokens_for(MemoryFlags())
        # FLOP/s of the weight matmuls (their dtype) and of attention (16-bit activations)
        self._matmul_flops = hardware.flops_for(model.compute_dtype)
        self._attn_flops = hardware.flops_for(None if model.compute_dtype is None else "bf16")

    def kv_tokens_for(self, flags: MemoryFlags) -> int:
        """KV capacity of one instance under these engine flags (vLLM's sizing)."""
        return kv_capacity_tokens(self.model, self.hardware, self.tp, flags)

    def breakdown(self, shape: BatchShape) -> IterationBreakdown:
        """Per-part times of one iteration (seconds)."""
        tokens = shape.prefill_tokens + shape.n_decodes
        if tokens == 0:
            return IterationBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        linear_s, allreduce_s = self._token_terms(tokens)
        return IterationBreakdown(linear_s, self._prefill_attn_s(shape), self._decode_attn_s(shape),
                                  self.model.n_layers * self.eff.attn_launch_s, allreduce_s,
                                  self.eff.iteration_overhead_s)

    def _token_terms(self, tokens: int) -> tuple[float, float]:
        """(weight matmuls, all-reduces) of an iteration of ``tokens`` tokens (s): they
        depend on the token count alone, so they are kept per count (the engine model asks
        for the same few counts again and again)."""
        terms = self._by_tokens.get(tokens)
        if terms is not None:
            return terms
        m, hw, eff, tp = self.model, self.hardware, self.eff, self.tp
        flops = 2.0 * m.matmul_params * eff.compute_tokens(tokens) / tp
        linear_s = _combine(flops / (self._matmul_flops * eff.compute),
                            m.weight_bytes_read(tokens) / tp / (hw.hbm_bytes_per_s * eff.memory), eff.roofline_p)
        allreduce_s = 0.0
        if tp > 1:
            act_bytes = tokens * m.hidden * 2.0
            ring = 2.0 * (tp - 1) / tp * act_bytes / hw.interconnect_bytes_per_s
            allreduce_s = 2.0 * m.n_layers * (self._allreduce_call_s + ring)
        if len(self._by_tokens) < _TOKEN_TERMS_KEPT:
            self._by_tokens[tokens] = (linear_s, allreduce_s)
        return linear_s, allreduce_s

    def _decode_attn_s(self, shape: BatchShape) -> float:
        eff = self.eff
        het = 1.0 + eff.heterogeneity * min(shape.decode_ctx_cv2, eff.heterogeneity_cap)
        kv_read = self.kv_bytes_per_token * shape.decode_ctx_tokens * het / self.tp
        return (kv_read / (self.hardware.hbm_bytes_per_s * eff.attn_memory)
                + self.model.n_layers * eff.attn_per_seq_s * shape.n_decodes)

    def _prefill_attn_s(self, shape: BatchShape) -> float:
        """Prefill attention: the pairs to earlier context, the chunks' causal triangles
        at their own rate, and a fixed cost per chunk per layer."""
        if shape.prefill_tokens == 0:
            return 0.0
        m, eff = self.model, self.eff
        flops_per_pair = 4.0 * m.n_layers * m.n_heads * m.head_dim / self.tp
        diag = min(shape.prefill_diag_pairs, shape.prefill_attn_pairs)
        diag_eff = eff.attn_diag_compute or eff.attn_compute
        chunks = max(shape.prefill_chunks, 1)
        return (flops_per_pair * ((shape.prefill_attn_pairs - diag) / eff.attn_compute + diag / diag_eff)
                / self._attn_flops + m.n_layers * eff.prefill_chunk_s * chunks)

    def iteration_time_s(self, shape: BatchShape) -> float:
        """``breakdown(shape).total_s``, summed in the same order without building it."""
        tokens = shape.prefill_tokens + shape.n_decodes
        if tokens == 0:
            return 0.0
        linear_s, allreduce_s = self._token_terms(tokens)
        attention_s = (self._prefill_attn_s(shape) + self._decode_attn_s(shape)
                       + self.model.n_layers * self.eff.attn_launch_s)
        return linear_s + attention_s + allreduce_s + self.eff.iteration_overhead_s

    def chunk_time_fn(self, n_decodes: int, decode_ctx_tokens: int,
                      prompt_tokens: int = 0) -> Callable[[int], float]:
        """``iteration_time_s(prefill_shape(x, max(0, prompt_tokens - x), n_decodes,
        decode_ctx_tokens))`` as a function of x (s): the decode attention and the
        constants are computed once, every term in the same operations and order, so the
        floats are the same (a chunk search asks a few times per decode instance)."""
        m, eff = self.model, self.eff
        # _decode_attn_s of these decodes at no length spread (a shape's default), inline
        het = 1.0 + eff.heterogeneity * min(0.0, eff.heterogeneity_cap)
        decode_s = (self.kv_bytes_per_token * decode_ctx_tokens * het / self.tp
                    / (self.hardware.hbm_bytes_per_s * eff.attn_memory) + m.n_layers * eff.attn_per_seq_s * n_decodes)
        launch_s, overhead_s = m.n_layers * eff.attn_launch_s, eff.iteration_overhead_s
        flops_per_pair = 4.0 * m.n_layers * m.n_heads * m.head_dim / self.tp
        attn_compute, diag_eff = eff.attn_compute, eff.attn_diag_compute or eff.attn_compute
        attn_flops, chunk_s = self._attn_flops, m.n_layers * eff.prefill_chunk_s
        token_terms, by_tokens = self._token_terms, self._by_tokens

        def chunk_time_s(x: int) -> float:
            tokens = x + n_decodes
            if tokens == 0:
                return 0.0
            terms = by_tokens.get(tokens) or token_terms(tokens)
            if x:  # _prefill_attn_s of one chunk: offset pairs, then its causal triangle
                off = prompt_tokens - x  # max(0, .) and min(., .) as conditionals: a search calls this
                pairs = x * ((off if off > 0 else 0) + (x + 1) / 2.0)
                tri = x * (x + 1) / 2.0
                diag = pairs if pairs < tri else tri
                prefill_s = (flops_per_pair * ((pairs - diag) / attn_compute + diag / diag_eff)
                             / attn_flops + chunk_s)
            else:
                prefill_s = 0.0
            return terms[0] + (prefill_s + decode_s + launch_s) + terms[1] + overhead_s
        return chunk_time_s

    # --- per-layer operator times, for checks against measured operator profiles -------
    def mlp_layer_s(self, tokens: int) -> float:
        """One layer's gated MLP (up, gate, down projections) for ``tokens`` tokens."""
        m, hw, eff = self.model, self.hardware, self.eff
        params = 3.0 * m.hidden * m.ffn_hidden / self.tp
        flops = 2.0 * params * eff.compute_tokens(tokens)
        return _combine(flops / (self._matmul_flops * eff.compute),
                        params * m.weight_bytes_per_param / (hw.hbm_bytes_per_s * eff.memory),
                        eff.roofline_p)

    def decode_attn_layer_s(self, batch: int, ctx_tokens: int) -> float:
        """One layer's decode attention for ``batch`` requests of ``ctx_tokens`` each."""
        per_layer = self.kv_bytes_per_token / self.model.n_layers / self.tp
        read = per_layer * batch * ctx_tokens
        return (self.eff.attn_launch_s + self.eff.attn_per_seq_s * batch
                + read / (self.hardware.hbm_bytes_per_s * self.eff.attn_memory))
