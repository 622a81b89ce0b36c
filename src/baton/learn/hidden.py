"""Hidden states of real generations: one teacher-forced forward pass per generation.

For a generation with prompt ids p (length P) and output ids o (length L), the forward
pass runs over p + o. The state that predicts what comes after g generated tokens is the
one at position P - 1 + g (the last token the model has seen then); it is sampled at
g = 0, k, 2k, ... < L, labelled with the remaining length L - g. Two states are kept per
sample: the last layer's (after the final norm, what the LM head reads) and the first
layer's input (the token embedding), for the ablation that shows where the signal is.

Samples go to float16 shards (``shard-NNNNN.npz``: ``last``, ``first``, ``request``,
``generated``, ``remaining``, ``prompt_tokens``) with ``index.json`` listing the shards and
the request ids each holds; a rerun skips requests already in a shard (resume).

Needs torch and transformers (the ``predictor`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def sample_positions(prompt_tokens: int, output_tokens: int, every_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions in prompt + output, tokens generated at each) for one generation."""
    generated = np.arange(0, output_tokens, every_tokens, dtype=np.int64)
    return prompt_tokens - 1 + generated, generated


def load_model(model_dir: Path, dtype: str = "bfloat16"):
    """The transformers base model (no LM head: only hidden states are needed). bfloat16 by
    default: the dtype the engine serves in, and much faster than float32 on CPUs with
    AMX (such as this machine's)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    model.eval()
    return model


def states_at(model, ids: list[int], positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(last-layer, embedding) hidden states at ``positions`` of one forward over ``ids``."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    pos = torch.from_numpy(positions)
    return (out.hidden_states[-1][0, pos].float().numpy(), out.hidden_states[0][0, pos].float().numpy())


class ShardIndex:
    """``index.json`` of a hidden-state folder: shards in order and the requests they hold."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.path = Path(folder), Path(folder) / "index.json"
        data = json.loads(self.path.read_text()) if self.path.exists() else {"shards": []}
        self.shards: list[dict] = data["shards"]
        self.meta: dict = data.get("meta", {})

    def requests(self) -> set[str]:
        return {r for s in self.shards for r in s["requests"]}

    def add(self, name: str, requests: list[str], samples: int) -> None:
        self.shards.append({"file": name, "requests": requests, "samples": samples})
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"meta": self.meta, "shards": self.shards}))
        tmp.replace(self.path)  # atomic: an interrupted write never leaves a torn index

    def load(self) -> dict[str, np.ndarray]:
        """Every shard concatenated (request ids as strings)."""
        parts = [dict(np.load(self.folder / s["file"])) for s in self.shards]
        if not parts:
            raise FileNotFoundError(f"no hidden-state shards in {self.folder}")
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _write_shard(index: ShardIndex, rows: list[dict]) -> None:
    name = f"shard-{len(index.shards):05d}.npz"
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0] if k != "id"}
    np.savez(index.folder / name, **cat)
    index.add(name, [r["id"] for r in rows], int(cat["remaining"].size))


def extract(records: list[dict], model_dir: Path, folder: Path, every_tokens: int = 16, shard_requests: int = 64,
            max_context: int = 2048, on_request: Callable[[], None] | None = None) -> int:
    """Hidden-state samples of every record not yet in ``folder``; returns requests done now."""
    folder.mkdir(parents=True, exist_ok=True)
    index = ShardIndex(folder)
    index.meta.update({"every_tokens": every_tokens, "model": str(model_dir)})
    have = index.requests()
    todo = [r for r in records if r["id"] not in have and r["output_ids"]]
    model = load_model(model_dir) if todo else None
    rows: list[dict] = []
    for rec in todo:
        total = len(rec["output_ids"])
        positions, generated = sample_positions(len(rec["prompt_ids"]), min(total, max_context - len(rec["prompt_ids"])),
                                                every_tokens)
        if positions.size == 0:
            continue  # a prompt that filled the context: nothing was generated after it
        ids = (rec["prompt_ids"] + rec["output_ids"])[:int(positions[-1]) + 1]  # nothing after the last sample matters
        last, first = states_at(model, ids, positions)
        rows.append({"id": rec["id"], "last": last.astype(np.float16), "first": first.astype(np.float16),
                     "request": np.full(positions.size, rec["id"]), "generated": generated,
                     "remaining": total - generated, "prompt_tokens": np.full(positions.size, len(rec["prompt_ids"]))})
        if len(rows) >= shard_requests:
            _write_shard(index, rows)
            rows = []
        if on_request:
            on_request()
    if rows:
        _write_shard(index, rows)
    return len(todo)
