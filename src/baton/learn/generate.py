"""Sampled generations through the gateway, with prompt and output token ids recorded.

Each prompt is sent as a chat completion (the engine applies the model's chat template;
``return_token_ids`` gives back exactly the ids the model saw and produced). Records are
appended to a JSONL file as they finish, so an interrupted run resumes where it stopped:
prompts whose id is already in the file are not sent again. ``seed`` is never sent: vLLM
CPU 0.32 crashes on a chunked prefill when it is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp

from baton.learn.prompts import Prompt


def done_ids(path: Path) -> set[str]:
    """Prompt ids already recorded in ``path`` (a torn last line from a kill is ignored)."""
    return {r["id"] for r in read_records(path)} if Path(path).exists() else set()


def read_records(path: Path) -> list[dict]:
    """Every complete record of a generations file."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "id" in rec and rec.get("output_ids") is not None:
            out.append(rec)
    return out


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: Prompt, max_tokens: int,
               temperature: float) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt.text}], "max_tokens": max_tokens,
            "temperature": temperature, "return_token_ids": True}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        payload = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{prompt.id}: HTTP {resp.status}: {str(payload)[:300]}")
    choice = payload["choices"][0]
    prompt_ids, output_ids = payload.get("prompt_token_ids"), choice.get("token_ids")
    if not isinstance(prompt_ids, list) or not isinstance(output_ids, list):
        raise RuntimeError(f"{prompt.id}: the answer carries no token ids (return_token_ids unsupported?)")
    return {"id": prompt.id, "source": prompt.source, "steer": prompt.steer, "prompt_ids": prompt_ids,
            "output_ids": output_ids, "finish_reason": choice.get("finish_reason"), "max_tokens": max_tokens}


async def generate(url: str, model: str, prompts: list[Prompt], out: Path, max_tokens: int,
                   temperature: float = 0.7, concurrency: int = 32, timeout_s: float = 1800.0,
                   on_done: Callable[[dict], None] | None = None) -> int:
    """Send every prompt not yet in ``out``; returns how many were generated now."""
    todo = [p for p in prompts if p.id not in done_ids(out)]
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def run(p: Prompt) -> None:
                async with gate:
                    rec = await _one(session, url, model, p, max_tokens, temperature)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if on_done:
                    on_done(rec)
            await asyncio.gather(*(run(p) for p in todo))
    return len(todo)
