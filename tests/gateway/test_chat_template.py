"""Chat prompts keyed as the engine renders them (first hour, item 3): the model's template
rendered with transformers' Jinja settings, the text tokenized as vLLM's chat endpoint does."""

import json

import pytest

from baton.core.prefix import token_block_keys
from baton.gateway.chat_template import ChatTemplate

pytest.importorskip("jinja2")

# a ChatML-style template of our own, with the features real ones use: a default system
# message, bos_token, tools through tojson, trim, loop controls and the generation tag
TEMPLATE = (
    "{{ bos_token }}{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nBe kind.<|im_end|>\n"
    "{% endif %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}{% endgeneration %}"
    "{% else %}{{ m['content'] | trim }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PARTS = "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}"


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    return tmp_path


@pytest.mark.parametrize("body, text", [
    ({"messages": [{"role": "user", "content": " hi "}]},
     "<s><|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
                   {"role": "assistant", "content": "a"}, {"role": "skip", "content": "x"}],
      "add_generation_prompt": False},
     "<s><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}],
      "tools": [{"name": "f", "description": "<b> & é"}]},
     '<s><tools>{"name": "f", "description": "<b> & é"}</tools>\n<|im_start|>system\nBe kind.<|im_end|>\n'
     "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n"),
    ({"messages": [{"role": "developer", "content": "D"}, {"role": "user", "content": "u"},
                   {"role": "system", "content": "S"}]},
     "<s><|im_start|>system\nD\n\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"),
])
def test_a_chat_renders_as_the_engine_renders_it(folder, body, text):
    assert ChatTemplate.beside(folder).render(body) == text


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
     "continue_final_message": True},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": []},
])
def test_what_the_engine_would_render_differently_is_not_keyed(folder, body):
    assert ChatTemplate.beside(folder).render(body) is None


def test_templates_over_content_parts_and_raising_templates_are_not_keyed(folder):
    assert ChatTemplate(PARTS).render({"messages": [{"role": "user", "content": "x"}]}) is None
    refuses = ChatTemplate("{{ raise_exception('no tools here') if tools else 'ok' }}")
    assert refuses.render({"messages": [{"role": "user", "content": "x"}]}) == "ok"
    assert refuses.render({"messages": [{"role": "user", "content": "x"}], "tools": [{}]}) is None


def test_the_template_file_beside_the_tokenizer_wins_and_a_named_one_is_read(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert ChatTemplate.beside(tmp_path / "tokenizer.json").render({"messages": [{"role": "u", "content": ""}]}) == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert ChatTemplate.beside(tmp_path).source == "J"
    (tmp_path / "mine.jinja").write_text("M")
    assert ChatTemplate.beside(tmp_path, tmp_path / "mine.jinja").source == "M"
    (tmp_path / "bare").mkdir()
    assert ChatTemplate.beside(tmp_path / "bare") is None


def _tokenizer(folder):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = ["[UNK]", "<s>", "<|im_start|>", "<|im_end|>", *(f"w{i}" for i in range(200))]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.add_special_tokens(["<s>", "<|im_start|>", "<|im_end|>"])
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return tok


def test_the_gateway_keys_a_chat_by_the_ids_of_its_rendered_prompt_and_warns_without_a_template(folder, caplog):
    from tests.gateway.test_kv_routing import _gateway
    tok = _tokenizer(folder)
    gw = _gateway(folder, tokenizer=str(folder / "tokenizer.json"))
    body = {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(60))}]}
    ids = tok.encode(ChatTemplate.beside(folder).render(body), add_special_tokens=False).ids
    keys = gw.prompt_keys("chat", body, None)
    assert keys == tuple(token_block_keys(ids, 16)) and len(keys) == len(ids) // 16 >= 4
    assert gw.keying_warning("prefix-precise") is None
    (folder / "tokenizer_config.json").unlink()
    bare = _gateway(folder, tokenizer=str(folder / "tokenizer.json"))
    assert bare.prompt_keys("chat", body, None) == ()
    assert "chat requests are routed by load alone" in bare.keying_warning("prefix-precise")
    assert "no tokenizer is configured" in _gateway(folder).keying_warning("prefix-precise")
    assert _gateway(folder, policy="least-loaded").keying_warning("least-loaded") is None


def test_a_relay_worker_keys_chats_once_control_says_the_policy_keys_prompts(folder):
    """A relay worker starts before it knows the policy (control's first snapshot says
    whether it keys prompts): the chat template must be loaded then, or its chats go
    unkeyed and control's KV index refuses the engine's events about them (found by
    ``make real-vllm WORKERS=2``)."""
    from baton.gateway.config import parse_config
    from baton.gateway.relay import Relay
    tok = _tokenizer(folder)
    config = parse_config({"workers": 2, "tokenizer": str(folder / "tokenizer.json"), "block_size": 16,
                           "engines": [{"name": "a", "url": "http://127.0.0.1:1", "role": "mixed"}]})
    relay = Relay(config, 0, 1, "ipc://unused", "http://127.0.0.1:2")
    body = {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(60))}]}
    assert relay.prompt_keys("chat", body, None) == ()  # not told yet: nothing is keyed
    relay._on_message(["snap", 1, 0.0, True, True, [[0, True, "mixed", False, 0, 0.0]], [], [[0, "m", 4096]]])
    ids = tok.encode(ChatTemplate.beside(folder).render(body), add_special_tokens=False).ids
    assert relay.needs_prefix_keys and relay.prompt_keys("chat", body, None) == tuple(token_block_keys(ids, 16))
    relay.close_parsers()
