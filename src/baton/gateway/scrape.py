"""Reading engine ``/metrics`` (Prometheus text) into a ``ScrapeSample``, one loop per
engine; each scrape doubles as the engine's health probe."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from baton.gateway.control import Control
from baton.gateway.engines import Engines
from baton.gateway.live import ScrapeSample

log = logging.getLogger("baton.gateway")
# an engine restarted between two scrapes under the same model name may have another
# context length (max_model_len): /v1/models is asked again this often (seconds)
_MODEL_REFRESH_S = 30.0


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


def failure_cause(exc: BaseException) -> str:
    """A short reason a call to an engine failed, for logs and ``/health``."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else "cannot connect"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def implausible(sample: ScrapeSample) -> str | None:
    """Why a scraped sample cannot be true (a value that is not finite, a negative count,
    a KV usage outside [0, 1]), or None. Such a sample is rejected whole: one NaN would
    poison every KV computation made from it."""
    for name in ("running", "waiting", "kv_usage", "preemptions"):
        value = getattr(sample, name)
        if value is None:
            continue
        if not math.isfinite(value):
            return f"{name} is {value}"
        if value < 0 or (name == "kv_usage" and value > 1):
            return f"{name} out of range ({value})"
    return None


SILENT_AFTER_S = 1.0  # an unanswered scrape counts failures from this long on


class Scraper:
    """The gateway's scrape loops: one task per engine, so a hung engine delays only its
    own probe. A failed scrape counts towards the engine's failures like a failed leg; a
    good one resets them, brings the engine back and learns its model name and context
    length."""

    def __init__(self, control: Control, engines: Engines) -> None:
        self.control, self.engines, self.cluster = control, engines, control.cluster
        self.tasks: dict[int, asyncio.Task] = {}
        self._rejected: dict[int, str] = {}  # instance -> why its last sample was rejected
        self._asked_s: dict[int, float] = {}  # instance -> when its /v1/models was last asked
        cfg = control.config
        self.timeout = aiohttp.ClientTimeout(total=cfg.scrape_timeout_s, sock_connect=cfg.connect_timeout_s)

    def start(self, iid: int) -> None:
        self.tasks[iid] = asyncio.create_task(self._loop(iid))

    async def _loop(self, iid: int) -> None:
        """Scrapes at fixed multiples of the interval, as the simulator does (a scrape
        that overruns its slot is followed at once by the next)."""
        interval, due = self.control.config.scrape_interval_s, self.cluster.clock()
        while not self.cluster.engines[iid].removed:
            try:
                await self._scrape_counting_silence(iid, interval)
            except Exception as exc:  # noqa: BLE001 - a scrape bug must not stop health probing
                log.warning("scrape of instance %s failed: %r", iid, exc)
            due = max(due + interval, self.cluster.clock() - interval)  # a long hang skips, not bursts
            await asyncio.sleep(max(0.0, due - self.cluster.clock()))

    async def _scrape_counting_silence(self, iid: int, interval_s: float) -> None:
        """One scrape; each scrape interval it stays unanswered past ``SILENT_AFTER_S``
        counts as a failed scrape, so an engine that accepts connections and answers nothing
        (stopped, wedged) is out after about a second and ``unhealthy_after_failures``
        intervals, not that many scrape timeouts (a busy machine's slow answer within a
        second counts nothing)."""
        probe = asyncio.ensure_future(self.scrape(iid))
        waited = 0
        try:
            while not (await asyncio.wait({probe}, timeout=interval_s))[0]:
                waited += 1
                if waited * interval_s >= SILENT_AFTER_S:
                    self.control.note_failure(iid, f"/metrics: no answer for {waited * interval_s:.1f} s")
        finally:
            if not probe.done():
                probe.cancel()
        await probe

    async def scrape(self, iid: int) -> bool:
        """Read one engine's metrics now; False when it did not answer properly. Held
        prefills re-check their instance afterwards either way (with the new sample)."""
        ok = await self._probe(iid)
        self.control.hold.scraped(iid)
        names, now = self.engines.names, self.cluster.clock()
        stale = now - self._asked_s.get(iid, -_MODEL_REFRESH_S) >= _MODEL_REFRESH_S
        if ok and (iid not in names.by_engine or iid not in names.asked or stale):
            self._asked_s[iid] = now
            await self._discover(iid)
        return ok

    async def _discover(self, iid: int) -> None:
        """The engine's model name (until known) and context length (once per healthy
        spell: an engine back from a failure may have restarted with another one)."""
        await self.engines.names.discover(self.engines.session, iid, self.engines.url(iid),
                                          self.engines.credential(iid), self.timeout)

    async def _probe(self, iid: int) -> bool:
        eng, session, metrics = self.cluster.engines[iid], self.engines.session, self.control.metrics
        try:
            assert session is not None
            async with session.get(eng.spec.url + "/metrics", timeout=self.timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                sample = parse_metrics(await resp.text(), eng.spec.metric_names, self.cluster.clock())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
            metrics.scrapes.labels(eng.spec.name, "error").inc()
            self.control.note_failure(iid, f"/metrics: {failure_cause(exc)}")
            return False
        eng.failures = 0  # it answered: healthy, whatever it says
        bad = implausible(sample)
        if bad is not None:
            metrics.scrapes.labels(eng.spec.name, "rejected").inc()
            if self._rejected.get(iid) != bad:  # one line per new reason, not per scrape
                log.warning("engine %s: scraped metrics rejected (%s); policies keep its last good sample",
                            eng.spec.name, bad)
            self._rejected[iid] = bad
        else:
            self._rejected.pop(iid, None)
            self.cluster.record_scrape(iid, sample)
        if self.cluster.set_health(iid, True):
            self.engines.names.asked.discard(iid)
            log.info("engine %s is healthy again; it takes new work", eng.spec.name)
        metrics.scrapes.labels(eng.spec.name, "ok").inc()
        return True
