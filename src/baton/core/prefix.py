"""Prefix identity: the chained keys of a request's full KV blocks, as vLLM's prefix cache
keys them (a block's key covers its parent's key and its own tokens), computed from the ids
a workload gives (``Request.prefix_ids``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from baton.core.request import Request

# splitmix64's constants (Steele et al.): a bijective mix of 64 bits
_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _salted_prefix_sums(ids: Sequence[int]) -> tuple[int, ...]:
    """Per prefix of ``ids``, the sum (mod 2^64) of each id mixed with its position
    (splitmix64 of the id's 64 bits xor position x golden ratio; an id wider than 64 bits
    by its hash): equal for equal prefixes, and two prefixes collide only by chance.
    Vectorised: one numpy pass, not one tuple per id."""
    try:  # 64-bit ids as they are (random ids, Mooncake's small ones): no call per id
        x = np.fromiter(ids, dtype=np.int64, count=len(ids))
    except OverflowError:  # wider ids: by their hash (equal ids, equal keys; others collide by chance)
        x = np.fromiter((i if _I64_MIN <= i <= _I64_MAX else hash(i) for i in ids), dtype=np.int64, count=len(ids))
    x = x.view(np.uint64)
    x ^= np.arange(len(ids), dtype=np.uint64) * _GOLDEN
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return tuple(np.cumsum(x).tolist())


def block_keys(request: Request, block_size: int) -> tuple[int, ...]:
    """Chained keys of the request's full blocks of ``block_size`` tokens, from its
    ``prefix_ids`` (each of ``prefix_block_tokens`` tokens; an engine block covering
    several, or part of one, is keyed by those ids and its offset in the first)."""
    ids, g = request.prefix_ids, request.prefix_block_tokens
    if not ids or g <= 0:
        return ()
    known = len(ids) * g
    out, parent = [], 0
    if g == block_size:  # one id per block: the common case, vectorised
        return _salted_prefix_sums(ids)
    if g % block_size == 0:  # each engine block inside one id (Mooncake's 512 onto 16)
        # the id's first block is keyed by the chain, the others by consecutive integers
        # after it: one hash per id, not per block (a key still names its whole prefix:
        # two chains meet only if two 64-bit hashes land within g / block_size of each other)
        per = g // block_size
        for i in ids:
            first = hash((parent, i, 0))
            out.extend(range(first, first + per))
            parent = first + per - 1
        return tuple(out)
    for j in range(known // block_size):
        lo, hi = j * block_size, (j + 1) * block_size
        parent = hash((parent, ids[lo // g:(hi - 1) // g + 1], lo % g))
        out.append(parent)
    return tuple(out)


def token_block_keys(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained keys of the full blocks of ``token_ids`` (after ``parent``, 0 for the start
    of a sequence): what the gateway matches a prompt on, and what it indexes the blocks of
    an engine's BlockStored events under (from their token ids, so any engine hash
    function maps onto one key space, as llm-d maps engine hashes). Python's hash of a
    tuple of ints is the same in every process."""
    out = []
    append = out.append
    for block in zip(*[iter(token_ids)] * block_size):  # the full blocks' tuples (a partial one is dropped)
        parent = hash((parent, block))
        append(parent)
    return out


def reuse_offered(requests: list[Request], block_size: int = 16,
                  capacity_blocks: int | None = None) -> float:
    """Share of prompt blocks (full blocks of ``block_size`` tokens, in arrival order) whose
    key was seen before as a prefix a cache could serve: the leading run of a prompt's
    blocks already seen. ``capacity_blocks`` bounds what is remembered (least recently used
    forgotten first); None remembers everything. NaN when no request has prefix ids."""
    seen: OrderedDict[int, None] = OrderedDict()
    total = reused = 0
    for r in sorted(requests, key=lambda q: q.arrival_s):
        keys = block_keys(r, block_size)
        if not keys:
            continue
        prompt = keys[:r.prompt_tokens // block_size]
        total += len(prompt)
        run = 0
        while run < len(prompt) and prompt[run] in seen:
            run += 1
        reused += run
        for k in keys[:(r.prompt_tokens + r.output_tokens) // block_size]:
            seen[k] = None
            seen.move_to_end(k)
        while capacity_blocks is not None and len(seen) > capacity_blocks:
            seen.popitem(last=False)
    return reused / total if total else float("nan")


VLLM_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed for the first block's parent (sha256, no PYTHONHASHSEED)


def vllm_block_hashes(token_ids: list[int], block_size: int, seed: str = VLLM_NONE_HASH_SEED) -> list[int]:
    """The hashes vLLM's KV events carry for the full blocks of ``token_ids``, as vLLM 0.32
    computes them with its default ``prefix_caching_hash_algo`` (sha256): each block's hash
    is SHA-256 over the pickle of (parent hash, the block's token ids, extra keys: None
    for plain text), the first block's parent SHA-256 over the pickle of ``seed``
    (PYTHONHASHSEED when the engine has it set, else "vllm-none-hash"); events carry the
    low 64 bits as an integer (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default)."""
    import hashlib
    import pickle

    def sha(obj) -> bytes:
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    parent, out = sha(seed), []
    for i in range(len(token_ids) // block_size):
        parent = sha((parent, tuple(token_ids[i * block_size:(i + 1) * block_size]), None))
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


class RequestKeys:
    """Requests' block keys (``block_keys``) by request id and block size, each computed
    once until ``drop``: an engine looks a waiting request up every iteration."""

    def __init__(self, request_of: Callable[[int], Request]) -> None:
        self.request_of = request_of
        self._keys: dict[tuple[int, int], tuple[int, ...]] = {}

    def __call__(self, req_id: int, block_size: int) -> tuple[int, ...]:
        keys = self._keys.get((req_id, block_size))
        if keys is None:
            keys = self._keys[(req_id, block_size)] = block_keys(self.request_of(req_id), block_size)
        return keys

    def drop(self, req_id: int, block_size: int) -> None:
        """Forget a request's keys (it ended)."""
        self._keys.pop((req_id, block_size), None)
