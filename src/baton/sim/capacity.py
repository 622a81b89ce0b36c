"""An upper bound on the request rate a cluster can serve, from its performance model: for
telling a trace whose timestamps were read in the wrong unit from a heavy workload."""

from __future__ import annotations

from baton.perf.model import PerfModel, batch_shape, prefill_shape
from baton.sim.cluster import ClusterSpec

PREFILL_BUDGET_TOKENS = 8192  # vLLM's default max_num_batched_tokens: a full prefill iteration
DECODE_BATCH = 256  # vLLM's default max_num_seqs: a full decode iteration


def max_rate_rps(cluster: ClusterSpec, perf: PerfModel, prompt_tokens: float, output_tokens: float) -> float:
    """Requests per second the cluster could serve at most, for requests of these mean
    lengths: every instance prefilling in full iterations and decoding full batches, never
    waiting, with no KV limit. Real clusters serve less; a trace offering several times
    this is more likely misread than heavy."""
    prefill_tokens_per_s = PREFILL_BUDGET_TOKENS / perf.iteration_time_s(prefill_shape(PREFILL_BUDGET_TOKENS))
    ctx = max(1, int(prompt_tokens + output_tokens / 2))
    decode_tokens_per_s = DECODE_BATCH / perf.iteration_time_s(batch_shape([], [ctx] * DECODE_BATCH))
    seconds_per_request = prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s
    return cluster.size / seconds_per_request
