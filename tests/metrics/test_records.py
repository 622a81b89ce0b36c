"""Per-request records written as CSV (metrics/records.py)."""

import csv
import math
from dataclasses import fields

from baton.metrics.records import RequestRecord, write_records


def record(req_id: int, finished: bool, deflected: bool) -> RequestRecord:
    nan = float("nan")
    return RequestRecord(req_id, 0.25 * req_id, 100, 10, finished, "" if finished else "kv: prompt too long",
                         0.5, 0.02, 0.7, 0.007, 0.1, nan, 0.3, 0.0, 0.2, 1, 0, "0>2", deflected)


def test_records_round_trip_as_csv_with_lowercase_booleans(tmp_path):
    records = [record(0, True, False), record(1, False, True)]
    path = write_records(records, tmp_path / "out" / "r.requests.csv")
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == [f.name for f in fields(RequestRecord)]
    assert [(r["finished"], r["deflected"]) for r in rows] == [("true", "false"), ("false", "true")]
    assert rows[1]["reject_reason"] == "kv: prompt too long" and rows[0]["path"] == "0>2"
    assert float(rows[1]["arrival_s"]) == 0.25 and int(rows[0]["preemptions"]) == 1
    assert math.isnan(float(rows[0]["transfer_s"]))
