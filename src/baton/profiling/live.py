"""Measure a running vLLM-compatible engine over a ``ProfileGrid``.

Prompts are random token ids (10 per mille of vocabularies is enough: ids 1000-9999) so
prefix caching never shortens a prefill, and every request sets ``ignore_eos`` so it runs
exactly as long as asked. Decode streams are cancelled once measured (vLLM aborts them).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable

import aiohttp
import orjson
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from baton.core.errors import BatonError
from baton.profiling.grid import EngineFacts, ProfileGrid, ProfileRow

PREFILL_HISTOGRAM = "vllm:request_prefill_time_seconds"
Progress = Callable[[str], None]


class EngineProbe:
    """An HTTP session on one engine, with the helpers each measurement needs."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str | None, seed: int) -> None:
        self.session, self.url, self.model = session, url.rstrip("/"), model
        self.rng = np.random.default_rng(seed)

    def prompt(self, tokens: int) -> list[int]:
        return [int(t) for t in self.rng.integers(1000, 10_000, tokens)]

    def body(self, prompt_tokens: int | list[int], max_tokens: int, stream: bool) -> dict:
        """A completion of a fresh random prompt of ``prompt_tokens`` tokens (or of these ids)."""
        ids = self.prompt(prompt_tokens) if isinstance(prompt_tokens, int) else prompt_tokens
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    async def metrics_text(self) -> str:
        async with self.session.get(self.url + "/metrics") as resp:
            if resp.status != 200:
                raise BatonError(f"{self.url}/metrics: HTTP {resp.status}")
            return await resp.text()

    async def counters(self) -> tuple[tuple[float, float] | None, float | None]:
        """From one scrape: (sum, count) of the engine's prefill-time histogram, and its
        prefix-cache hits counter (tokens); each None if not exported."""
        total = count = hits = None
        for family in text_string_to_metric_families(await self.metrics_text()):
            for s in family.samples:
                if s.name == PREFILL_HISTOGRAM + "_sum":
                    total = (total or 0.0) + s.value
                elif s.name == PREFILL_HISTOGRAM + "_count":
                    count = (count or 0.0) + s.value
                elif s.name == "vllm:prefix_cache_hits_total" and hits is None:
                    hits = s.value
        return (None if total is None or count is None else (total, count)), hits

    async def prefill_histogram(self) -> tuple[float, float] | None:
        """(sum, count) of the engine's prefill-time histogram; None if not exported."""
        return (await self.counters())[0]

    async def complete(self, prompt_tokens: int | list[int]) -> float:
        """One non-streamed request of one output token (a fresh random prompt of
        ``prompt_tokens`` tokens, or these ids); returns the client's time (s)."""
        t0 = time.perf_counter()
        async with self.session.post(self.url + "/v1/completions", json=self.body(prompt_tokens, 1, False)) as r:
            text = await r.text()
            if r.status != 200:
                n = prompt_tokens if isinstance(prompt_tokens, int) else len(prompt_tokens)
                raise BatonError(f"{self.url}: HTTP {r.status} for a {n}-token prompt: {text[:200]}")
        return time.perf_counter() - t0


async def engine_facts(session: aiohttp.ClientSession, url: str, model: str | None) -> EngineFacts:
    """Read the served model, its context limit and the KV cache facts."""
    url = url.rstrip("/")
    try:
        async with session.get(url + "/v1/models") as resp:
            data = (await resp.json())["data"]
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as exc:
        raise BatonError(f"{url}/v1/models: cannot read the served models ({exc})") from None
    names = [m.get("id") for m in data]
    if model is None:
        model = names[0]
    elif model not in names:
        raise BatonError(f"{url} serves {', '.join(map(str, names))}, not {model!r} (see --model)")
    entry = next(m for m in data if m.get("id") == model)
    probe = EngineProbe(session, url, model, 0)
    text = await probe.metrics_text()
    block, kv_tokens, kv_bytes = _cache_facts(text)
    return EngineFacts(url, model, int(entry.get("max_model_len") or 2048), block, kv_tokens, kv_bytes,
                       PREFILL_HISTOGRAM + "_sum" in text)


def _cache_facts(metrics: str) -> tuple[int | None, int | None, int | None]:
    """Block size, KV capacity (tokens) and KV bytes per token from ``cache_config_info``."""
    for family in text_string_to_metric_families(metrics):
        if family.name != "vllm:cache_config_info":
            continue
        for s in family.samples:
            lab = s.labels
            block = _int(lab.get("block_size"))
            tokens = _int(lab.get("kv_cache_size_tokens"))
            blocks = _int(lab.get("num_gpu_blocks"))
            if tokens is None and block and blocks:
                tokens = block * blocks
            mem = _int(lab.get("kv_cache_memory_bytes"))
            return block, tokens, (mem // tokens if mem and tokens else None)
    return None, None, None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "None", "") else None
    except ValueError:
        return None


async def _timed_prefill(probe: EngineProbe, prompt: int | list[int], scrape: bool) -> tuple[float, str, float | None]:
    """One completion of ``prompt`` alone: (its prefill time s, ``engine`` where the
    engine's histogram timed exactly it, else ``client``, the prefix-cache hit tokens it
    added or None), scraping the engine before and after only when ``scrape``."""
    hist0, hits0 = await probe.counters() if scrape else (None, None)
    client_s = await probe.complete(prompt)
    hist1, hits1 = await probe.counters() if scrape else (None, None)
    hit = hits1 - hits0 if hits0 is not None and hits1 is not None else None
    if hist0 and hist1 and hist1[1] - hist0[1] == 1:
        return hist1[0] - hist0[0], "engine", hit
    return client_s, "client", hit


async def measure_prefill(probe: EngineProbe, prompt_tokens: int, engine_timing: bool) -> ProfileRow:
    """One prompt alone on an idle engine."""
    seconds, timing, _ = await _timed_prefill(probe, prompt_tokens, engine_timing)
    return ProfileRow.prefill(prompt_tokens, seconds, timing)


async def measure_cached_prefill(probe: EngineProbe, cached: int, new: int) -> ProfileRow | None:
    """A prompt whose first ``cached`` tokens a request just before it sent: the engine
    computes only what its prefix cache does not hold, with attention over the rest. The
    hit is read from the engine's own counter; None when it caches nothing (prefix caching
    off, or no counter), as such a row would be a plain prefill."""
    ids = probe.prompt(cached + new)
    await probe.complete(ids[:cached])
    seconds, timing, hit = await _timed_prefill(probe, ids, True)
    if hit is None or not 0 < hit < len(ids):
        return None
    return ProfileRow.prefill(len(ids) - int(hit), seconds, timing, cached_tokens=int(hit))


class _Stream:
    """Arrival times (s, perf_counter) and cumulative token counts of one stream's chunks."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.done = False
        self.error = ""

    async def run(self, probe: EngineProbe, prompt_tokens: int, max_tokens: int) -> None:
        try:
            async with probe.session.post(probe.url + "/v1/completions",
                                          json=probe.body(prompt_tokens, max_tokens, True)) as resp:
                if resp.status != 200:
                    self.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for line in resp.content:
                    self._read(line)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done = True

    def _read(self, line: bytes) -> None:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            return
        chunk = orjson.loads(line[6:])
        if not chunk.get("choices"):
            return
        usage = chunk.get("usage") or {}
        # vLLM's continuous usage counts tokens exactly, even when chunks coalesce
        count = usage.get("completion_tokens") or (self.tokens[-1] + 1 if self.tokens else 1)
        self.times.append(time.perf_counter())
        self.tokens.append(int(count))

    def since(self, start_s: float) -> tuple[float, int, float, int] | None:
        """(first time, its tokens, last time, its tokens) of chunks at or after ``start_s``."""
        idx = [i for i, t in enumerate(self.times) if t >= start_s]
        if len(idx) < 2:
            return None
        return self.times[idx[0]], self.tokens[idx[0]], self.times[idx[-1]], self.tokens[idx[-1]]


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.perf_counter() + timeout_s
    while not check():
        if time.perf_counter() > deadline:
            raise BatonError(f"profile: timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.005)


def _decode_row(streams: list[_Stream], context: int, start_s: float) -> ProfileRow | None:
    gaps, ctx = [], 0.0
    for s in streams:
        span = s.since(start_s)
        if span is None or span[3] <= span[1]:
            return None
        t_a, n_a, t_b, n_b = span
        gaps.append((t_b - t_a) / (n_b - n_a))
        ctx += context + (n_a + n_b) / 2.0
    return ProfileRow("decode", 0, 0.0, len(streams), int(round(ctx)), statistics.fmean(gaps), "client")


async def measure_decode(probe: EngineProbe, batch: int, context: int, grid: ProfileGrid,
                         facts: EngineFacts, inject: tuple[int, ...] = ()) -> list[ProfileRow]:
    """``batch`` streams of ``context``-token prompts decoding together, and optionally one
    prompt of each ``inject`` size prefilled while they decode (mixed rows)."""
    streams = [_Stream() for _ in range(batch)]
    max_tokens = min(facts.max_model_len - context - 1, grid.decode_iterations * 4 + 8)
    tasks = [asyncio.create_task(s.run(probe, context, max_tokens)) for s in streams]
    rows: list[ProfileRow] = []
    try:
        await _until(lambda: all(s.times or s.done for s in streams), 600, f"{batch} first tokens")
        _raise_stream_errors(streams)
        start = max(s.times[0] for s in streams)
        base = [s.tokens[-1] for s in streams]
        await _until(lambda: all(s.done or s.tokens[-1] - b >= grid.decode_iterations
                                 for s, b in zip(streams, base)), 600, "decode iterations")
        row = _decode_row(streams, context, start)
        if row is not None:
            rows.append(row)
        # a mixed row is one iteration only if the prompt fits beside the decodes in the budget
        for prompt in (p for p in inject if p + batch <= grid.max_num_batched_tokens) if facts.engine_timing else ():
            mixed = await _mixed_row(probe, streams, context, prompt)
            if mixed is not None:
                rows.append(mixed)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rows


async def _mixed_row(probe: EngineProbe, streams: list[_Stream], context: int,
                     prompt: int) -> ProfileRow | None:
    if any(s.done for s in streams):
        return None
    ctx = sum(context + s.tokens[-1] for s in streams)
    before = await probe.prefill_histogram()
    await probe.complete(prompt)
    after = await probe.prefill_histogram()
    if any(s.done for s in streams) or not before or not after or after[1] - before[1] != 1:
        return None
    return ProfileRow.prefill(prompt, after[0] - before[0], "engine", len(streams), ctx)


def _raise_stream_errors(streams: list[_Stream]) -> None:
    errors = [s.error for s in streams if s.error]
    if errors:
        raise BatonError(f"profile: {len(errors)} stream(s) failed, first: {errors[0]}")


async def profile_engine(url: str, model: str | None, grid: ProfileGrid, seed: int = 0,
                         progress: Progress | None = None) -> tuple[EngineFacts, list[ProfileRow]]:
    """Every row of ``grid`` on the engine at ``url`` (which should be otherwise idle)."""
    try:
        return await _profile(url, model, grid, seed, progress or (lambda _msg: None))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise BatonError(f"profile: {url} stopped answering ({type(exc).__name__}: {exc})") from None


async def _profile(url: str, model: str | None, grid: ProfileGrid, seed: int,
                   say: Progress) -> tuple[EngineFacts, list[ProfileRow]]:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        facts = await engine_facts(session, url, model)
        probe = EngineProbe(session, url, facts.model, seed)
        for _ in range(2):  # warm-up: first requests pay one-off costs
            await probe.complete(16)
        rows: list[ProfileRow] = []
        points = grid.decode_points(facts.max_model_len)
        cached = grid.cached_points(facts.max_model_len)
        steps = len(grid.prefill_prompts()) + len(cached) + len(points)
        done = 0
        for prompt in grid.prefill_prompts():
            rows += [await measure_prefill(probe, prompt, facts.engine_timing) for _ in range(grid.repeats)]
            done += 1
            say(f"[{done}/{steps}] prefill {prompt} tokens: {_ms(rows[-1])}")
        for hit, new in cached:
            measured = [await measure_cached_prefill(probe, hit, new) for _ in range(grid.repeats)]
            rows += [r for r in measured if r is not None]
            done += 1
            say(f"[{done}/{steps}] prefill {new} tokens after {hit} cached: "
                + (", ".join(_ms(r) for r in measured if r is not None) or "no prefix-cache hit: not measured"))
        for batch, context in points:
            inject = grid.mixed_prompt_tokens if batch in grid.mixed_batches else ()
            new: list[ProfileRow] = []
            for _ in range(grid.repeats):
                new += await measure_decode(probe, batch, context, grid, facts, inject)
            rows += new
            done += 1
            measured = ", ".join(_ms(r) for r in new) or "nothing measured (the streams ended first)"
            say(f"[{done}/{steps}] decode batch {batch} at {context} tokens: {measured}")
    return facts, [r for r in rows if math.isfinite(r.iteration_s) and r.iteration_s > 0]


def _ms(row: ProfileRow) -> str:
    return f"{row.kind} {row.iteration_s * 1e3:.1f} ms"
