"""Models from a Hugging Face config.json (fixtures written from the published configs):
the shapes, parameter counts and MoE/MLA terms come out right, the ``hf:PATH@GPU:tpN``
route reproduces the shipped presets, and every bad input is a one-line ConfigError."""

import dataclasses
import json
from pathlib import Path

import pytest

from baton.core.errors import ConfigError
from baton.perf import BatchShape, build, chunk_attn_pairs
from baton.perf.hardware import HARDWARE
from baton.perf.hf_config import model_from_hf_config
from baton.perf.presets import MODELS, PRESETS, model_route, parse_model_route
from baton.perf.roofline import RooflineModel

FIXTURES = Path(__file__).parent / "fixtures"
SHAPES = [BatchShape(prefill_tokens=512, prefill_attn_pairs=chunk_attn_pairs(512, 3072)),
          BatchShape(prefill_tokens=4096, prefill_attn_pairs=chunk_attn_pairs(4096, 0)),
          BatchShape(n_decodes=1, decode_ctx_tokens=1000),
          BatchShape(n_decodes=64, decode_ctx_tokens=64 * 2000, decode_ctx_cv2=0.3),
          BatchShape(prefill_tokens=256, prefill_attn_pairs=chunk_attn_pairs(256, 0), n_decodes=32,
                     decode_ctx_tokens=32 * 700)]


def route(name: str, gpu: str, tp: int = 1) -> str:
    return model_route(str(FIXTURES / name / "config.json"), gpu, tp)


@pytest.mark.parametrize("preset, fixture", [("llama-2-70b-tp2@a100-80g", "llama-2-70b"),
                                             ("llama-3.1-8b@a100-80g", "llama-3.1-8b")])
def test_the_route_reproduces_the_shipped_preset(preset, fixture):
    """Same shapes, efficiencies and GPU: the iteration times match the preset's to the
    parameter count's rounding (the preset keeps the model card's 68.98e9 / 8.03e9; the
    config gives the exact count), and exactly once that count is the card's."""
    p = PRESETS[preset]
    named, routed = p.build(), build(route(fixture, p.hardware, p.tp))
    spec, card = routed.model, MODELS[p.model]
    assert spec.params == pytest.approx(card.params, rel=1e-4)
    same = dataclasses.replace(spec, name=card.name, params=card.params, compute_dtype=None)
    assert same == card and routed.eff == named.eff and routed.hardware == named.hardware
    exact = RooflineModel(dataclasses.replace(spec, params=card.params), routed.hardware, p.tp, routed.eff)
    for shape in SHAPES:
        assert exact.iteration_time_s(shape) == named.iteration_time_s(shape)
        assert routed.iteration_time_s(shape) == pytest.approx(named.iteration_time_s(shape), rel=1e-4)
    assert exact.prefill_time_s(3000, 512) == named.prefill_time_s(3000, 512)
    assert routed.kv_capacity_tokens == pytest.approx(named.kv_capacity_tokens, rel=1e-3)


@pytest.mark.parametrize("fixture, params", [("codellama-34b", 33.7e9), ("qwen3-0.6b", 0.596e9),
                                             ("mixtral-8x7b", 46.7e9), ("deepseek-v2-lite", 15.7e9)])
def test_parameter_counts_match_the_model_cards(fixture, params):
    assert model_from_hf_config(FIXTURES / fixture).params == pytest.approx(params, rel=0.002)


def test_gqa_explicit_head_dim_and_tied_embeddings():
    code = model_from_hf_config(FIXTURES / "codellama-34b" / "config.json")
    assert (code.name, code.n_layers, code.n_kv_heads, code.head_dim, code.max_model_len) == \
        ("codellama-34b", 48, 8, 128, 16384)
    assert code.kv_bytes_per_token == 48 * 2 * 8 * 128 * 2
    qwen = model_from_hf_config(FIXTURES / "qwen3-0.6b")
    assert qwen.head_dim == 128 != qwen.hidden // qwen.n_heads and qwen.tie_word_embeddings
    assert qwen.matmul_params == qwen.params  # the tied LM head is a matmul too


def test_moe_and_mla():
    ds = model_from_hf_config(FIXTURES / "deepseek-v2-lite")
    card = MODELS["deepseek-v2-lite"]
    assert ds.moe == card.moe and ds.kv_elems_per_layer == 512 + 64 and ds.head_dim == 192
    assert ds.kv_bytes_per_token == card.kv_bytes_per_token
    mix = model_from_hf_config(FIXTURES / "mixtral-8x7b")
    assert (mix.moe.layers, mix.moe.routed, mix.moe.top_k, mix.moe.shared, mix.moe.expert_ffn) == \
        (32, 8, 2, 0, 14336)
    assert mix.matmul_params + mix.vocab * mix.hidden == pytest.approx(12.9e9, rel=0.005)  # active


def write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def llama(**extra) -> dict:
    return {**json.loads((FIXTURES / "llama-3.1-8b" / "config.json").read_text()), **extra}


def test_text_config_and_shared_expert_width(tmp_path):
    nested = model_from_hf_config(write(tmp_path, {"model_type": "llava", "torch_dtype": "bfloat16",
                                                   "text_config": llama()}))
    assert nested.params == model_from_hf_config(FIXTURES / "llama-3.1-8b").params
    qmoe = llama(model_type="qwen2_moe", num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                 shared_expert_intermediate_size=5632, decoder_sparse_step=2, mlp_only_layers=[1])
    spec = model_from_hf_config(write(tmp_path, qmoe, "qmoe.json"))
    assert spec.moe.shared == 4 and spec.moe.layers == 15 and spec.name == "qmoe"


def test_quantized_weights_and_the_dtypes_flops(tmp_path):
    fp8 = model_from_hf_config(write(tmp_path, llama(quantization_config={"quant_method": "fp8"})))
    assert fp8.weight_bytes_per_param == 1.0 and fp8.compute_dtype == "fp8" and fp8.kv_bytes_per_elem == 2
    w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}}}
    int8 = model_from_hf_config(write(tmp_path, llama(quantization_config=w8a8), "w8a8.json"))
    awq = model_from_hf_config(write(tmp_path, llama(quantization_config={"quant_method": "awq", "bits": 4}),
                                     "awq.json"))
    assert (int8.compute_dtype, awq.weight_bytes_per_param, awq.compute_dtype) == ("int8", 0.5, "bf16")
    gpu = HARDWARE["rtx4090d"]
    assert gpu.flops_for("int8") == gpu.peak_flops == 297e12  # the ARES preset's INT8 rate
    assert gpu.flops_for("bf16") == 147e12  # a BF16 model no longer gets the INT8 rate
    bf16 = model_from_hf_config(FIXTURES / "llama-3.1-8b")
    shape = BatchShape(prefill_tokens=2048, prefill_attn_pairs=chunk_attn_pairs(2048, 0))
    slow, fast = (RooflineModel(m, gpu).iteration_time_s(shape) for m in (bf16, int8))
    assert slow > 1.8 * fast


def test_new_gpus():
    h100, h200, l40s = HARDWARE["h100"], HARDWARE["h200"], HARDWARE["l40s"]
    assert h200.peak_flops == h100.peak_flops and h200.hbm_bytes_per_s == 4.8e12
    assert h200.allreduce_latency_s == h100.allreduce_latency_s and h200.hbm_bytes > 140e9
    assert HARDWARE["a100-40g"].hbm_bytes == 40960 * 2**20
    assert build(route("llama-3.1-8b", "h200", 2)).iteration_time_s(SHAPES[3]) > 0
    with pytest.raises(ConfigError, match="l40s: no measured all-reduce latency for tensor parallelism 2"):
        build(route("llama-3.1-8b", "l40s", 2))


@pytest.mark.parametrize("data, message", [
    ({"hidden_size": 4096}, "missing key 'num_hidden_layers'"),
    ({**llama(), "num_attention_heads": "32"}, "num_attention_heads: expected a positive integer"),
    ({**llama(), "torch_dtype": "int4"}, "torch_dtype: expected one of"),
    ({**llama(), "quantization_config": {"quant_method": "hqq"}}, "'hqq' is not supported"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_configs_name_the_file_and_key(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=message) as err:
        model_from_hf_config(path)
    assert str(path) in str(err.value)


def test_route_syntax_and_errors(tmp_path):
    assert parse_model_route("hf:/m/a@b/config.json@h100:tp4") == ("/m/a@b/config.json", "h100", 4)
    assert parse_model_route("hf:/m/config.json@h100") == ("/m/config.json", "h100", 1)
    for bad, message in (("hf:/m/config.json", "expected hf:PATH@GPU"), ("hf:/m@h100:4", "expected hf:PATH@GPU"),
                         ("hf:/m@a100-8g", "did you mean 'a100-80g'"), ("hf:/m@h100:tp0", "tp: expected a positive"),
                         (f"hf:{tmp_path}/none.json@h100", "no such model config.json")):
        with pytest.raises(ConfigError, match=message):
            build(bad)
    with pytest.raises(ConfigError, match="--model PATH/config.json --gpu NAME"):
        build("llama-9@h100")
    assert all(p.source for p in PRESETS.values())
