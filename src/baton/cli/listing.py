"""``baton list``: the names Baton knows; policies with a line each, presets and GPUs as a
table, the name always the first column (so ``baton list presets | awk '{print $1}'`` gives
the names)."""

from __future__ import annotations

import argparse


def _presets() -> list[str]:
    from baton.perf.presets import PRESETS
    rows = [("preset", "model", "gpu", "tp", "source")]
    rows += [(name, p.model, p.hardware, str(p.tp), p.source) for name, p in sorted(PRESETS.items())]
    return _columns(rows)


def _gpus() -> list[str]:
    from baton.perf.hardware import HARDWARE
    rows = [("gpu", "bf16_tflops", "int8_tops", "fp8_tflops", "hbm_tb_s", "memory_gib", "tp")]
    for name, hw in sorted(HARDWARE.items()):
        tps = ",".join(["1", *(str(n) for n, _ in hw.allreduce_latency_s)])
        rows.append((name, *(f"{hw.flops_for(d) / 1e12:g}" for d in ("bf16", "int8", "fp8")),
                     f"{hw.hbm_bytes_per_s / 1e12:g}", f"{hw.hbm_bytes / 2**30:.1f}", tps))
    return _columns(rows)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]) for r in rows]


def cmd_list(args: argparse.Namespace) -> None:
    """Policies one per line with what each does; stages or trace formats one name per
    line; presets and GPUs as tables
    (a preset's model, GPU, tensor parallelism and source; a GPU's dense rates per dtype,
    HBM bandwidth and size, and the tensor-parallel degrees it can run)."""
    from baton.policies.catalog import POLICIES, STAGE_TYPES
    from baton.workload import FORMATS
    if args.what in ("presets", "gpus"):
        print("\n".join(_presets() if args.what == "presets" else _gpus()))
        return
    if args.what == "policies":
        from baton.policies.descriptions import DESCRIPTIONS
        print("\n".join(_columns([(name, DESCRIPTIONS.get(name, "")) for name in sorted(POLICIES)])))
        return
    names = {"stages": STAGE_TYPES, "formats": FORMATS}[args.what]
    print("\n".join(sorted(names)))
