"""The sessions workload and prefix identity in traces: each turn's prompt repeats the
session's system prompt and history block for block, Mooncake's hash_ids survive loading,
and the flags and YAML keys reach the generator or name what is wrong."""

import json

import numpy as np
import pytest

from baton.core.errors import ConfigError, WorkloadError
from baton.core.prefix import block_keys
from baton.experiments.config import experiment_from_dict
from baton.workload import load_trace
from baton.workload.sessions import SessionsSpec, generate_sessions
from tests.cli.test_cli import baton


def test_a_turn_repeats_its_session_history_block_for_block():
    reqs = generate_sessions(SessionsSpec(sessions=1, turns_mean=1e9, agent_share=0.0, max_context=6000),
                             np.random.default_rng(0))
    assert len(reqs) >= 3
    for prev, nxt in zip(reqs, reqs[1:]):
        full = (prev.prompt_tokens + prev.output_tokens) // 16  # the previous turn's whole sequence
        assert block_keys(nxt, 16)[:full] == block_keys(prev, 16)[:full]
        assert nxt.prompt_tokens > prev.prompt_tokens + prev.output_tokens and nxt.arrival_s > prev.arrival_s
    assert all(r.prompt_tokens + r.output_tokens <= 6000 for r in reqs)


def test_sessions_are_seeded_and_share_system_prompts_by_popularity():
    spec = SessionsSpec(sessions=300, system_prompts=20, zipf_s=1.2)
    a, b = (generate_sessions(spec, np.random.default_rng(7)) for _ in range(2))
    assert [(r.arrival_s, r.prompt_tokens, r.prefix_ids) for r in a] == [(r.arrival_s, r.prompt_tokens, r.prefix_ids)
                                                                         for r in b]
    firsts = {}
    for r in a:
        firsts.setdefault(r.prefix_ids[0], 0)
        firsts[r.prefix_ids[0]] += 1
    counts = sorted(firsts.values(), reverse=True)
    assert len(counts) <= 20 and counts[0] > 3 * counts[-1]  # Zipf: the top prompt dominates


@pytest.mark.parametrize("change,match", [({"session_rate": 0.0}, "session_rate"), ({"agent_share": 2.0}, "agent_share"),
                                          ({"sessions": 0}, "sessions")])
def test_bad_sessions_parameters_name_themselves(change, match):
    with pytest.raises(ConfigError, match=match):
        SessionsSpec(**change).check()


def test_yaml_kind_sessions_and_its_keys():
    exp = experiment_from_dict({"workload": {"kind": "sessions", "sessions": 10, "think_s": 2, "requests": 15}})
    assert exp.workload.sessions.sessions == 10 and exp.workload.sessions.think_s == 2.0
    assert len(exp.workload.load(0)) == 15
    with pytest.raises(ConfigError, match="workload.thinks: unknown key"):
        experiment_from_dict({"workload": {"kind": "sessions", "thinks": 2}})
    with pytest.raises(ConfigError, match="workload.kind"):
        experiment_from_dict({"workload": {"kind": "chat"}})


def test_cli_sessions_flags_and_prefix_caching_switch(tmp_path):
    base = ("simulate", "--workload", "sessions", "--sessions", "30", "--turns-mean", "4", "--mixed", "2",
            "--policy", "least-loaded", "--quiet", "--json")
    on = baton(*base, "--out", str(tmp_path / "on"))
    off = baton(*base, "--no-enable-prefix-caching", "--out", str(tmp_path / "off"))
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    s_on, s_off = (next(iter(json.loads(p.stdout).values())) for p in (on, off))
    assert s_on["requests"] == s_off["requests"] > 30
    assert s_on["prefix_cache_hit_rate"] > 0.3 and s_off["prefix_cache_hit_rate"] is None
    assert s_on["p50_ttft_s"] < s_off["p50_ttft_s"]
    bad = baton("simulate", "--think-s", "3", "--quiet", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "add --workload sessions" in bad.stderr


def test_mooncake_hash_ids_are_kept_and_bad_ones_named(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
                 '{"timestamp": 10, "input_length": 700, "output_length": 5, "hash_ids": [0, 2]}\n')
    a, b = load_trace(f)
    assert (a.prefix_ids, a.prefix_block_tokens) == ((0, 1), 512)
    assert block_keys(a, 16)[:32] == block_keys(b, 16)[:32] and block_keys(a, 16)[32] != block_keys(b, 16)[32]
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": ["x"]}\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl:1: hash_ids"):
        load_trace(f)


def test_workload_stats_reports_the_reuse_a_trace_offers(tmp_path):
    f = tmp_path / "m.jsonl"
    rows = [{"timestamp": i * 1000, "input_length": 1024, "output_length": 5, "hash_ids": [0, i + 1]} for i in range(4)]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    p = baton("workload", "stats", str(f), "--json", "--cache-tokens", "100000", "--out", str(tmp_path / "o"))
    stats = json.loads(p.stdout)["m.jsonl"]
    assert stats["prefix_reuse_share"] == pytest.approx(3 * 32 / (4 * 64))  # the first 512 tokens, after the first
    assert stats["reuse_cache_tokens"] == 100000


def test_jsonl_prompts_as_text_or_token_ids_carry_prefix_identity(tmp_path):
    f = tmp_path / "p.jsonl"
    system = "You are terse. " * 20
    rows = [{"timestamp": 0, "prompt": system + "Hi", "output_tokens": 4},
            {"timestamp": 500, "prompt": system + "Bye", "output_tokens": 4},
            {"timestamp": 900, "prompt_token_ids": list(range(40)), "output_tokens": 2},
            {"timestamp": 950, "prompt_token_ids": list(range(32)) + [7] * 9, "output_tokens": 2}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a, b, c, d = load_trace(f)
    assert a.prompt_tokens == -(-len(system + "Hi") // 4) and c.prompt_tokens == 40
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    assert ka[:4] == kb[:4]  # 300 shared characters: four 64-character blocks
    assert block_keys(c, 16)[:2] == block_keys(d, 16)[:2] and block_keys(c, 16)[2:] != block_keys(d, 16)[2:]
    f.write_text('{"timestamp": 0, "prompt_token_ids": [1, "x"], "output_tokens": 2}\n')
    with pytest.raises(WorkloadError, match="p.jsonl:1: prompt_token_ids"):
        load_trace(f)


def test_a_context_too_small_for_any_turn_is_an_error_not_an_empty_workload():
    with pytest.raises(WorkloadError, match="workload.max_context"):
        generate_sessions(SessionsSpec(max_context=10), np.random.default_rng(0))


def test_a_stated_prompt_length_wins_over_the_text_and_non_ascii_text_shares_by_characters(tmp_path):
    f = tmp_path / "p.jsonl"
    common = "東京" * 50  # 100 characters: 25 estimated tokens, one 64-character id in common
    rows = [{"timestamp": 0, "input_length": 1000, "prompt": "short text", "output_length": 5},
            {"timestamp": 1, "prompt": common + "ああ" * 30, "output_length": 5},
            {"timestamp": 2, "prompt": common + "いい" * 30, "output_length": 5}]
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    a, b, c = load_trace(f)
    assert a.prompt_tokens == 1000 and a.prefix_ids
    assert b.prefix_ids[0] == c.prefix_ids[0] and b.prefix_ids[1] != c.prefix_ids[1]
    assert len(b.prefix_ids) == -(-160 // 64)
