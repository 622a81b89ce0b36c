"""Counting the tokens of a text: a local Hugging Face tokenizer when one is given, else a
documented estimate.

A tokenizer is a ``tokenizer.json`` (the fast-tokenizer file every Hugging Face model folder
carries), given as the file or its folder, read with the ``tokenizers`` package (``pip
install -e '.[tokenizer]'``); nothing is downloaded. Without one, a text counts as
``ceil(characters / 4)`` tokens: OpenAI's rule of thumb for English, which Llama-family
BPE vocabularies also land near on prose (code and non-English text run higher).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from baton.core.errors import WorkloadError

CHARS_PER_TOKEN = 4.0


class TokenCounter(Protocol):
    """Counts tokens of texts (no special tokens added)."""

    name: str

    def count(self, texts: Sequence[str]) -> list[int]: ...

    def sequences(self, prompts: Sequence[str], outputs: Sequence[str]) -> list[TextSequence]: ...


ID_BLOCK_TOKENS = 16  # tokens per prefix id of a text trace (vLLM's default block size)


@dataclass(frozen=True, slots=True)
class TextSequence:
    """A prompt and its answer as token counts, with one prefix id per ``ID_BLOCK_TOKENS``
    tokens of the two together (``Request.prefix_ids``)."""

    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...]


def token_prefix_ids(token_ids: Sequence[int]) -> tuple[int, ...]:
    """One prefix id per ``ID_BLOCK_TOKENS`` token ids (the last block may be partial)."""
    return tuple(hash(tuple(token_ids[i:i + ID_BLOCK_TOKENS])) for i in range(0, len(token_ids), ID_BLOCK_TOKENS))


def _stable_hash(data: bytes) -> int:
    """A hash that is the same in every process (``hash`` of a str is salted per run)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


@dataclass(frozen=True, slots=True)
class EstimatedTokens:
    """``ceil(len(text) / chars_per_token)`` tokens per text; an empty text has none."""

    chars_per_token: float = CHARS_PER_TOKEN
    name: str = "estimate (4 characters per token)"

    def count(self, texts: Sequence[str]) -> list[int]:
        return [math.ceil(len(t) / self.chars_per_token) for t in texts]

    def sequences(self, prompts: Sequence[str], outputs: Sequence[str]) -> list[TextSequence]:
        """Prefix ids from the text itself, one per ``ID_BLOCK_TOKENS`` x 4 characters."""
        step = int(ID_BLOCK_TOKENS * self.chars_per_token)  # characters per id, as tokens are counted
        out = []
        for p, o, n_p, n_o in zip(prompts, outputs, self.count(prompts), self.count(outputs)):
            text = p + o
            out.append(TextSequence(n_p, n_o, tuple(_stable_hash(text[i:i + step].encode())
                                                    for i in range(0, len(text), step))))
        return out


class HFTokenizer:
    """A Hugging Face fast tokenizer read from a local ``tokenizer.json``."""

    def __init__(self, path: str | Path):
        file = Path(path).expanduser()
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise WorkloadError(f"--tokenizer: no tokenizer.json at {file} (give the file or its model folder)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise WorkloadError("--tokenizer needs the tokenizers package: pip install -e '.[tokenizer]'") from None
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception on a bad file
            raise WorkloadError(f"--tokenizer: {file} is not a tokenizer.json the tokenizers package reads: "
                                f"{str(exc).splitlines()[0][:200]}") from None
        self.name = f"tokenizer {file}"

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def sequences(self, prompts: Sequence[str], outputs: Sequence[str]) -> list[TextSequence]:
        """Prefix ids from the token ids, one per ``ID_BLOCK_TOKENS`` tokens of prompt + answer."""
        enc = self._tok.encode_batch(list(prompts) + list(outputs), add_special_tokens=False)
        n = len(prompts)
        out = []
        for p, o in zip(enc[:n], enc[n:]):
            out.append(TextSequence(len(p.ids), len(o.ids), token_prefix_ids(list(p.ids) + list(o.ids))))
        return out

    def ids(self, text: str, special: bool = False) -> list[int]:
        """Token ids of one text, with the tokenizer's special tokens (a BOS) if ``special``
        (as vLLM's completions endpoint encodes a prompt by default)."""
        return list(self._tok.encode(text, add_special_tokens=special).ids)


def token_counter(path: str | Path | None) -> TokenCounter:
    """The tokenizer at ``path``, or the estimate when ``path`` is None."""
    return EstimatedTokens() if path is None else HFTokenizer(path)
