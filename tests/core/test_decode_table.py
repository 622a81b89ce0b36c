"""The decode table gives the same integers whether its columns are lists (a few rows) or
numpy arrays (many): checked against a plain model of the rows while rows join and leave
across both thresholds."""

import numpy as np
import pytest

from baton.core.decode_table import LARGE_ROWS, SMALL_ROWS, DecodeTable

BS = 16


def _reference(rows: dict[int, dict[str, int]]) -> dict:
    ctx = {r: v["ctx"] for r, v in rows.items()}
    ge = [0] * (BS + 1)
    for c in ctx.values():
        for r in range((c + BS - 1) % BS + 1):
            ge[r] += 1
    return {
        "short": sum(max(0, -(-v["ctx"] // BS) - v["blocks"]) for v in rows.values()),
        "horizon": min(min(v["stop_at"] - v["generated"] for v in rows.values()),
                       max(1, min(v["watch_ctx"] - v["ctx"] for v in rows.values()))),
        "ge": tuple(ge),
        "latest": max(((v["admit_seq"], r) for r, v in rows.items()))[::-1],
        "done": sorted(r for r, v in rows.items() if v["generated"] >= v["stop_at"]),
        "watched": sorted((r, v["ctx"]) for r, v in rows.items() if v["ctx"] >= v["watch_ctx"]),
    }


def _check(table: DecodeTable, rows: dict[int, dict[str, int]]) -> None:
    ref = _reference(rows)
    assert table.blocks_short(BS) == ref["short"]
    assert table.horizon() == ref["horizon"]
    assert table.residue_ge(BS) == ref["ge"]
    assert table.latest_admitted() == ref["latest"]
    done, watched = table.ended()
    assert sorted(done) == ref["done"] and sorted(watched) == ref["watched"]
    assert table.ctx_sum == sum(v["ctx"] for v in rows.values())
    ids = table.col("req_id").tolist()
    assert sorted(ids) == sorted(rows) and table.values("req_id") == ids
    assert table.col("ctx").tolist() == [rows[r]["ctx"] for r in ids]
    assert list(table.ctx_values()) == [rows[r]["ctx"] for r in ids]


@pytest.mark.parametrize("seed", [0, 1])
def test_lists_and_arrays_agree_with_a_plain_model_across_both_thresholds(seed):
    rng = np.random.default_rng(seed)
    table, rows, next_id, modes = DecodeTable(capacity=4), {}, 0, set()
    for step in range(400):
        grow = step < 150 or (step >= 260 and step < 330)
        if rows and (not grow and rng.random() < 0.8 or rng.random() < 0.2):
            rid = int(rng.choice(sorted(rows)))
            assert table.remove(rid)["ctx"] == rows.pop(rid)["ctx"]
        else:
            ctx = int(rng.integers(1, 400))
            row = {"ctx": ctx, "generated": int(rng.integers(0, 50)), "stop_at": int(rng.integers(50, 90)),
                   "admit_seq": next_id, "blocks": -(-ctx // BS) - int(rng.integers(0, 2)),
                   "watch_ctx": ctx + int(rng.integers(1, 30)) if rng.random() < 0.3 else DecodeTable.NO_WATCH}
            table.add(next_id, row["ctx"], row["generated"], row["stop_at"], row["admit_seq"], row["blocks"],
                      None if row["watch_ctx"] == DecodeTable.NO_WATCH else row["watch_ctx"])
            rows[next_id] = row
            next_id += 1
        if not rows:
            continue
        modes.add(table.small)
        _check(table, rows)
        k = int(rng.integers(0, 3))
        table.advance(k)
        for v in rows.values():
            v["ctx"] += k
            v["generated"] += k
        if rng.random() < 0.3:
            table.fill_blocks(BS, 1)
            for v in rows.values():
                v["blocks"] = max(v["blocks"], -(-(v["ctx"] + 1) // BS))
            assert table.col("blocks").tolist() == [rows[r]["blocks"] for r in table.req_ids()]
    assert modes == {True, False}  # both representations were used
    assert SMALL_ROWS < LARGE_ROWS


def test_a_column_read_from_a_small_table_is_read_only_and_follows_writes():
    table = DecodeTable()
    table.add(7, 100, 3, 10, 1, 7)
    col = table.col("ctx")
    with pytest.raises(ValueError):
        col[0] = 5
    table.set(7, "ctx", 120)
    assert table.col("ctx").tolist() == [120] and table.ctx_sum == 120
    table.advance(2)
    assert table.col("ctx").tolist() == [122] and table.get(7, "generated") == 5
