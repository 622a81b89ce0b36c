"""The gateway's prompt estimate before an engine tokenises it (issue 55, HIGH 1): a chat
prompt sent as content parts counts its text like the same text sent as a string."""

from __future__ import annotations

import pytest

from baton.gateway.front import MEDIA_PART_CHARS, estimate_prompt_tokens
from baton.protocol.requests import CHAT, COMPLETIONS
from tests.gateway.test_chaos import FAST
from tests.live import post, servers, start_emulator, start_gateway

TEXT = "word " * 4000  # 20,000 characters: about 5,000 tokens


def chat(*contents) -> dict:
    return {"messages": [{"role": "user", "content": c} for c in contents]}


@pytest.mark.parametrize("kind,body,tokens", [
    (COMPLETIONS, {"prompt": [5, 6, 7]}, 3),
    (COMPLETIONS, {"prompt": "abcdefgh"}, 2),
    (CHAT, chat("abcdefgh"), 2 + 4),
    (CHAT, chat([{"type": "text", "text": "abcdefgh"}]), 2 + 4),
    (CHAT, chat([{"type": "text", "text": "abcd"}, {"type": "text", "text": "efgh"}]), 2 + 4),
    (CHAT, chat([{"type": "refusal", "refusal": "abcdefgh"}]), 2 + 4),
    (CHAT, chat([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]), MEDIA_PART_CHARS // 4 + 4),
    (CHAT, chat([{"type": "input_audio", "input_audio": {"data": "A" * 2_000_000, "format": "wav"}}]),
     1_500_000 // 640 + 4),  # 1.5 MB of audio, about 47 s at 16 kHz (a flat 64 characters booked 16 tokens)
    (CHAT, chat([{"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + "A" * 400_000}}]),
     300_000 // 640 + 4),
    (CHAT, chat([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]), 64 + 4),  # a floor
    (CHAT, chat(None, "abcd"), 1 + 8),
    (CHAT, chat([{"type": "text", "text": TEXT}]), len(TEXT) // 4 + 4),
])
def test_the_estimate_counts_every_text_part(kind, body, tokens):
    assert estimate_prompt_tokens(kind, body)[0] == tokens


def test_a_long_prompt_in_parts_is_refused_like_the_same_string(tmp_path):
    a = start_emulator(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated", "max_prompt_tokens": 1000})
    with servers(a, gw):
        as_string = post(gw.url + "/v1/chat/completions", {**chat(TEXT), "max_tokens": 2})
        as_parts = post(gw.url + "/v1/chat/completions", {**chat([{"type": "text", "text": TEXT}]), "max_tokens": 2})
        short = post(gw.url + "/v1/chat/completions", {**chat([{"type": "text", "text": "hi"}]), "max_tokens": 2})
    assert as_string[0] == as_parts[0] == 400
    assert "max_prompt_tokens" in as_parts[1]["error"]["message"]
    assert short[0] == 200
