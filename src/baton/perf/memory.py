"""KV-cache capacity from engine flags, computed the way vLLM sizes it at start-up.

vLLM (``Worker.determine_available_memory``) profiles one dummy forward pass of
``max_num_batched_tokens`` tokens and a dummy sampler pass over ``max_num_seqs``
requests, then gives the KV cache what is left of ``total_memory x
gpu_memory_utilization`` after the weights, the activation peak and other non-KV
allocations (here: a KV connector's transfer buffer), rounded down to whole blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.errors import ConfigError
from baton.perf.specs import HardwareSpec, ModelSpec

ACT_BYTES = 2      # bf16/fp16 activations
LOGIT_BYTES = 4    # the sampler works on fp32 logits


@dataclass(slots=True, frozen=True)
class MemoryFlags:
    """The engine flags that decide KV capacity (names as vLLM's CLI, units in names).

    ``kv_tokens`` overrides the computed capacity; ``kv_buffer_bytes`` is memory a KV
    connector reserves per instance (e.g. P2pNcclConnector's ``kv_buffer_size``).
    """

    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    kv_buffer_bytes: float = 0.0
    kv_tokens: int | None = None


def activation_peak_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                          max_num_seqs: int) -> float:
    """Peak activation memory per GPU of vLLM's profiling pass, in bytes.

    The largest set of live tensors is inside one MLP: the layer input and the
    residual (2 x hidden), the fused gate/up projection (2 x ffn / tp) and its
    activated output (ffn / tp), for every batched token; then the sampler's fp32
    logits for every sequence (vocab / tp per GPU before the gather, vocab after it).
    """
    per_token = (2 * model.hidden + 3 * model.ffn_hidden / tp) * ACT_BYTES
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab * LOGIT_BYTES


def kv_capacity_tokens(model: ModelSpec, hardware: HardwareSpec, tp: int, flags: MemoryFlags) -> int:
    """KV-cache tokens one instance (``tp`` GPUs) holds under these flags."""
    if flags.kv_tokens is not None:
        if flags.kv_tokens <= 0:
            raise ConfigError(f"kv_tokens: expected a positive integer, got {flags.kv_tokens}")
        return flags.kv_tokens
    if not 0.0 < flags.gpu_memory_utilization <= 1.0:
        raise ConfigError("gpu_memory_utilization: expected a fraction in (0, 1], got "
                          f"{flags.gpu_memory_utilization}")
    per_gpu = (hardware.hbm_bytes * flags.gpu_memory_utilization
               - activation_peak_bytes(model, tp, flags.max_num_batched_tokens, flags.max_num_seqs))
    kv_bytes = per_gpu * tp - model.weight_bytes - flags.kv_buffer_bytes
    blocks = int(kv_bytes // (model.kv_bytes_per_token * flags.block_size))
    if blocks <= 0:
        raise ConfigError(f"model {model.name} leaves no room for a KV cache on {tp} x "
                          f"{hardware.name} at gpu_memory_utilization {flags.gpu_memory_utilization}")
    return blocks * flags.block_size
