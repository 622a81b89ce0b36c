"""Engine health and outlier ejection in the gateway's control: a failed leg or scrape
counts towards an engine's health, failed legs towards its outlier ejection, and neither may
leave a side (prefill, decode) with no engine taking work while one still answers. A part of
``gateway.control.Control``, split off for size."""

from __future__ import annotations

import logging

from baton.gateway.upstream import UpstreamError

log = logging.getLogger("baton.gateway")


class EngineHealth:
    """Health and ejection of ``Control`` (its ``cluster``, ``config``, ``metrics``,
    ``outliers`` and ``leg_errors``)."""

    def backend_error(self, iid: int, err: BaseException, blame: bool = True) -> None:
        """Count a failed leg. An engine fault (no answer, a broken or malformed answer)
        counts towards health (``unhealthy_after_failures`` in a row, with failed scrapes,
        take an engine out until it answers a probe again); with ``blame`` the failure
        also counts towards outlier ejection. A flow passes ``blame=False`` for an HTTP
        error whose cause is not known yet (``blame`` decides later: the engine, if the
        request then succeeds elsewhere)."""
        up = err if isinstance(err, UpstreamError) else None
        kind = "connect" if up and up.connect else "timeout" if up and up.timed_out else (
            "malformed" if up and up.malformed else "http" if up and up.status else "stream")
        self.metrics.backend_errors.labels(self.cluster.engines[iid].spec.name, kind).inc()
        self.leg_errors.note(f"engine {self.cluster.engines[iid].spec.name} {kind} error", str(err))
        # a leg fault never takes out the last instance of a side (scrapes still can): an
        # overloaded last engine is better than none
        if (up is None or up.engine_fault) and self._may_eject(iid):
            self.note_failure(iid, f"{kind} error on a leg")
        if blame:
            self.blame(iid)

    def note_failure(self, iid: int, cause: str) -> None:
        """One failure of ``iid`` (a scrape or a leg); ``cause`` says what went wrong."""
        eng = self.cluster.engines[iid]
        eng.failures, eng.last_failure = eng.failures + 1, cause
        if eng.failures >= self.config.unhealthy_after_failures and self.cluster.set_health(iid, False):
            log.warning("engine %s is unhealthy after %d failures in a row (last: %s); no new work goes to it",
                        eng.spec.name, eng.failures, cause)
            self._readmit_ejected(iid)

    # --- outlier ejection (gateway.outliers) -----------------------------------------------------
    def leg_ok(self, iid: int) -> None:
        """A leg on ``iid`` was answered with 200."""
        self.outliers.success(iid)

    def blame(self, iid: int) -> None:
        """A failed leg counts against ``iid``; enough in a row eject it."""
        if self.outliers.failure(iid, self.cluster.clock()):
            self._ejected(iid, "consecutive_errors")

    def request_at_fault(self, failed_on: list[int]) -> bool:
        """Whether a request that got HTTP errors from every engine in ``failed_on`` (two
        or more) is itself the cause: each of those engines answered its last other leg
        well (a success, and no failure counted since). Engines failing everything, or not
        yet seen to work, make it an outage instead."""
        return len(failed_on) >= 2 and all(self.outliers.proven(i) for i in failed_on)

    def sweep_outliers(self) -> None:
        """The outlier detector's interval: engines whose ejection ended come back, the
        statistical detectors run."""
        sweep = self.outliers.sweep(self.cluster.clock())
        for iid in sweep.returned:
            if iid in self.cluster.engines and self.cluster.set_ejected(iid, False):
                log.info("engine %s: outlier ejection over; it takes new work", self.cluster.engines[iid].spec.name)
        for iid, reason in sweep.ejected:
            self._ejected(iid, reason)

    def _ejected(self, iid: int, reason: str) -> None:
        name = self.cluster.engines[iid].spec.name
        self.cluster.set_ejected(iid, True)
        self.metrics.ejections.labels(name, reason).inc()
        log.warning("engine %s ejected (%s) for %.0f s: its legs keep failing", name, reason,
                    self.outliers.ejection_s(iid, self.cluster.clock()))

    def _answering_ejected(self, exclude: frozenset[int], decodes: bool) -> list[int]:
        """Decode (else prefill) instances out only by outlier ejection (they still answer),
        for a request that has no other one left: an engine whose legs failed is better
        than none."""
        return [i for i, inst in self.cluster.instances.items()
                if (inst.role.decodes if decodes else inst.role.prefills) and i not in exclude
                and self.outliers.is_ejected(i) and self._answers(i)]

    def _answers(self, iid: int) -> bool:
        """Whether ``iid``'s engine answers its probes and is still part of the fleet."""
        eng = self.cluster.engines[iid]
        return eng.probe_ok and not eng.removed

    def _readmit_ejected(self, iid: int) -> None:
        """``iid`` stopped answering: if that left one of its sides (prefill, decode) with no
        instance taking new work, end the outlier ejections of that side's engines that still
        answer (an engine whose legs failed is better than none, as Envoy routes to every
        host below its panic threshold)."""
        role = self.cluster.instances[iid].role
        for takes in (lambda r: r.prefills, lambda r: r.decodes):
            side = [i for i in self.cluster.instances.values() if takes(i.role)] if takes(role) else []
            if not side or any(i.healthy for i in side):
                continue
            for inst in side:
                other = inst.instance_id
                if self._answers(other) and self.outliers.release(other):
                    self.cluster.set_ejected(other, False)
                    log.warning("engine %s: ejection ended early: its side has no other engine taking work",
                                self.cluster.engines[other].spec.name)

    def _may_eject(self, iid: int) -> bool:
        """Never eject (or mark unhealthy after failed legs) the last instance that takes new work on a side (prefill or decode)
        of ``iid``'s role: every request would then fail instead of some."""
        role = self.cluster.instances[iid].role
        others = [i for i in self.cluster.instances.values() if i.instance_id != iid and i.healthy]
        return (not role.prefills or any(i.role.prefills for i in others)) and \
            (not role.decodes or any(i.role.decodes for i in others))
