"""Struct-of-arrays table of an instance's running decodes.

The runtime advances every row by the same number of iterations at once, so a
segment of many iterations costs a few vectorised operations, not one per token.
A table of a handful of rows keeps its columns as Python lists: there numpy's cost per
call (a microsecond or more) is most of the work, and a batch change asks for a dozen
column operations. Past ``LARGE_ROWS`` rows the columns move to numpy arrays, and back
below ``SMALL_ROWS``; every operation gives the same integers either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import sub

import numpy as np

_COLUMNS = ("req_id", "ctx", "generated", "stop_at", "admit_seq", "blocks", "watch_ctx",
            "joined_us", "joined_generated")
LARGE_ROWS = 48  # above it the columns are numpy arrays
SMALL_ROWS = 24  # at or below it they go back to lists


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
        self._py: dict[str, list[int]] | None = {name: [] for name in _COLUMNS}  # None: numpy columns
        self._cols: dict[str, np.ndarray] = {}
        self._capacity = capacity
        self._row: dict[int, int] = {}
        self.n = 0
        self.ctx_sum = 0
        self.on_change: Callable[[], None] | None = None  # the owner's hook: ctx_sum or n changed
        self._views: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return self.n

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._row

    @property
    def small(self) -> bool:
        """Whether the columns are Python lists now."""
        return self._py is not None

    def col(self, name: str) -> np.ndarray:
        """A read-only array of the live rows of one column (kept until rows are added or
        removed or, for a small table, any value changes: values written in place to a
        large table show through it)."""
        view = self._views.get(name)
        if view is None:
            if self._py is not None:
                view = np.array(self._py[name], dtype=np.int64)
            else:
                view = self._cols[name][: self.n]
            view.flags.writeable = False
            self._views[name] = view
        return view

    def values(self, name: str) -> list[int]:
        """One column of the live rows as a list of ints."""
        return list(self._py[name]) if self._py is not None else self._cols[name][: self.n].tolist()

    def _mutable(self, name: str) -> np.ndarray:
        return self._cols[name][: self.n]

    # --- representation ---------------------------------------------------------------
    def _to_arrays(self) -> None:
        py, self._py = self._py, None
        cap = max(self._capacity, 2 * self.n)
        self._cols = {name: np.zeros(cap, dtype=np.int64) for name in _COLUMNS}
        for name, values in py.items():
            self._cols[name][: self.n] = values
        self._views.clear()

    def _to_lists(self) -> None:
        self._py = {name: arr[: self.n].tolist() for name, arr in self._cols.items()}
        self._cols = {}
        self._views.clear()

    # --- rows -------------------------------------------------------------------------
    def add(self, req_id: int, ctx: int, generated: int, stop_at: int, admit_seq: int,
            blocks: int, watch_ctx: int | None = None, joined_s: float = 0.0) -> None:
        """Append a row for a request that joins the decode batch."""
        self._views.clear()
        values = (req_id, ctx, generated, stop_at, admit_seq, blocks,
                  self.NO_WATCH if watch_ctx is None else watch_ctx, round(joined_s * 1e6), generated)
        if self._py is not None and self.n >= LARGE_ROWS:
            self._to_arrays()
        if self._py is not None:
            for name, value in zip(_COLUMNS, values):
                self._py[name].append(value)
        else:
            if self.n == len(self._cols["req_id"]):
                for name, arr in self._cols.items():
                    self._cols[name] = np.concatenate([arr, np.zeros_like(arr)])
            for name, value in zip(_COLUMNS, values):
                self._cols[name][self.n] = value
        self._row[req_id] = self.n
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
        if self._py is not None:
            values = {name: col[i] for name, col in self._py.items()}
            for col in self._py.values():
                col[i] = col[last]
                col.pop()
            if i != last:
                self._row[self._py["req_id"][i]] = i
        else:
            values = {name: int(arr[i]) for name, arr in self._cols.items()}
            if i != last:
                for arr in self._cols.values():
                    arr[i] = arr[last]
                self._row[int(self._cols["req_id"][i])] = i
        self.n -= 1
        self.ctx_sum -= values["ctx"]
        if self._py is None and self.n <= SMALL_ROWS:
            self._to_lists()
        self._changed()
        return values

    def get(self, req_id: int, name: str) -> int:
        i = self._row[req_id]
        return self._py[name][i] if self._py is not None else int(self._cols[name][i])

    def set(self, req_id: int, name: str, value: int) -> None:
        if name == "ctx":
            self.ctx_sum += value - self.get(req_id, "ctx")
            self._changed()
        if self._py is not None:
            self._py[name][self._row[req_id]] = value
            self._views.pop(name, None)
        else:
            self._cols[name][self._row[req_id]] = value

    def req_ids(self) -> list[int]:
        return self.values("req_id")

    # --- the engine's batch arithmetic ----------------------------------------------------
    def advance(self, iterations: int) -> None:
        """Every row emits ``iterations`` tokens."""
        if iterations and self.n:
            if self._py is not None:
                py = self._py
                py["ctx"] = [c + iterations for c in py["ctx"]]
                py["generated"] = [g + iterations for g in py["generated"]]
                self._views.pop("ctx", None)
                self._views.pop("generated", None)
            else:
                self._mutable("ctx")[:] += iterations
                self._mutable("generated")[:] += iterations
            self.ctx_sum += iterations * self.n
            self._changed()

    def blocks_short(self, block_size: int, extra_ctx: int = 0) -> int:
        """KV blocks the rows lack to hold their context plus ``extra_ctx`` tokens."""
        if not self.n:
            return 0
        if self._py is not None:  # the ceiling division inline: a call per row cost more than the row
            short = [-((-(c + extra_ctx)) // block_size) - b for c, b in zip(self._py["ctx"], self._py["blocks"])]
            return sum(k for k in short if k > 0)
        need = -((-(self._mutable("ctx") + extra_ctx)) // block_size) - self._mutable("blocks")
        return int(np.maximum(need, 0).sum())

    def fill_blocks(self, block_size: int, extra_ctx: int = 0) -> None:
        """Give every row the blocks for its context plus ``extra_ctx`` tokens."""
        if self._py is not None:
            need = [-((-(c + extra_ctx)) // block_size) for c in self._py["ctx"]]
            self._py["blocks"] = [b if b >= k else k for k, b in zip(need, self._py["blocks"])]
            self._views.pop("blocks", None)
        elif self.n:
            blocks = self._mutable("blocks")
            np.maximum(blocks, -((-(self._mutable("ctx") + extra_ctx)) // block_size), out=blocks)

    def horizon(self) -> int:
        """Iterations until a row finishes or reaches its watched length (at least 1 for
        the watch)."""
        if self._py is not None:
            py = self._py
            done = min(map(sub, py["stop_at"], py["generated"]))
            watch = min(map(sub, py["watch_ctx"], py["ctx"]))
        else:
            done = int((self._mutable("stop_at") - self._mutable("generated")).min())
            watch = int((self._mutable("watch_ctx") - self._mutable("ctx")).min())
        return min(done, max(1, watch))

    def residue_ge(self, block_size: int) -> tuple[int, ...]:
        """For r = 0..block_size, how many rows have (ctx + bs - 1) % bs >= r
        (``Segment.residue_ge``: the decode blocks a segment's iterations take)."""
        bs = block_size
        if self._py is not None:
            counts = [0] * (bs + 1)
            for c in self._py["ctx"]:
                counts[(c + bs - 1) % bs] += 1
            for r in range(bs - 1, -1, -1):
                counts[r] += counts[r + 1]
            return tuple(counts)
        counts = np.bincount((self._mutable("ctx") + bs - 1) % bs, minlength=bs)
        return tuple(np.concatenate([np.cumsum(counts[::-1])[::-1], [0]]).tolist())

    def latest_admitted(self) -> tuple[int, int]:
        """(request id, admission sequence) of the row admitted last."""
        if self._py is not None:
            seq = max(self._py["admit_seq"])
            return self._py["req_id"][self._py["admit_seq"].index(seq)], seq
        i = int(np.argmax(self._mutable("admit_seq")))
        return int(self._cols["req_id"][i]), int(self._cols["admit_seq"][i])

    def ended(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Rows that reached their output length, and (row, context) of those that reached
        their watched length, each in row order."""
        if self._py is not None:
            py = self._py
            done = [r for r, g, s in zip(py["req_id"], py["generated"], py["stop_at"]) if g >= s]
            watched = [(r, c) for r, c, w in zip(py["req_id"], py["ctx"], py["watch_ctx"]) if c >= w]
            return done, watched
        ids, ctx = self._mutable("req_id"), self._mutable("ctx")
        done = ids[self._mutable("generated") >= self._mutable("stop_at")].tolist()
        w = ctx >= self._mutable("watch_ctx")
        return done, list(zip(ids[w].tolist(), ctx[w].tolist())) if w.any() else []

    def ctx_values(self) -> Sequence[int] | np.ndarray:
        """The context column as it is stored (a list for a small table)."""
        return self._py["ctx"] if self._py is not None else self._mutable("ctx")
