"""The torch half of the length-predictor build: hidden states, training, evaluation.

Run as ``python -m baton.learn.pipeline {hidden,fit,train} --data DIR ...`` in an environment with
torch and transformers (``benchmarks/length_predictor.py`` runs it in the real-engine
virtual environment). ``fit`` writes, under ``--data``: ``models/mlp_last.npz`` and
``models/mlp_first.npz`` (numpy-servable, see ``baton.predict.learned``),
``error_by_bucket.json`` and ``results.json`` (every figure the benchmark reports).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.progress import Progress

from baton.learn import baselines, evaluate, generate, hidden, train
from baton.predict.learned import MLP


def cmd_hidden(args: argparse.Namespace) -> None:
    records = generate.read_records(args.data / "generations.jsonl")
    with Progress() as bar:
        task = bar.add_task("hidden states", total=len(records) - len(hidden.ShardIndex(args.data / "hidden").requests()))
        n = hidden.extract(records, args.model, args.data / "hidden", every_tokens=args.every,
                           on_request=lambda: bar.advance(task))
    print(f"hidden states of {n} new generations in {args.data / 'hidden'}", file=sys.stderr)


def _predictions(data: dict, records: dict[str, dict], masks: dict, seed: int) -> tuple[dict, dict]:
    """Each predictor's test predictions, and the trained networks' exports and epochs."""
    y = data["remaining"].astype(np.float64)
    tr, va, te = masks["train"], masks["val"], masks["test"]
    preds, nets = {}, {}
    for layer in ("last", "first"):
        x = data[layer].astype(np.float32)
        result = train.train(x[tr], y[tr], x[va], y[va], seed=seed)
        nets[f"mlp_{layer}"] = result
        preds[f"mlp_{layer}"] = MLP.from_arrays(result.arrays).predict(x[te])
    preds["mean"] = np.full(te.sum(), baselines.mean_baseline(y[tr]))
    train_ids = np.unique(data["request"][tr])
    finals = np.array([len(records[r]["output_ids"]) for r in train_ids], dtype=np.float64)
    preds["survival"] = baselines.survival_baseline(finals).expected_remaining(data["generated"][te])
    feats = baselines.prompt_features([records[r]["prompt_ids"] for r in data["request"]], data["generated"])
    ridge = baselines.prompt_only_baseline(feats[tr], y[tr], feats[va], y[va])
    preds["prompt_only"] = ridge.predict(feats[te])
    return preds, nets


def cmd_fit(args: argparse.Namespace) -> None:
    index = hidden.ShardIndex(args.data / "hidden")
    data = index.load()
    records = {r["id"]: r for r in generate.read_records(args.data / "generations.jsonl")}
    masks = train.split_requests(data["request"], seed=args.seed)
    preds, nets = _predictions(data, records, masks, args.seed)
    te = masks["test"]
    truth, gen, reqs = data["remaining"][te].astype(np.float64), data["generated"][te], data["request"][te]
    models = args.data / "models"
    for name, result in nets.items():
        train.save(result, models / f"{name}.npz")
    last = MLP(models / "mlp_last.npz")
    d = int(data["last"].shape[1])
    outputs = np.array([len(r["output_ids"]) for r in records.values()])
    results = {
        "mae_tokens": {k: evaluate.mae(p, truth) for k, p in preds.items()},
        "mae_ci95": {k: evaluate.bootstrap_ci(p, truth, reqs) for k, p in preds.items()},
        "latency_ms_batch1": evaluate.latency_ms(last.predict, d, 1),
        "latency_ms_batch10": evaluate.latency_ms(last.predict, d, 10),
        "params": last.params, "samples": int(data["remaining"].size), "widths": [d, *train.widths_for(d), 1],
        "requests": {k: int(np.unique(data["request"][m]).size) for k, m in masks.items()},
        "samples_by_split": {k: int(m.sum()) for k, m in masks.items()},
        "epochs": {k: r.epochs for k, r in nets.items()},
        "output_tokens": {"mean": float(outputs.mean()), "median": float(np.median(outputs)),
                          "p90": float(np.percentile(outputs, 90)), "max": int(outputs.max()),
                          "capped_share": float(np.mean([r["finish_reason"] == "length" for r in records.values()]))},
        "by_generated": evaluate.by_bucket(preds, truth, gen),
        "mae_split_at_512": evaluate.mae_split(preds, truth, gen, 512),
        "within_request": {k: evaluate.within_request(p, truth, gen, reqs) for k, p in preds.items()},
    }
    meta = {"every_tokens": args.every, "model": Path(str(index.meta.get("model"))).name, "predictor": "mlp_last",
            "split": "test", "test_requests": results["requests"]["test"]}
    (args.data / "error_by_bucket.json").write_text(json.dumps(evaluate.error_file(preds["mlp_last"], truth, gen, meta)))
    (args.data / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results in {args.data / 'results.json'}", file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> None:
    """Only the last-layer MLP, on every sample (85/15 by request for early stopping): for
    small smoke runs where a test split would be a handful of requests."""
    data = hidden.ShardIndex(args.data / "hidden").load()
    val = train.split_requests(data["request"], seed=args.seed, shares=(0.85, 0.15))["val"]
    x, y = data["last"].astype(np.float32), data["remaining"].astype(np.float64)
    result = train.train(x[~val], y[~val], x[val], y[val], seed=args.seed, max_epochs=100)
    train.save(result, args.data / "models" / "mlp_last.npz")
    print(f"mlp_last: {len(y)} samples, {result.epochs} epochs, validation MAE {result.val_mae_tokens:.1f} tokens",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baton.learn.pipeline")
    p.add_argument("step", choices=["hidden", "fit", "train"])
    p.add_argument("--data", type=Path, required=True, help="the dataset folder (generations.jsonl, hidden/)")
    p.add_argument("--model", type=Path, help="the serving model's transformers folder (for hidden)")
    p.add_argument("--every", type=int, default=16, help="sample every this many generated tokens")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.step == "hidden" and not args.model:
        p.error("hidden needs --model")
    {"hidden": cmd_hidden, "fit": cmd_fit, "train": cmd_train}[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
