"""The emulator counts prompts with a real tokenizer when given one (guidellm's 128-token
prompts then read as 128, not as their whitespace words), and by words otherwise."""

import pytest

from tests.live import post, servers, start_emulator

PROMPT = "Hello, world! It's a test-case."  # 5 whitespace words; more tokens with punctuation split


def _tokenizer(folder):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = ["[UNK]", "Hello", ",", "world", "!", "It", "'", "s", "a", "test", "-", "case", "."]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()  # splits punctuation off, as BPE vocabularies do
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return len(tok.encode(PROMPT, add_special_tokens=False).ids)


def test_prompt_tokens_follow_the_configured_tokenizer(tmp_path):
    n_tokens = _tokenizer(tmp_path / "tok")
    plain, tokenized = start_emulator(tmp_path), start_emulator(tmp_path, "--tokenizer", str(tmp_path / "tok"))
    with servers(plain, tokenized):
        counts = [post(e.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[1]["usage"]["prompt_tokens"]
                  for e in (plain, tokenized)]
    assert counts == [5, n_tokens] and n_tokens == 12


def test_a_bad_tokenizer_path_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "baton.cli.main", "emulate", "--tokenizer", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no tokenizer.json" in p.stderr and "Traceback" not in p.stderr
