"""Reading engine ``/metrics`` (Prometheus text) into a ``ScrapeSample``."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from baton.gateway.live import ScrapeSample


def _base(name: str) -> str:
    return name[:-6] if name.endswith("_total") else name


def parse_metrics(text: str, names: Mapping[str, str | None], at_s: float) -> ScrapeSample:
    """Sum each configured metric over its label sets (one engine may report several).
    Counter names match with or without ``_total``. Raises ValueError on malformed text."""
    wanted = {_base(n): key for key, n in names.items() if n}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(_base(sample.name))
            if key is not None and not sample.name.endswith(("_created", "_bucket", "_sum", "_count")):
                sums[key] = sums.get(key, 0.0) + float(sample.value)
    return ScrapeSample(at_s, sums.get("running"), sums.get("waiting"), sums.get("kv_usage"),
                        sums.get("preemptions"))
