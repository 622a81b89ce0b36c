"""Training ARES's remaining-length MLP on hidden-state samples (needs torch).

The network follows ARES section 4: four linear layers with ReLU between them. The paper's
widths for d = 3,584 (Qwen2.5-7B) are 2,048 / 512 / 64, i.e. d x 4/7, d x 1/7 and
d x 1/56; scaled to SmolLM2's d = 576 they are 329 / 82 / 10 (``widths_for``).

Training: L1 loss on the remaining length divided by the training mean (so the loss is in
units of a typical answer), AdamW (lr 1e-3, weight decay 1e-2), mini-batches of 256, early
stopping on the validation MAE (patience 20 epochs, at most 400), the best epoch's
weights kept. Inputs are standardised with the training split's mean and std.

The split is by request (``split_requests``): 70/15/15 of the request ids, seeded, so no
request's samples are in two splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


def widths_for(d: int) -> list[int]:
    """Hidden widths of the paper's MLP scaled to input width ``d``."""
    return [max(1, round(d * 4 / 7)), max(1, round(d / 7)), max(1, round(d / 56))]


def split_requests(requests: np.ndarray, seed: int = 0, shares: tuple[float, float] = (0.7, 0.15)) -> dict[str, np.ndarray]:
    """Boolean sample masks ``train``/``val``/``test``, splitting the unique request ids."""
    ids = np.unique(requests)
    order = np.random.default_rng(seed).permutation(ids.size)
    n_train, n_val = int(round(shares[0] * ids.size)), int(round(shares[1] * ids.size))
    parts = {"train": ids[order[:n_train]], "val": ids[order[n_train:n_train + n_val]],
             "test": ids[order[n_train + n_val:]]}
    return {name: np.isin(requests, part) for name, part in parts.items()}


@dataclass
class TrainResult:
    """The exported weights, the epochs run and the best validation MAE (tokens)."""

    arrays: dict[str, np.ndarray]
    epochs: int
    val_mae_tokens: float


def _network(d: int, widths: list[int]):
    import torch.nn as nn

    layers, last = [], d
    for w in widths:
        layers += [nn.Linear(last, w), nn.ReLU()]
        last = w
    return nn.Sequential(*layers, nn.Linear(last, 1))


def export(net, mean: np.ndarray, std: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """The arrays ``baton.predict.learned.MLP`` reads (weights transposed to x @ w)."""
    import torch.nn as nn

    linears = [m for m in net if isinstance(m, nn.Linear)]
    out: dict[str, np.ndarray] = {"mean": mean, "std": std, "scale": np.array(scale)}
    for i, lin in enumerate(linears):
        out[f"w{i}"] = lin.weight.detach().numpy().T.copy()
        out[f"b{i}"] = lin.bias.detach().numpy().copy()
    return out


def train(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, seed: int = 0,
          max_epochs: int = 400, patience: int = 20, batch: int = 256, lr: float = 1e-3) -> TrainResult:
    """Fit the MLP on (hidden state, remaining tokens) pairs; see the module docstring."""
    import torch

    if len(y_train) == 0 or len(y_val) == 0:
        raise ValueError(f"need training and validation samples, got {len(y_train)} and {len(y_val)}")

    torch.manual_seed(seed)
    mean = x_train.mean(axis=0).astype(np.float32)
    std = (x_train.std(axis=0) + 1e-3).astype(np.float32)
    scale = float(max(y_train.mean(), 1.0))
    xt = torch.from_numpy(((x_train - mean) / std).astype(np.float32))
    yt = torch.from_numpy((y_train / scale).astype(np.float32))
    xv = torch.from_numpy(((x_val - mean) / std).astype(np.float32))
    net = _network(x_train.shape[1], widths_for(x_train.shape[1]))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-2)
    gen = torch.Generator().manual_seed(seed)
    best, best_state, since, epoch = np.inf, None, 0, 0
    for epoch in range(1, max_epochs + 1):
        net.train()
        for idx in torch.randperm(xt.shape[0], generator=gen).split(batch):
            opt.zero_grad()
            loss = torch.nn.functional.l1_loss(net(xt[idx])[:, 0], yt[idx])
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val = float(np.abs(np.maximum(net(xv)[:, 0].numpy() * scale, 0) - y_val).mean())
        if val < best - 1e-6:
            best, since = val, 0
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        else:
            since += 1
            if since >= patience:
                break
    net.load_state_dict(best_state)
    return TrainResult(export(net, mean, std, scale), epoch, best)


def save(result: TrainResult, path: Path) -> None:
    """Write the exported arrays as ``.npz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **result.arrays)
