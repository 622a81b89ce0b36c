"""ShareGPT conversations as the field writes them, the renamed length-list format, BurstGPT's
failed rows, and token counting with a local tokenizer or the documented estimate."""

import json
import math

import pytest

from baton.core.errors import WorkloadError
from baton.workload import detect_format, load_trace
from baton.workload.tokens import EstimatedTokens, token_counter

CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "What is the capital of France?"},
                                  {"from": "gpt", "value": "Paris is the capital of France."},
                                  {"from": "human", "value": "And of Spain?"}]},
    {"id": "b", "conversations": [{"from": "human", "value": "hello"}]},                 # one turn: skipped
    {"id": "c", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},  # empty
    {"id": "d", "conversations": [{"from": "human", "value": "Write a haiku about the sea"},
                                  {"from": "gpt", "value": "Waves fold into foam / salt wind carries gull voices "
                                                           "/ the tide keeps its time"}]},
]


def _write(tmp_path, data, name="sg.json"):
    f = tmp_path / name
    f.write_text(json.dumps(data))
    return f


def test_conversations_are_detected_and_read_as_first_two_turns(tmp_path):
    f = _write(tmp_path, CONVERSATIONS)
    assert detect_format(f) == "sharegpt"
    with pytest.raises(WorkloadError, match="no arrival times"):
        load_trace(f)  # ShareGPT has no timestamps: never all at t=0
    notes: list[str] = []
    reqs = load_trace(f, arrivals="uniform:1", notes=notes)
    first, last = CONVERSATIONS[0]["conversations"], CONVERSATIONS[3]["conversations"]
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (math.ceil(len(first[0]["value"]) / 4), math.ceil(len(first[1]["value"]) / 4)),
        (math.ceil(len(last[0]["value"]) / 4), math.ceil(len(last[1]["value"]) / 4))]
    assert len(notes) == 1 and "2 ShareGPT conversations" in notes[0] and "2 skipped" in notes[0]
    assert "4 characters per token" in notes[0]


def test_a_real_tokenizer_counts_tokens(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted({w for c in CONVERSATIONS for t in c["conversations"] for w in t["value"].split()})
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    notes: list[str] = []
    reqs = load_trace(_write(tmp_path, CONVERSATIONS), arrivals="uniform:1", tokenizer=str(folder), notes=notes)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(6, 6), (6, 16)]
    assert "tokenizer" in notes[0] and "model" in notes[0]


def test_bad_tokenizer_paths_name_the_problem(tmp_path):
    with pytest.raises(WorkloadError, match="no tokenizer.json"):
        token_counter(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    pytest.importorskip("tokenizers")
    with pytest.raises(WorkloadError, match="not a tokenizer.json"):
        token_counter(bad)


def test_estimate_is_four_characters_per_token():
    assert EstimatedTokens().count(["", "abcd", "abcde", "x" * 400]) == [0, 1, 2, 100]


def test_length_lists_are_json_lengths_and_sharegpt_refuses_them_with_a_hint(tmp_path):
    f = _write(tmp_path, [{"input_len": 12, "output_len": 3}], "lengths.json")
    assert detect_format(f) == "json-lengths"
    assert load_trace(f, arrivals="uniform:1")[0].prompt_tokens == 12
    with pytest.raises(WorkloadError, match=r"item 0: .*conversations.*--format json-lengths"):
        load_trace(f, fmt="sharegpt", arrivals="uniform:1")


@pytest.mark.parametrize("item,where", [
    ("text", "item 0: expected an object"),
    ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]}, "item 0 turn 0"),
    ({"conversations": ["hi", "there"]}, "item 0 turn 0"),
])
def test_malformed_conversations_name_the_item(tmp_path, item, where):
    with pytest.raises(WorkloadError, match=where):
        load_trace(_write(tmp_path, [item]), fmt="sharegpt", arrivals="uniform:1")


def test_sharegpt_with_no_usable_conversation_is_an_error(tmp_path):
    with pytest.raises(WorkloadError, match="no conversation has two non-empty turns"):
        load_trace(_write(tmp_path, [CONVERSATIONS[1]]), arrivals="uniform:1")


def test_burstgpt_failed_rows_are_dropped_and_counted(tmp_path):
    f = tmp_path / "b.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,100,20,120,Conversation log\n6,ChatGPT,50,0,50,Conversation log\n"
                 "7,GPT-4,70,9,79,API log\n")
    notes: list[str] = []
    reqs = load_trace(f, notes=notes)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(100, 20), (70, 9)]
    assert notes == ["b.csv: 1 of 3 BurstGPT rows are failed requests (0 response tokens) and were dropped"]
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,100,0,100,x\n")
    with pytest.raises(WorkloadError, match="every BurstGPT row is a failed request"):
        load_trace(f)


def test_the_cli_prints_the_loader_notes(tmp_path, capsys):
    from baton.cli.main import main

    f = _write(tmp_path, CONVERSATIONS)
    main(["workload", "stats", str(f), "--arrivals", "uniform:1", "--out", str(tmp_path / "out"), "--json"])
    err = capsys.readouterr().err
    assert "note: sg.json: 2 ShareGPT conversations" in err


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_conversations_that_share_a_beginning_share_prefix_blocks(tmp_path, with_tokenizer):
    from baton.core.prefix import block_keys
    system = "You are a careful assistant. " * 12
    data = [{"conversations": [{"from": "human", "value": system + q}, {"from": "gpt", "value": "Sure. " * 20}]}
            for q in ("What is the capital of France?", "Name three prime numbers please.")]
    tokenizer = None
    if with_tokenizer:
        tokenizers = pytest.importorskip("tokenizers")
        words = sorted({w for d in data for t in d["conversations"] for w in t["value"].split()})
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                                               unk_token="[UNK]"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        tokenizer = str(tmp_path / "tokenizer.json")
        tok.save(tokenizer)
    a, b = load_trace(_write(tmp_path, data), arrivals="uniform:1", tokenizer=tokenizer)
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    shared = next(i for i, (x, y) in enumerate(zip(ka, kb)) if x != y)
    assert shared >= 2 and ka[0] == kb[0]  # the common system prompt's blocks, then they differ
