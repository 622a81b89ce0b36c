"""Where the A100 preset's terms come from, and how close whole iterations land to Vidur.

    python benchmarks/calibrate_vidur.py [--record]   (--record: results/calibrate-vidur.json)

1. Fits each term of ``A100_VIDUR`` to its own operator in Vidur's Llama-2-70B TP2
   profile (``../shared/peers/vidur``): the linear operators (matmul efficiency, weight-read
   efficiency, roofline norm, 128-row tile waste), decode attention (per-layer launch,
   per-sequence cost, KV-read efficiency, against Vidur's lookup with its own rounding) and
   prefill attention (per-chunk cost, off-diagonal and causal-triangle efficiencies), and
   prints the fitted values beside the preset's rounded ones.
2. Compares whole iterations (Sarathi batches of the fidelity workload: decode-only, one
   512-token prefill chunk, and a chunk beside decodes) of the preset, the ``hf:`` route for
   CodeLlama-34B and the profile-backed ``vidur:`` model against Vidur's reference built
   two ways: the profile's medians interpolated (``VidurProfile``), and the random
   forests Vidur 0.0.26 actually predicts with, read from its prediction cache
   (``~/.cache/baton/vidur-hub``; run ``benchmarks/fidelity.py`` once to train them; rows
   for a model whose forests are absent are skipped).

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import csv
import lzma
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from baton.perf import batch_shape, build  # noqa: E402
from baton.perf.presets import A100_VIDUR, HARDWARE, MODELS  # noqa: E402
from baton.perf.vidur_profile import FILES, VidurProfile  # noqa: E402
from baton.perf.vidur_tables import LINEAR_OPS, OperatorTables, _curve  # noqa: E402
from vidur_runner import HUB, PROFILES  # noqa: E402
from recorded import emit  # noqa: E402

FIXTURES = ROOT / "tests" / "perf" / "fixtures"
CODELLAMA = FIXTURES / "codellama-34b"
MODELS_BY_CASE = {  # case -> (profile file of its linear ops, layers, config.json folder, Baton preset)
    "llama-2-70b-tp2": ("a100_Llama-2-70b-hf_mlp.csv", 80, FIXTURES / "llama-2-70b", "llama-2-70b-tp2@a100-80g"),
    "codellama-34b-tp2": ("a100_codellama_CodeLlama-34b-Instruct-hf_mlp.csv", 48, CODELLAMA,
                          f"hf:{CODELLAMA}@a100-80g:tp2"),
}


def fit_terms(v: VidurProfile) -> dict[str, float]:
    """Each term fitted to its own operator of the 70B TP2 profile (section 1 above)."""
    m, hw, tp = MODELS["llama-2-70b"], HARDWARE["a100-80g"], 2
    layers, peak, bw = m.n_layers, hw.peak_flops, hw.hbm_bytes_per_s
    toks = np.arange(1, 4097)
    ref = np.array([layers * v.linear_ms(t) * 1e-3 for t in toks])

    def linear(p, t):
        comp, mem, waste, norm = p
        rows = t + waste * (np.ceil(t / 128) * 128 - t)
        c, w = 2.0 * m.matmul_params * rows / tp / (peak * comp), m.weight_bytes / tp / (bw * mem)
        return (c ** norm + w ** norm) ** (1 / norm)
    weight = np.where(toks <= 640, 3.0, 1.0)  # where Sarathi-512 batches live
    lin = least_squares(lambda p: weight * (linear(p, toks) / ref - 1), [0.66, 0.73, 0.5, 2.0],
                        bounds=([0.1, 0.1, 0, 1], [0.95, 0.92, 1, 20])).x
    rng, kvb = np.random.default_rng(1), m.kv_bytes_per_token / tp
    rows = []
    for _ in range(3000):
        b, mean = int(rng.integers(1, 129)), float(rng.uniform(128, 4000))
        ctx = np.clip(rng.uniform(0.2 * mean, 1.8 * mean, b), 16, 4095).astype(int)
        rows.append((b, int(ctx.sum()), layers * v.decode_attn_ms(list(ctx)) * 1e-3))
    d = np.array(rows, float)
    # absolute error against a typical 50 ms iteration: a 20% miss on a 1 ms attention matters less
    dec = least_squares(lambda p: (layers * (p[0] + p[1] * d[:, 0]) + kvb * d[:, 1] / (bw * p[2]) - d[:, 2]) / 0.05,
                        [18e-6, 0.2e-6, 0.73], bounds=([0, 0, 0.1], [1e-4, 2e-6, 0.92])).x
    pairs = 4.0 * layers * m.n_heads * m.head_dim / tp
    # the profile's rows as measured: a chunk of c tokens after o tokens of context (Vidur's
    # own lookup asks for the row at o + c; see VidurProfile.prefill_attn_ms)
    pr = np.array([(c, o, layers * v.prefill_attn_ms(c, o) * 1e-3)
                   for c in list(range(32, 513, 32)) * 3 + list(range(544, 4097, 128))
                   for o in range(0, 4096 - c + 1, 256)], float)
    pre = least_squares(lambda p: (layers * p[0] + pairs * pr[:, 0] * pr[:, 1] / (peak * p[1])
                                   + pairs * pr[:, 0] * (pr[:, 0] + 1) / 2 / (peak * p[2])) / pr[:, 2] - 1,
                        [10e-6, 0.33, 0.2], bounds=([0, 0.01, 0.01], [1e-3, 1, 1])).x
    names = ("compute", "memory", "tile_waste", "roofline_p", "attn_launch_s", "attn_per_seq_s",
             "attn_memory", "prefill_chunk_s", "attn_compute", "attn_diag_compute")
    return dict(zip(names, map(float, [*lin, *dec, *pre])))


def _predictions(path: Path) -> list[tuple[float, ...]]:
    with lzma.open(path, "rt") as handle:
        reader = csv.reader(handle)
        next(reader)
        return [tuple(float(x) for x in row) for row in reader]


def forest_tables(mlp_file: str) -> OperatorTables | None:
    """Vidur's forest predictions for the model whose linear-operator profile is
    ``mlp_file``, as operator tables; None when its forests have not been trained."""
    cache = HUB / "predictions"
    profiled = OperatorTables.from_files(PROFILES / mlp_file, PROFILES / FILES["attention"],
                                         PROFILES / FILES["all_reduce"], 2, 8192)
    target = float(np.interp(512, *profiled.linear))
    best = None
    for folder in (cache.iterdir() if cache.is_dir() else []):
        if not (folder / "mlp_up_proj.csv.xz").exists():
            continue
        linear: dict[float, float] = {}
        for op in LINEAR_OPS:
            if (folder / f"{op}.csv.xz").exists():
                for tokens, ms in _predictions(folder / f"{op}.csv.xz"):
                    linear[tokens] = linear.get(tokens, 0.0) + ms
        gap = abs(linear.get(512.0, 0.0) - target) / target
        if gap < 0.05 and (best is None or gap < best[0]):
            best = (gap, folder, linear)
    network = next((f for f in (cache.iterdir() if cache.is_dir() else []) if (f / "all_reduce.csv.xz").exists()), None)
    if best is None or network is None:
        return None
    _, folder, linear = best
    decode: dict[int, dict[float, list[float]]] = {}
    for b, kv, ms in _predictions(folder / "attn_decode.csv.xz"):
        decode.setdefault(int(b), {})[kv] = [ms]
    prefill: dict[int, dict[float, list[float]]] = {}
    for kv, chunk, ms in _predictions(folder / "attn_prefill.csv.xz"):
        prefill.setdefault(int(chunk), {})[kv] = [ms]
    reduce = {tokens: [ms] for tokens, ms in _predictions(network / "all_reduce.csv.xz")}
    return OperatorTables(_curve({k: [v] for k, v in linear.items()}), _curve(reduce),
                          {b: _curve(v) for b, v in decode.items()}, {c: _curve(v) for c, v in prefill.items()})


def sarathi_batches(n: int, seed: int = 3) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Batches as Sarathi forms them at chunk 512, batch cap 128, 256-4,096-token requests."""
    rng, out = np.random.default_rng(seed), []
    for k in range(n):
        b, mean = int(rng.integers(1, 129)), int(rng.integers(128, 4000))
        ctx = [int(c) for c in np.clip(rng.uniform(0.2 * mean, 1.8 * mean, b), 16, 4095)]
        prompt = int(rng.integers(233, 3724))
        done = int(rng.integers(0, prompt // 512 + 1)) * 512
        left = max(prompt - done, 1)
        kind = k % 3
        out.append(([], ctx) if kind == 0 else ([(min(512, left), done)], []) if kind == 1
                   else ([(min(512 - min(b, 480), left), done)], ctx[:min(b, 480)]))
    return out


def iteration_errors(perf, reference: VidurProfile, batches) -> dict[str, dict[str, float]]:
    """Per batch kind: median |error| and mean signed error of ``perf`` against ``reference``."""
    out = {}
    for kind, index in (("decode", 0), ("prefill", 1), ("mixed", 2)):
        e = np.array([perf.iteration_time_s(batch_shape(ch, ctx)) / reference.iteration(ch, ctx).total_s - 1
                      for ch, ctx in batches[index::3]])
        out[kind] = {"median_abs": float(np.median(np.abs(e))), "mean": float(np.mean(e))}
    return out


def profiled_dir(mlp_file: str, config: Path, work: Path) -> Path:
    """A ``vidur:`` folder for one model: its profiles under the names Baton reads."""
    work.mkdir(parents=True, exist_ok=True)
    for src, dst in ((mlp_file, "mlp.csv"), (FILES["attention"], "attention.csv"), (FILES["all_reduce"], "all_reduce.csv")):
        shutil.copyfile(PROFILES / src, work / dst)
    shutil.copyfile(config, work / "config.json")
    return work


def main() -> None:
    started = time.perf_counter()
    if not PROFILES.is_dir():
        sys.exit(f"calibrate_vidur: Vidur's profiles are not in {PROFILES}")
    medians70 = VidurProfile(PROFILES)
    fitted = fit_terms(medians70)
    print(f"{'term':<20} {'fitted':>12} {'preset':>12}")
    for name, value in fitted.items():
        print(f"{name:<20} {value:>12.4g} {getattr(A100_VIDUR, name):>12.4g}")
    batches, figures = sarathi_batches(1500), {"fitted": fitted}
    tmp = Path(tempfile.mkdtemp(prefix="baton-vidur-"))
    print(f"\n{'model':<18} {'reference':<9} {'perf model':<8} " + " ".join(f"{k + ' med|err| / mean':>24}" for k in ("decode", "prefill", "mixed")))
    for case, (mlp_file, layers, config, preset) in MODELS_BY_CASE.items():
        models = {"preset" if "hf:" not in preset else "hf-route": build(preset),
                  "vidur-dir": build(f"vidur:{profiled_dir(mlp_file, config / 'config.json', tmp / case)}@a100-80g:tp2")}
        tables = OperatorTables.from_files(PROFILES / mlp_file, PROFILES / FILES["attention"],
                                           PROFILES / FILES["all_reduce"], 2, 8192)
        refs = {"medians": VidurProfile(tables=tables, layers=layers)}
        forest = forest_tables(mlp_file)
        if forest is not None:
            refs["forest"] = VidurProfile(tables=forest, layers=layers)
        for ref_name, ref in refs.items():
            for model_name, perf in models.items():
                errs = iteration_errors(perf, ref, batches)
                figures[f"{case}/{model_name}/{ref_name}"] = errs
                print(f"{case:<18} {ref_name:<9} {model_name:<8} " + " ".join(
                    f"{errs[k]['median_abs'] * 100:>14.1f}% / {errs[k]['mean'] * 100:+5.1f}%" for k in ("decode", "prefill", "mixed")))
    shutil.rmtree(tmp, ignore_errors=True)
    emit("calibrate-vidur", figures, started, "--record" in sys.argv[1:])


if __name__ == "__main__":
    main()
