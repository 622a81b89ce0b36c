"""A ``ModelSpec`` from a Hugging Face ``config.json``: any gated-MLP decoder (Llama, Mistral,
Qwen 2/3, Mixtral, Qwen-MoE, DeepSeek V2/V3 with MLA) without writing Python.

Keys read: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads`` (default: the heads), ``head_dim`` (default: hidden / heads),
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings``;
a multimodal config's ``text_config`` is read instead of the top level (the vision tower's
weights are not counted). MoE: ``num_local_experts`` / ``num_experts`` /
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size`` (Mixtral: the
``intermediate_size``), ``n_shared_experts`` or ``shared_expert_intermediate_size``, and
which layers are sparse (``first_k_dense_replace`` + ``moe_layer_freq``,
``decoder_sparse_step`` + ``mlp_only_layers``). MLA: ``kv_lora_rank``,
``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``.

Precision: weights are served at 16 bits (vLLM's ``dtype auto``; a float32 checkpoint
runs as float16) unless ``quantization_config`` says otherwise: ``fp8`` (W8A8 FP8),
``compressed-tensors`` (weights' and activations' bits and type), ``awq`` / ``gptq``
(``bits``, 16-bit compute), ``bitsandbytes``. Every weight is counted at the quantized
width (embeddings too: a small overestimate of the savings). The KV cache stays 16-bit.

The parameter count is computed from the shapes (Llama's layout: embeddings, q/k/v/o,
gated MLP, RMSNorms); it reproduces the published totals to within 0.2%.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from baton.core.errors import ConfigError
from baton.perf.specs import ModelSpec, MoESpec

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp16", "half": "fp16", "float": "fp16"}


class _Config:
    """Typed reads of one config mapping; errors name the file and the key."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(self, key: str, default: int | None = None, *, positive: bool = True) -> int:
        """An integer key; required when ``default`` is None."""
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.path}: missing key {key!r} (expected a Hugging Face "
                                  "decoder config.json with Llama-style keys)")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or (positive and value <= 0) or value < 0:
            raise ConfigError(f"{self.path}: {key}: expected a {'positive' if positive else 'non-negative'} "
                              f"integer, got {value!r}")
        return value

    def first(self, *keys: str) -> int | None:
        """The first of ``keys`` present, as a positive integer; None if none is."""
        return next((self.integer(k) for k in keys if self.data.get(k) is not None), None)


def read_hf_config(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parsed file and the mapping the language model's keys live in."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such model config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the model config: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    text = data.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{path}: text_config: expected a JSON object")
    return data, text or data


def _precision(top: dict[str, Any], cfg: _Config) -> tuple[float, str]:
    """(weight bytes per parameter, matmul dtype) from the dtype and quantization keys."""
    quant = cfg.get("quantization_config", top.get("quantization_config"))
    if quant is None:
        name = cfg.get("torch_dtype", cfg.get("dtype", top.get("torch_dtype", top.get("dtype", "bfloat16"))))
        if name not in _DTYPES:
            raise ConfigError(f"{cfg.path}: torch_dtype: expected one of {', '.join(_DTYPES)}, got {name!r}")
        return 2.0, _DTYPES[name]
    if not isinstance(quant, dict):
        raise ConfigError(f"{cfg.path}: quantization_config: expected a JSON object")
    return _quantized(quant, cfg.path)


def _quantized(quant: dict[str, Any], path: Path) -> tuple[float, str]:
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 1.0, "fp8"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = quant.get("bits", quant.get("w_bit"))
        if bits not in (2, 3, 4, 8):
            raise ConfigError(f"{path}: quantization_config.bits: expected 2, 3, 4 or 8, got {bits!r}")
        return bits / 8, "bf16"
    if method == "bitsandbytes":
        return (0.5 if quant.get("load_in_4bit") else 1.0), "bf16"
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        group = next(iter(groups.values()), None) if isinstance(groups, dict) else None
        weights = (group or {}).get("weights") or {}
        bits = weights.get("num_bits")
        if not isinstance(bits, int) or bits not in (4, 8):
            raise ConfigError(f"{path}: quantization_config.config_groups.*.weights.num_bits: "
                              f"expected 4 or 8, got {bits!r}")
        acts = (group or {}).get("input_activations") or {}
        if acts.get("num_bits") == 8:
            return bits / 8, "int8" if acts.get("type", "int") == "int" else "fp8"
        return bits / 8, "bf16"
    raise ConfigError(f"{path}: quantization_config.quant_method: {method or 'missing'!r} is not "
                      "supported (fp8, compressed-tensors, awq, gptq, bitsandbytes)")


def _attention(cfg: _Config, hidden: int, heads: int) -> tuple[float, int, int, int | None]:
    """(weights per layer, KV heads, head dim for attention FLOPs, KV elements per token
    per layer or None) of standard/GQA attention or of MLA."""
    kv_rank = cfg.get("kv_lora_rank")
    if kv_rank is not None:
        rope, nope = cfg.integer("qk_rope_head_dim"), cfg.integer("qk_nope_head_dim")
        v_dim, q_rank = cfg.integer("v_head_dim"), cfg.get("q_lora_rank")
        kv_rank = cfg.integer("kv_lora_rank")
        qk = nope + rope
        q = hidden * heads * qk if q_rank is None else hidden * q_rank + q_rank + q_rank * heads * qk
        kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden, heads, qk, kv_rank + rope
    kv_heads = cfg.integer("num_key_value_heads", heads)
    head_dim = cfg.integer("head_dim", hidden // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    weights = 2 * hidden * q + 2 * hidden * kv
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("attention_bias", False) or model_type in ("qwen2", "qwen2_moe"):
        weights += q + 2 * kv  # Qwen 2 has q/k/v biases without a key that says so
    if model_type in ("qwen3", "qwen3_moe"):
        weights += 2 * head_dim  # q and k RMSNorms
    return weights, kv_heads, head_dim, None


def _moe(cfg: _Config, layers: int, hidden: int, ffn: int) -> tuple[MoESpec | None, float]:
    """The MoE description and the FFN weights of all layers."""
    routed = cfg.first("num_local_experts", "num_experts", "n_routed_experts")
    if routed is None:
        return None, layers * 3.0 * hidden * ffn
    top_k = cfg.integer("num_experts_per_tok")
    expert_ffn = cfg.first("moe_intermediate_size") or ffn
    shared_width = cfg.integer("n_shared_experts", 0, positive=False) * expert_ffn
    shared_width += cfg.integer("shared_expert_intermediate_size", 0, positive=False)
    sparse = _sparse_layers(cfg, layers)
    shared = round(shared_width / expert_ffn)
    moe_layer = hidden * routed + 3.0 * hidden * (routed * expert_ffn + shared_width)
    if cfg.get("shared_expert_intermediate_size"):
        moe_layer += hidden  # Qwen-MoE's shared-expert gate
    weights = sparse * moe_layer + (layers - sparse) * 3.0 * hidden * ffn
    return MoESpec(layers=sparse, routed=routed, top_k=top_k, shared=shared, expert_ffn=expert_ffn), weights


def _sparse_layers(cfg: _Config, layers: int) -> int:
    """How many layers have an MoE FFN (DeepSeek: after the first k dense ones, every
    ``moe_layer_freq``-th; Qwen-MoE: every ``decoder_sparse_step``-th but ``mlp_only_layers``)."""
    dense_first = cfg.integer("first_k_dense_replace", 0, positive=False)
    freq = cfg.integer("moe_layer_freq", 1)
    step = cfg.integer("decoder_sparse_step", 1)
    dense = set(cfg.get("mlp_only_layers", []))
    return sum(1 for i in range(layers)
               if i >= dense_first and (i - dense_first) % freq == 0 and (i + 1) % step == 0 and i not in dense)


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The model a Hugging Face ``config.json`` (or a folder holding one) describes;
    ``name`` defaults to the folder's name. Errors name the file and the key."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    top, text = read_hf_config(file)
    cfg = _Config(text, file)
    layers, hidden, heads = cfg.integer("num_hidden_layers"), cfg.integer("hidden_size"), cfg.integer("num_attention_heads")
    ffn, vocab = cfg.integer("intermediate_size"), cfg.integer("vocab_size")
    attn, kv_heads, head_dim, kv_elems = _attention(cfg, hidden, heads)
    moe, ffn_weights = _moe(cfg, layers, hidden, ffn)
    tied = bool(cfg.get("tie_word_embeddings", top.get("tie_word_embeddings", False)))
    params = layers * (attn + 2 * hidden) + ffn_weights + hidden + vocab * hidden * (1 if tied else 2)
    weight_bytes, dtype = _precision(top, cfg)
    max_len = cfg.data.get("max_position_embeddings")
    name = name or (file.parent.name if file.name == "config.json" and file.parent.name else file.stem)
    return ModelSpec(name, float(params), layers, hidden, heads, kv_heads,
                     head_dim, ffn, vocab, weight_bytes_per_param=weight_bytes,
                     max_model_len=cfg.integer("max_position_embeddings") if max_len is not None else None,
                     moe=moe, kv_elems_per_layer=kv_elems, compute_dtype=dtype, tie_word_embeddings=tied)
