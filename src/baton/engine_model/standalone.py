"""One engine serving on its own, as a single vLLM instance does.

In the simulator the cluster decides what follows a prefill (decode here, hand the KV to
another instance, reject) and what a recompute leads to (``sim/simulator.py``). An engine
on its own has one answer, and the emulator takes it from here:

- a prefill's last iteration samples the request's next token (its first, or the one after
  a preempted context); the request then joins this engine's decode batch, or ends there
  when that token was its last;
- a prefill for a remote decode (``prefill_only``) keeps its KV here after that token until
  the decode side pulls it (``release_held``) or the runtime gives up on it;
- KV that arrived from elsewhere (``join``) decodes here from its first token.

``finish`` says, per iteration, which requests emitted a token and which ended. Segments
must be one iteration long (an engine built with ``closed_form=False``): the emulator emits
each token at its own time. Times are the engine clock's seconds."""

from __future__ import annotations

import enum
from typing import NamedTuple

from baton.engine_model.engine import Engine
from baton.engine_model.work import DecodeJoin, PrefillItem, PrefillKind


class Step(enum.Enum):
    """What a request did in an iteration: emitted a token, ended (its last token was
    emitted), or ended its prefill-only leg with its KV held here."""

    TOKEN = "token"
    DONE = "done"
    HELD = "held"


class Emission(NamedTuple):
    """One request's step in one iteration."""

    req_id: int
    step: Step


class Standalone:
    """The requests' course on one engine (``engine``, one-iteration segments)."""

    def __init__(self, engine: Engine) -> None:
        if engine.closed_form:
            raise ValueError("a standalone engine runs one iteration per segment (closed_form=False)")
        self.engine = engine
        self.prefill_only: set[int] = set()
        self._rows: list[int] = []  # the decodes of the planned iteration

    def submit(self, req_id: int, prompt_tokens: int, max_new_tokens: int, prefill_only: bool = False) -> None:
        """Queue a request whose prompt (``prompt_tokens``) is prefilled here; it stops after
        ``max_new_tokens`` output tokens (one for a prefill-only leg)."""
        if prefill_only:
            self.prefill_only.add(req_id)
        self.engine.add_prefill(PrefillItem(req_id, prompt_tokens, PrefillKind.FRESH,
                                            1 if prefill_only else max_new_tokens, 0))

    def join(self, req_id: int, ctx_tokens: int, max_new_tokens: int, blocks: int) -> None:
        """A request's prompt KV (``ctx_tokens`` in ``blocks`` already taken here, see
        ``Engine.reserve``) arrived: it decodes here from its first token."""
        self.engine.state.add_incoming(req_id, ctx_tokens)
        self.engine.add_join(DecodeJoin(req_id, ctx_tokens, 0, max_new_tokens, blocks, None))

    def abort(self, req_id: int) -> None:
        """The request's client left: drop it wherever it is (``Engine.abort``)."""
        self.prefill_only.discard(req_id)
        self.engine.abort(req_id)

    def release_held(self, req_id: int) -> bool:
        """Free a prefill-only leg's held KV (pulled, or never to be); False if none."""
        if req_id not in self.engine.held_blocks:
            return False
        self.engine.release_held(req_id)
        return True

    def plan(self, now_s: float) -> float | None:
        """Form the next iteration at ``now_s``; its end time, or None when idle."""
        end_s = self.engine.plan(now_s)
        self.engine.preempted.clear()  # the engine counts them (``preemptions``); nobody else reads them
        self._rows = self.engine.state.decodes.col("req_id").tolist() if end_s is not None else []
        return end_s

    def finish(self, now_s: float) -> list[Emission]:
        """End the planned iteration at ``now_s``: every request's step, decodes first."""
        result = self.engine.finish(now_s)
        table, ended = self.engine.state.decodes, set(result.finished)
        out = [Emission(r, Step.TOKEN) for r in self._rows if r in ended or r in table]
        out += [Emission(r, Step.DONE) for r in result.finished]
        for item in result.prefilled:
            out += self._after_prefill(item, now_s)
        self._rows = []
        return out

    def _after_prefill(self, item: PrefillItem, now_s: float) -> list[Emission]:
        """A prefill (fresh or recomputed) ended: its iteration sampled one token."""
        rid, generated = item.req_id, item.generated + 1
        if rid in self.prefill_only:
            self.prefill_only.discard(rid)
            self.engine.hold(rid, item.blocks, item.total_tokens)
            return [Emission(rid, Step.TOKEN), Emission(rid, Step.HELD)]
        if generated >= item.stop_at:
            self.engine.free_request(rid, item.blocks, item.total_tokens)
            return [Emission(rid, Step.TOKEN), Emission(rid, Step.DONE)]
        self.engine.state.add_incoming(rid, item.total_tokens + 1)
        self.engine.add_join(DecodeJoin(rid, item.total_tokens + 1, generated, item.stop_at, item.blocks, now_s,
                                        admit_seq=item.admit_seq))
        return [Emission(rid, Step.TOKEN)]
