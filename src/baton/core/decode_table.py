"""Struct-of-arrays table of an instance's running decodes.

The runtime advances every row by the same number of iterations at once, so a
segment of many iterations costs a few vectorised operations, not one per token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_COLUMNS = ("req_id", "ctx", "generated", "stop_at", "admit_seq", "blocks", "watch_ctx",
            "joined_us", "joined_generated")


class DecodeTable:
    """Running decodes of one instance, one row per request.

    Columns (all int64): ``req_id``; ``ctx`` (context tokens: prompt + generated);
    ``generated`` (output tokens so far); ``stop_at`` (output length at which the request
    ends; runtime-only, policies read lengths through estimators); ``admit_seq``
    (admission order, for latest-first preemption); ``blocks`` (KV blocks held);
    ``watch_ctx`` (next watched context length, or a huge value); ``joined_us`` and
    ``joined_generated`` (when the row joined this batch, in microseconds, and its output
    length then: a request's observed decode rate here is the ratio of their increments).
    Aggregates ``ctx_sum`` is kept incrementally.
    """

    NO_WATCH = np.iinfo(np.int64).max // 4

    def __init__(self, capacity: int = 16) -> None:
        self._cols = {name: np.zeros(capacity, dtype=np.int64) for name in _COLUMNS}
        self._row: dict[int, int] = {}
        self.n = 0
        self.ctx_sum = 0
        self.on_change: Callable[[], None] | None = None  # the owner's hook: ctx_sum or n changed
        self._views: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return self.n

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._row

    def col(self, name: str) -> np.ndarray:
        """A read-only view of the live rows of one column (kept until rows are added or
        removed: values written in place show through it)."""
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self._cols[name][: self.n]
            view.flags.writeable = False
        return view

    def _mutable(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    def add(self, req_id: int, ctx: int, generated: int, stop_at: int, admit_seq: int,
            blocks: int, watch_ctx: int | None = None, joined_s: float = 0.0) -> None:
        """Append a row for a request that joins the decode batch."""
        self._views.clear()
        if self.n == len(self._cols["req_id"]):
            for name, arr in self._cols.items():
                self._cols[name] = np.concatenate([arr, np.zeros_like(arr)])
        i = self.n
        values = (req_id, ctx, generated, stop_at, admit_seq, blocks,
                  self.NO_WATCH if watch_ctx is None else watch_ctx, round(joined_s * 1e6), generated)
        for name, value in zip(_COLUMNS, values):
            self._cols[name][i] = value
        self._row[req_id] = i
        self.n += 1
        self.ctx_sum += ctx
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def remove(self, req_id: int) -> dict[str, int]:
        """Remove a row (swap with the last) and return its values."""
        i = self._row.pop(req_id)
        self._views.clear()
        last = self.n - 1
        values = {name: int(arr[i]) for name, arr in self._cols.items()}
        if i != last:
            for arr in self._cols.values():
                arr[i] = arr[last]
            self._row[int(self._cols["req_id"][i])] = i
        self.n -= 1
        self.ctx_sum -= values["ctx"]
        self._changed()
        return values

    def get(self, req_id: int, name: str) -> int:
        return int(self._cols[name][self._row[req_id]])

    def set(self, req_id: int, name: str, value: int) -> None:
        if name == "ctx":
            self.ctx_sum += value - self.get(req_id, "ctx")
            self._changed()
        self._cols[name][self._row[req_id]] = value

    def advance(self, iterations: int) -> None:
        """Every row emits ``iterations`` tokens."""
        if iterations and self.n:
            self._mutable("ctx")[:] += iterations
            self._mutable("generated")[:] += iterations
            self.ctx_sum += iterations * self.n
            self._changed()

    def add_blocks(self, extra: np.ndarray) -> None:
        self._mutable("blocks")[:] += extra

    def req_ids(self) -> list[int]:
        return [int(x) for x in self._cols["req_id"][: self.n]]
