"""The length-predictor data pipeline's torch-free parts: prompts (a ShareGPT file cut
short), resumable generation records, hidden-state sample positions and shards."""

import json

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.learn import generate, prompts
from baton.learn.hidden import ShardIndex, _write_shard, sample_positions


def test_a_sharegpt_file_cut_short_yields_every_complete_conversation(tmp_path):
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
             for i in range(5)]
    text = json.dumps(convs)
    cut = text[: text.index('"q4"')]  # the file ends inside the fifth conversation
    (tmp_path / "sg.json").write_text(cut)
    assert [c["id"] for c in prompts.sharegpt_conversations(tmp_path / "sg.json")] == ["0", "1", "2", "3"]
    assert prompts.sharegpt(tmp_path / "sg.json", limit=2) == [("sharegpt:0", "q0"), ("sharegpt:1", "q1")]
    (tmp_path / "no.json").write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="not a JSON list"):
        prompts.sharegpt_conversations(tmp_path / "no.json")


def test_sharegpt_prompts_skip_conversations_that_do_not_start_with_a_human_turn(tmp_path):
    convs = [{"conversations": [{"from": "gpt", "value": "hello"}]},
             {"conversations": [{"from": "human", "value": "x" * (prompts.MAX_PROMPT_CHARS + 1)}]},
             {"conversations": [{"from": "human", "value": "ok"}]}]
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    assert prompts.sharegpt(tmp_path / "sg.json") == [("sharegpt:2", "ok")]


def test_alpaca_prompts_join_instruction_and_input_and_reject_bad_items(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "Sum", "input": "1 2"}, {"instruction": "Hi"}]))
    assert prompts.alpaca(tmp_path / "a.json") == [("alpaca:0", "Sum\n\n1 2"), ("alpaca:1", "Hi")]
    (tmp_path / "b.json").write_text(json.dumps([{"input": "x"}]))
    with pytest.raises(ConfigError, match="item 0"):
        prompts.alpaca(tmp_path / "b.json")


def test_prompt_sets_are_seeded_and_steered_in_the_asked_share():
    source = [(f"s:{i}", f"p{i}") for i in range(2000)]
    a = prompts.build([source], [1000], steer_share=0.4, seed=1)
    assert a == prompts.build([source], [1000], steer_share=0.4, seed=1)
    steers = [p.steer for p in a]
    assert 0.15 < steers.count("short") / 1000 < 0.25 and 0.15 < steers.count("long") / 1000 < 0.25
    assert all(p.text.endswith(prompts.STEERS[p.steer]) for p in a)
    assert len({p.id for p in a}) == 1000
    with pytest.raises(ConfigError, match="asked for"):
        prompts.build([source[:3]], [4], 0.0, 0)


def test_generation_records_resume_past_a_torn_last_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"id": "a:1", "prompt_ids": [1], "output_ids": [2, 3]}) + "\n" + '{"id": "a:2", "pro')
    assert generate.done_ids(path) == {"a:1"}
    assert [r["id"] for r in generate.read_records(path)] == ["a:1"]


def test_samples_are_the_states_that_predict_each_kth_token():
    positions, generated = sample_positions(prompt_tokens=10, output_tokens=40, every_tokens=16)
    # the state at position P - 1 + g has seen the prompt and g generated tokens
    assert generated.tolist() == [0, 16, 32] and positions.tolist() == [9, 25, 41]


def test_shards_round_trip_through_the_index(tmp_path):
    index = ShardIndex(tmp_path)
    for k in range(2):
        rows = [{"id": f"r{k}", "last": np.full((2, 3), k, np.float16), "first": np.zeros((2, 3), np.float16),
                 "request": np.array([f"r{k}"] * 2), "generated": np.array([0, 16]), "remaining": np.array([20, 4]),
                 "prompt_tokens": np.array([5, 5])}]
        _write_shard(index, rows)
    again = ShardIndex(tmp_path)
    assert again.requests() == {"r0", "r1"}
    data = again.load()
    assert data["last"].shape == (4, 3) and data["request"].tolist() == ["r0", "r0", "r1", "r1"]
