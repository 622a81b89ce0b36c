"""What CascadeInfer's planner and refinement read from the view: the sequences in flight
(prompt and context, queued prefills included) and the contexts being decoded."""

from __future__ import annotations

import numpy as np

from baton.core.view import ClusterView


def sequences_in_flight(view: ClusterView, instances: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, context tokens) of every sequence on ``instances``: the decodes and,
    as sequences of context = prompt, the prefills queued or running there (arrivals are
    work the first stages must take)."""
    prompts, ctxs = [], []
    for i in instances:
        rids, ctx, _ = view.decode_snapshot(i)
        ctxs.append(ctx)
        prompts.append(np.array([view.request(int(r)).request.prompt_tokens for r in rids], dtype=float))
        queued = np.array([view.request(r).request.prompt_tokens for r in view.instance(i).prefill_queue],
                          dtype=float)
        ctxs.append(queued)
        prompts.append(queued)
    return (np.concatenate(prompts) if prompts else np.zeros(0),
            np.concatenate(ctxs).astype(float) if ctxs else np.zeros(0))


def decoding_contexts(view: ClusterView, instances: list[int]) -> np.ndarray:
    """Context tokens of the decodes on ``instances``."""
    parts = [view.decode_snapshot(i)[1] for i in instances]
    return np.concatenate(parts).astype(float) if parts else np.zeros(0)
