"""Chunk builders and the byte-level token-id splice of the verbatim relay."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from baton.protocol.chunks import stream_chunk, without_token_ids

TRICKY_TEXTS = ['plain', 'say "token_ids": [1, 2] please', '\\"token_ids\\":[3]', '"prompt_token_ids":[4]',
                'ünïcödé ✓ "]', '[1,2,3]', '{"token_ids":[5]}', '']


def _payloads(rng: np.random.Generator, n: int):
    for i in range(n):
        text = TRICKY_TEXTS[i % len(TRICKY_TEXTS)]
        ids = [int(x) for x in rng.integers(0, 50_000, size=int(rng.integers(0, 4)))]
        prompt = [int(x) for x in rng.integers(0, 50_000, size=int(rng.integers(1, 6)))] if i % 3 == 0 else None
        kind = "chat" if i % 2 else "completions"
        yield stream_chunk(kind, f"cmpl-{i}", 'm"odel', 123, text, None if i % 5 else "stop",
                           token_ids=ids, first=i % 4 == 0, prompt_token_ids=prompt)


def _nulled(payload):
    """The payload with every token id list replaced by None (what the splice must give)."""
    if isinstance(payload, dict):
        return {k: None if k in ("token_ids", "prompt_token_ids") and isinstance(v, list) else _nulled(v)
                for k, v in payload.items()}
    if isinstance(payload, list):
        return [_nulled(v) for v in payload]
    return payload


@pytest.mark.parametrize("encode", [orjson.dumps, lambda p: json.dumps(p).encode(),
                                    lambda p: json.dumps(p, indent=1).encode(),
                                    lambda p: json.dumps(p, ensure_ascii=False).encode()],
                         ids=["compact", "spaced", "indented", "utf8"])
def test_without_token_ids_nulls_exactly_the_id_lists(encode):
    for payload in _payloads(np.random.default_rng(0), 200):
        raw = encode(payload)
        out = without_token_ids(raw)
        assert orjson.loads(out) == _nulled(payload)  # texts that look like keys are untouched


def test_without_token_ids_leaves_chunks_without_ids_byte_identical():
    raw = orjson.dumps(stream_chunk("completions", "x", "m", 1, 'a "token_ids": [1]', None))
    assert without_token_ids(raw) == raw
    vllm_style = b'{"id":"cmpl-1","choices":[{"index":0,"text":"a","token_ids":[7,-1],"prompt_token_ids":null}]}'
    assert without_token_ids(vllm_style) == \
        b'{"id":"cmpl-1","choices":[{"index":0,"text":"a","token_ids":null,"prompt_token_ids":null}]}'


def test_the_one_list_fast_path_and_empty_lists():
    one = b'{"choices":[{"index":0,"text":"a","prompt_token_ids":null,"token_ids":[3,4]}]}'
    assert without_token_ids(one, 1) == one.replace(b"[3,4]", b"null")
    spaced = b'{"choices": [{"index": 0, "text": "a", "token_ids": [3, 4]}]}'
    assert orjson.loads(without_token_ids(spaced, 1))["choices"][0]["token_ids"] is None  # falls back
    empty = b'{"prompt_token_ids":[],"choices":[{"index":0,"text":"","token_ids":[]}]}'
    assert orjson.loads(without_token_ids(empty, 2)) == {"prompt_token_ids": None, "choices": [
        {"index": 0, "text": "", "token_ids": None}]}
