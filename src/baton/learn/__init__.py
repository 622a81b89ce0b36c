"""Building the learned length predictor (ARES section 4) from a real model's generations.

The pipeline, each step resumable and cached outside the repository (``~/.cache/baton``):
``prompts`` (Alpaca and ShareGPT prompts, some with a length-steering suffix) ->
``generate`` (sampled generations through ``baton serve`` in front of vLLM CPU, prompt and
output token ids recorded) -> ``hidden`` (one teacher-forced transformers forward per
generation; last-layer and embedding hidden states every k generated tokens, float16
shards with an index) -> ``train`` (the MLP and the baselines on a by-request split) ->
``evaluate`` (MAE with bootstrap intervals, by generated-so-far bucket, latency, and the
error distribution the simulator's ``learned-error`` estimator replays).

``hidden`` and ``train`` need torch and transformers (the ``predictor`` extra, or the
real-engine virtual environment); the rest needs only Baton's own dependencies.
"""
