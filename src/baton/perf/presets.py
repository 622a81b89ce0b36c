"""Named model/hardware presets: ``baton.perf.presets.build("llama-3.1-8b@a100-80g")``.

Every number says where it comes from. Sources:

- [spec]    the vendor's datasheet (dense BF16/INT8 tensor FLOP/s, HBM bandwidth);
- [smi]     total memory as ``nvidia-smi`` / ``torch.cuda.mem_get_info`` report it, which is
            what vLLM multiplies by ``gpu_memory_utilization``;
- [hf]      the model's ``config.json`` (layers, widths, heads, vocabulary, parameters);
- [vidur]   Vidur's A100 profiles (``../shared/peers/vidur``): Llama-2-70B TP2 operators
            and the DGX all-reduce, fitted over whole iterations (tests/perf/test_calibration);
- [sibyl]   SIBYL appendix I, Eq. 15 (decode tokens/s of Qwen3-32B on H20 by batch size);
- [ares]    ARES section 5.3 (18.23 ms per decode iteration at 50% KV, R1-Distill-7B W8A8
            on RTX 4090D) and Figure 8 (iteration time linear in batched tokens);
- [cascade] CascadeInfer sections 2.2-2.3 and Figure 2 (Llama-3.2-3B on H100: attention's
            share of an iteration, and the 1.1-2.1x cost of mixed-length batches);
- [none]    no source for this model/GPU: the value is an assumption and says so.

Terms a preset does not set keep ``Efficiency``'s defaults, which are [none]. KV capacity
is not a preset term: it follows from the engine flags (``baton.perf.memory``). GPUs and
their sources are in ``baton.perf.hardware``.

A model without a preset: the route ``hf:PATH@GPU`` or ``hf:PATH@GPU:tpN`` (PATH a Hugging
Face ``config.json`` or its folder, everything between ``hf:`` and the last ``@``; GPU a
name of ``HARDWARE``; N the tensor-parallel degree, default 1) builds a roofline model from
the config (``baton.perf.hf_config``) with the GPU's efficiencies (``ROUTE_EFFICIENCY``).
It is a plain string, so it goes wherever a preset name goes (``--model/--gpu/--tp``, a YAML
``cluster.model`` block, ``run.json``, sweep workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.errors import ConfigError, did_you_mean
from baton.perf.fitted import FittedModel
from baton.perf.hardware import HARDWARE, MiB
from baton.perf.hf_config import model_from_hf_config
from baton.perf.model import PerfModel
from baton.perf.profiled import ProfiledModel
from baton.perf.roofline import RooflineModel
from baton.perf.specs import Efficiency, ModelSpec, MoESpec

__all__ = ["A100_VIDUR", "DEFAULT_PRESET", "HARDWARE", "MODELS", "PRESETS", "PROFILE_PREFIX", "Preset",
           "build", "MiB", "model_route", "parse_model_route", "route_prefix"]

# [hf] parameters, layers, hidden, heads, KV heads, head dim, FFN width, vocabulary, and the
# longest context (config.json's max_position_embeddings: 131,072 for Llama 3.1/3.2 and
# R1-Distill-Qwen-7B, 40,960 for Qwen3-32B, 4,096 for Llama 2)
MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128, 14336, 128256,
                              max_model_len=131072),
    "llama-3.2-3b": ModelSpec("llama-3.2-3b", 3.21e9, 28, 3072, 24, 8, 128, 8192, 128256,
                              max_model_len=131072),
    "qwen3-32b": ModelSpec("qwen3-32b", 32.8e9, 64, 5120, 64, 8, 128, 25600, 151936, max_model_len=40960),
    "deepseek-r1-distill-qwen-7b-w8a8": ModelSpec(
        "deepseek-r1-distill-qwen-7b-w8a8", 7.62e9, 28, 3584, 28, 4, 128, 18944, 152064,
        weight_bytes_per_param=1.0, max_model_len=131072),
    "llama-2-70b": ModelSpec("llama-2-70b", 68.98e9, 80, 8192, 64, 8, 128, 28672, 32000, max_model_len=4096),
    # [hf] DeepSeek-V2-Lite (model card): 15.7B parameters, 2.4B active per token; 27 layers,
    # hidden 2,048, 16 heads of 128 (+64 decoupled RoPE dims: q/k heads of 192); MLA caches
    # a 512-dim latent + 64 RoPE dims per token per layer; every FFN but the first (dense,
    # width 10,944) is MoE: 2 shared + 64 routed experts of width 1,408, 6 routed per token;
    # vocabulary 102,400; 32K context. The counts above rebuild 15.7B total and 2.45B active
    # (tests/perf/test_moe.py).
    "deepseek-v2-lite": ModelSpec("deepseek-v2-lite", 15.7e9, 27, 2048, 16, 16, 192, 10944, 102400,
                                  max_model_len=32768, kv_elems_per_layer=512 + 64,
                                  moe=MoESpec(layers=26, routed=64, top_k=6, shared=2, expert_ffn=1408)),
}

# [vidur] A100 efficiencies, each term fitted to its own operator in Vidur's Llama-2-70B TP2
# profile (benchmarks/calibrate_vidur.py prints the fits and their errors):
# - linear operators (every projection, the MLP, norms, adds) for 1-4,096 tokens: matmuls
#   at 70% of peak on 128-row tiles, an empty row of the last tile costing 0.56 of a full
#   one (the profile steps 28-36% just past each multiple of 128 tokens), weight reads at
#   92% of HBM bandwidth, compute and memory joined by a 1.6-norm (median error 1.8%);
# - decode attention: 24 us per layer, 0.24 us per sequence per layer, KV read at 74% of
#   HBM bandwidth (Vidur's decode profile with its own rounding and 10% batching term);
# - prefill attention (the profile's rows as measured: a chunk after its prior context):
#   21 us per chunk per layer; pairs to earlier context at 39% of peak, the chunk's own
#   causal triangle at 18% (a 512-token chunk at offset 0 measures 0.072 ms per layer, not
#   the 0.02 ms its FLOPs take at the off-diagonal rate). Vidur 0.0.26 looks each chunk up
#   at its context *including* the chunk, so it charges 0.11 ms for that chunk; Baton
#   follows the measurement (README, "Fidelity").
# Vidur models no per-iteration CPU cost, so neither does this.
A100_VIDUR = Efficiency(compute=0.70, memory=0.92, roofline_p=1.6, attn_memory=0.74,
                        attn_compute=0.39, attn_launch_s=24e-6, iteration_overhead_s=0.0,
                        attn_per_seq_s=0.24e-6, prefill_chunk_s=21e-6, attn_diag_compute=0.18,
                        tile_tokens=128, tile_waste=0.56)


# The efficiencies of a model built from its config.json on each GPU: [vidur] on A100 (the
# fractions of peak carried over to the 40 GB part [none]); [none] Efficiency's defaults on
# the others.
ROUTE_EFFICIENCY: dict[str, Efficiency] = {"a100-80g": A100_VIDUR, "a100-40g": A100_VIDUR}
ROUTE_PREFIX = "hf:"
PROFILE_PREFIX = "vidur:"
HOW_TO_ADD = ("add a model with --model PATH/config.json --gpu NAME [--tp N], or in YAML "
              "cluster.model: {config: PATH, gpu: NAME, tp: N} (GPUs: baton list gpus); with Vidur "
              "profiles, --preset vidur:DIR@GPU:tpN or cluster.model: {profile: DIR, gpu: NAME, tp: N}")


@dataclass(slots=True, frozen=True)
class Preset:
    """A model on a GPU type at a tensor-parallel degree, with sourced efficiencies;
    ``source`` says in a few words where the efficiencies come from."""

    model: str
    hardware: str
    tp: int
    efficiency: Efficiency
    source: str = "none"

    def build(self) -> RooflineModel:
        return RooflineModel(MODELS[self.model], HARDWARE[self.hardware], self.tp, self.efficiency)


PRESETS: dict[str, Preset] = {
    # [vidur] the profiled configuration itself
    "llama-2-70b-tp2@a100-80g": Preset("llama-2-70b", "a100-80g", 2, A100_VIDUR,
                                        "vidur: the profiled A100 Llama-2-70B TP2 configuration"),
    # [vidur] the same GPU's efficiencies [none: not profiled at the 8B model's shapes]
    "llama-3.1-8b@a100-80g": Preset("llama-3.1-8b", "a100-80g", 1, A100_VIDUR,
                                     "vidur: A100 efficiencies, not profiled at 8B"),
    # [none] no profile: Efficiency's defaults (H100 stands in for Arrow's H800: same SXM
    # compute and HBM, NVLink cut to 400 GB/s, which only TP > 1 would feel)
    "llama-3.1-8b@h100": Preset("llama-3.1-8b", "h100", 1, Efficiency(), "none: Efficiency defaults"),
    # [none] Arrow's baselines: vLLM colocated at TP 8 and vLLM-disaggregated at TP 4, with
    # the scaled DGX all-reduce above
    "llama-3.1-8b-tp4@h100": Preset("llama-3.1-8b", "h100", 4, Efficiency(),
                                     "none: Efficiency defaults, scaled A100 all-reduce"),
    "llama-3.1-8b-tp8@h100": Preset("llama-3.1-8b", "h100", 8, Efficiency(),
                                     "none: Efficiency defaults, scaled A100 all-reduce"),
    # [cascade] attention's share (81% at 250 x 1k tokens, 14% for one request) pins memory,
    # attn_memory and the launch cost; Figure 2's 1.1-2.1x mixed-length cost pins
    # heterogeneity (the only preset with a source for that term)
    "llama-3.2-3b@h100": Preset("llama-3.2-3b", "h100", 1, Efficiency(
        memory=0.8, attn_memory=0.75, attn_launch_s=12e-6, iteration_overhead_s=0.0,
        heterogeneity=0.4), "cascade: CascadeInfer sections 2.2-2.3 and Figure 2"),
    # [sibyl] compute, memory and attn_memory: least-squares fit of Eq. 15 for N = 8..48 at
    # a 4,000-token decode context (the output-weighted mean context of SIBYL's ShareGPT
    # reasoning workload: prompt 183 + E[O^2] / (2 E[O]) with outputs 5,657 +- 3,317 =
    # 3,984); within 3% there. The fit needs 94% of the datasheet FLOP/s at N = 48, which
    # is implausible: the paper does not say at which context Eq. 15 was profiled.
    # iteration_overhead_s [none]
    "qwen3-32b@h20": Preset("qwen3-32b", "h20", 1, Efficiency(
        compute=0.94, memory=0.92, attn_memory=0.78, iteration_overhead_s=3e-3),
        "sibyl: fit of SIBYL appendix I, Eq. 15"),
    # [ares] 18.23 ms per decode iteration at 50% KV (vLLM's default flags), one figure for
    # one shared weight/KV read efficiency (0.87); Figure 8: iteration time linear in
    # batched tokens, so no heterogeneity term; iteration_overhead_s [none]
    # [hf] the model card's architecture on A100 with [vidur] the A100 efficiencies as they
    # are (not refitted to this model); expert reads from the touched-experts model
    # (MoESpec.touched). Kairos's regime.
    "deepseek-v2-lite@a100-80g": Preset("deepseek-v2-lite", "a100-80g", 1, A100_VIDUR,
                                         "hf+vidur: model card, A100 efficiencies as they are"),
    # the same without the heterogeneity term: what CascadeInfer earns beyond the paper's own
    # Figure 2 (an ablation preset; everything else as llama-3.2-3b@h100)
    "llama-3.2-3b-nohet@h100": Preset("llama-3.2-3b", "h100", 1, Efficiency(
        memory=0.8, attn_memory=0.75, attn_launch_s=12e-6, iteration_overhead_s=0.0, heterogeneity=0.0),
        "cascade: ablation without the heterogeneity term"),
    "deepseek-r1-distill-qwen-7b-w8a8@rtx4090d": Preset(
        "deepseek-r1-distill-qwen-7b-w8a8", "rtx4090d", 1, Efficiency(memory=0.87, attn_memory=0.87),
        "ares: ARES section 5.3 and Figure 8"),
}

DEFAULT_PRESET = "llama-3.1-8b@a100-80g"


def model_route(config: str, gpu: str, tp: int = 1, prefix: str = ROUTE_PREFIX) -> str:
    """The preset string of a model's ``config.json`` (an absolute path, or relative to
    where baton runs) on ``tp`` GPUs of type ``gpu``: ``hf:PATH@GPU:tpN``; with ``prefix``
    ``vidur:``, PATH is a folder of Vidur profiles and the model's config.json."""
    if gpu not in HARDWARE:
        raise ConfigError(f"gpu: unknown GPU {gpu!r}{did_you_mean(gpu, HARDWARE)}; known GPUs: "
                          f"{', '.join(sorted(HARDWARE))}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tp: expected a positive integer, got {tp!r}")
    return f"{prefix}{config}@{gpu}:tp{tp}"


def route_prefix(name: str) -> str | None:
    """``hf:`` or ``vidur:`` when ``name`` is such a route, else None."""
    return next((p for p in (ROUTE_PREFIX, PROFILE_PREFIX) if name.startswith(p)), None)


def parse_model_route(name: str) -> tuple[str, str, int]:
    """(path, GPU, tensor-parallel degree) of ``hf:PATH@GPU[:tpN]`` or ``vidur:DIR@GPU[:tpN]``."""
    prefix = route_prefix(name) or ROUTE_PREFIX
    body = name[len(prefix):]
    path, at, target = body.rpartition("@")
    gpu, _, tp_text = target.partition(":")
    if not at or not path or not gpu or (tp_text and not (tp_text.startswith("tp") and tp_text[2:].isdigit())):
        raise ConfigError(f"preset: {name!r}: expected {prefix}PATH@GPU or {prefix}PATH@GPU:tpN, "
                          f"e.g. {prefix}/models/llama{'/config.json' if prefix == ROUTE_PREFIX else ''}@a100-80g:tp2")
    tp = int(tp_text[2:]) if tp_text else 1
    model_route(path, gpu, tp)  # validates the GPU and the degree
    return path, gpu, tp


def _build_route(name: str) -> RooflineModel:
    path, gpu, tp = parse_model_route(name)
    efficiency = ROUTE_EFFICIENCY.get(gpu, Efficiency())
    return RooflineModel(model_from_hf_config(path), HARDWARE[gpu], tp, efficiency)


def build(name: str) -> PerfModel:
    """Build a named preset, a model's config.json on a GPU (``hf:PATH@GPU:tpN``), a folder
    of Vidur operator profiles (``vidur:DIR@GPU:tpN``, ``baton.perf.profiled``), or fit a
    profile CSV (a name ending in ``.csv``, see ``baton.perf.fitted``); the error lists the
    known names and how to add a model."""
    if name.startswith(ROUTE_PREFIX):
        return _build_route(name)
    if name.startswith(PROFILE_PREFIX):
        path, gpu, tp = parse_model_route(name)
        return ProfiledModel(path, gpu, tp)
    if name.endswith(".csv"):
        return FittedModel.from_profile(name)
    try:
        return PRESETS[name].build()
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"preset: unknown preset {name!r}{did_you_mean(name, PRESETS)}; "
                          f"known presets: {known}; {HOW_TO_ADD}") from None
