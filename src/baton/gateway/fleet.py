"""Engines joining and leaving a running gateway: through the admin API or the pods of an
InferencePool (``gateway.discovery``). One place, so both book, probe and release an
engine the same way."""

from __future__ import annotations

import logging

from baton.core.instance import Role
from baton.gateway.config import EngineSpec
from baton.gateway.control import Control
from baton.gateway.engines import Engines
from baton.gateway.scrape import Scraper

log = logging.getLogger("baton.gateway")


class Fleet:
    """Add, remove and re-role engines while the gateway serves."""

    def __init__(self, control: Control, engines: Engines, scraper: Scraper) -> None:
        self.control, self.engines, self.scraper, self.cluster = control, engines, scraper, control.cluster

    async def add(self, spec: EngineSpec) -> int:
        """Register ``spec``, probe it once (it takes work when it answers) and keep
        scraping it; its instance id."""
        iid = self.engines.add(spec)
        self.control.outliers.add(iid)
        await self.scraper.scrape(iid)
        self.scraper.start(iid)
        log.info("engine %s (%s, %s) joined", spec.name, spec.url, spec.role.value)
        return iid

    def remove(self, iid: int) -> int:
        """Take ``iid`` out of new work; its requests finish where they are (how many)."""
        self.cluster.remove_engine(iid)
        self.control.outliers.remove(iid)
        self.control.hold.scraped(iid)  # prefills held there go elsewhere
        log.info("engine %s left (%d requests draining)", self.cluster.engines[iid].spec.name,
                 self.cluster.instances[iid].num_requests)
        return self.cluster.instances[iid].num_requests

    def set_role(self, iid: int, role: Role, by: str) -> None:
        self.control.set_role(iid, role, by)
