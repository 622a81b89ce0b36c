"""A Vidur trace's engine settings (config.json beside request_metrics.csv): read for the
Sarathi and vLLM scheduler layouts, absent without the file, and each difference from the
simulated engine is one line naming both values and the flag."""

import json

import pytest

from baton.core.errors import WorkloadError
from baton.engine_model.work import EngineConfig
from baton.workload import load_trace, mismatches, source_engine

METRICS = ("Request Id,request_e2e_time,request_inter_arrival_delay,request_num_tokens,"
           "request_num_prefill_tokens,request_num_decode_tokens\n"
           "0,2.3,,352,319,33\n1,7.1,1.5,1113,1011,102\n2,18.9,0.25,2854,2594,260\n")
SARATHI = {"cluster_config": {
    "replica_config": {"model_name": "meta-llama/Llama-2-70b-hf", "tensor_parallel_size": 2, "device": "a100"},
    "replica_scheduler_config": {"name": "sarathi", "batch_size_cap": 128, "chunk_size": 512},
    "cache_config": {"block_size": 16, "num_blocks": None}}}
VLLM = {"cluster_config": {
    "replica_config": {"model_name": "meta-llama/Meta-Llama-3-8B", "tensor_parallel_size": 1},
    "replica_scheduler_config": {"name": "vllm", "batch_size_cap": 64, "max_tokens_in_batch": 4096,
                                 "block_size": 32}}}


def trace(tmp_path, config=None):
    f = tmp_path / "request_metrics.csv"
    f.write_text(METRICS)
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return f


def test_sarathi_chunk_size_is_the_token_budget(tmp_path):
    f = trace(tmp_path, SARATHI)
    src = source_engine(f)  # the format is detected
    assert (src.scheduler, src.max_num_batched_tokens, src.budget_key, src.max_num_seqs, src.block_size) == \
        ("sarathi", 512, "chunk_size", 128, 16)
    assert (src.model, src.tensor_parallel_size, src.device) == ("meta-llama/Llama-2-70b-hf", 2, "a100")
    lines = mismatches(src, EngineConfig())
    assert len(lines) == 2
    assert "max_num_batched_tokens 512 (chunk_size), but the simulated engine uses 8192" in lines[0]
    assert "--max-num-batched-tokens 512" in lines[0] and "cluster.engine.max_num_batched_tokens" in lines[0]
    assert "max_num_seqs 128" in lines[1] and "uses 256" in lines[1] and "--max-num-seqs 128" in lines[1]
    assert len(load_trace(f)) == 3  # the requests are unchanged


def test_vllm_layout_and_a_block_size_in_the_scheduler_config(tmp_path):
    src = source_engine(trace(tmp_path, VLLM), "vidur-metrics")
    assert (src.scheduler, src.max_num_batched_tokens, src.budget_key, src.max_num_seqs, src.block_size) == \
        ("vllm", 4096, "max_tokens_in_batch", 64, 32)
    lines = mismatches(src, EngineConfig(max_num_batched_tokens=4096), "cluster.decode_engine")
    assert len(lines) == 2 and all(line.startswith(f"the trace came from Vidur vllm scheduler ({src.file})")
                                   for line in lines)
    assert "--block-size 32" in lines[1] and "cluster.decode_engine.block_size" in lines[1]


def test_matching_settings_and_no_config_json_say_nothing(tmp_path):
    assert mismatches(source_engine(trace(tmp_path, SARATHI)), EngineConfig(512, 128, 16)) == []
    (tmp_path / "config.json").unlink()
    assert source_engine(trace(tmp_path)) is None


def test_other_files_and_formats_are_not_a_source_engine(tmp_path):
    f = trace(tmp_path, {"name": "something else"})
    assert source_engine(f) is None
    (tmp_path / "config.json").write_text(json.dumps(SARATHI))
    v = tmp_path / "v.csv"
    v.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,319,33\n")
    assert source_engine(v) is None  # --format vidur: a request list, not a run's output


@pytest.mark.parametrize("config, message", [("{oops", "invalid JSON"),
                                             ({"cluster_config": {"replica_scheduler_config": {"chunk_size": 0}}},
                                              "chunk_size: expected a positive integer")])
def test_a_broken_config_json_is_a_one_line_error(tmp_path, config, message):
    with pytest.raises(WorkloadError, match=message):
        source_engine(trace(tmp_path, config))


def _with_memory(config, **model):
    """SARATHI plus what Vidur's memory planner reads (Llama-2-70B's shapes by default)."""
    c = json.loads(json.dumps(config))
    c["cluster_config"]["replica_config"].update(
        num_pipeline_stages=1, device_config={"total_memory_gb": 80},
        model_config={"num_layers": 80, "num_q_heads": 64, "num_kv_heads": 8, "embedding_dim": 8192,
                      "mlp_hidden_dim": 28672, "use_gated_mlp": True, **model})
    c["cluster_config"]["cache_config"]["memory_margin_fraction"] = 0.1
    c["request_generator_config"] = {"max_tokens": 4096}
    return c


def test_vidurs_kv_capacity_is_rederived_and_compared(tmp_path):
    """Vidur's planner: 54,067 tokens fit beside the weights, kept as 13 whole 4,096-token
    slots = 53,248 tokens (the figure Vidur's own runs report for Llama-2-70B TP2)."""
    src = source_engine(trace(tmp_path, _with_memory(SARATHI)))
    assert src.kv_tokens == 53_248
    lines = mismatches(src, EngineConfig(512, 128, 16))
    assert len(lines) == 1 and "53248 KV tokens" in lines[0] and "--kv-tokens 53248" in lines[0]
    assert mismatches(src, EngineConfig(512, 128, 16, kv_tokens=53_248)) == []
    bigger = _with_memory(SARATHI)
    bigger["request_generator_config"]["max_tokens"] = 2048  # 26 slots of 2,048
    assert source_engine(trace(tmp_path, bigger)).kv_tokens == 26 * 2048
    partial = _with_memory(SARATHI)
    del partial["cluster_config"]["replica_config"]["model_config"]["mlp_hidden_dim"]
    assert source_engine(trace(tmp_path, partial)).kv_tokens is None  # not enough to redo it
