"""Flood control for log lines (gateway.ratelog), on a hand-driven clock."""

from __future__ import annotations

import logging

from baton.gateway.ratelog import RateLimitedLog


def test_every_event_at_debug_news_at_once_and_a_summary_at_most_every_interval(caplog):
    now = [0.0]
    flood = RateLimitedLog(logging.getLogger("baton.test"), "refused requests", every_s=10.0, clock=lambda: now[0])
    with caplog.at_level("DEBUG", logger="baton.test"):
        for i in range(1000):
            now[0] = i * 0.025  # 40 a second for 25 s, of two kinds
            flood.note("429 rate_limit_exceeded" if i % 2 else "400 invalid_request_error", f"request {i}")
    debug = [r for r in caplog.records if r.levelname == "DEBUG"]
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(debug) == 1000
    assert len(info) == 2 + 2  # each kind once when first seen, then one summary per 10 s
    assert info[0].startswith("400 invalid_request_error: request 0")
    assert info[2].startswith("401 refused requests in the last 10 s: ")


def test_a_new_kind_after_a_summary_is_still_news(caplog):
    now = [0.0]
    flood = RateLimitedLog(logging.getLogger("baton.test"), "failed legs", logging.WARNING, every_s=1.0,
                           clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="baton.test"):
        flood.note("engine a http error", "500")
        now[0] = 0.5
        flood.note("engine a http error", "500")
        flood.note("engine b timeout error", "no answer")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["engine a http error", "engine b timeout error"]
