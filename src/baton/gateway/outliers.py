"""Outlier ejection, as Envoy does it: an engine that keeps failing the legs it is sent
is taken out of the placement for a while, even though it answers health probes.

An engine that answers every request with a well-formed error (a 500 with an OpenAI
body, a 404 after it restarted under another model name) looks idle to a least-loaded
policy and would attract the traffic; scrapes cannot see it, only the legs can.

Three detectors, each Envoy's:

- *consecutive errors*: ``consecutive_errors`` failed legs in a row (Envoy's
  ``consecutive_5xx`` / ``consecutive_gateway_failure``) eject at once;
- *success rate*: per ``interval_s``, among engines with at least
  ``success_rate_request_volume`` legs, one whose success rate is below the mean minus
  ``success_rate_stdev_factor`` standard deviations is ejected (only when at least
  ``success_rate_min_hosts`` engines qualify);
- *failure percentage*: per interval, an engine whose legs failed at least
  ``failure_percentage_threshold`` percent of the time (same volume rules).

An ejection lasts ``base_ejection_s`` times the number of times the engine was ejected
(capped at ``max_ejection_s``); every interval an engine spends back in and without an
error lowers that multiplier by one again. At most ``max_ejection_percent`` of the
engines are out at once, but one may always be (Envoy's rule); the caller may veto an
ejection (the gateway never ejects the last engine able to serve a role).

Pure and synchronous: no clock of its own (``now_s`` comes in), no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from baton.core.settings import setting


@dataclass(slots=True)
class OutlierSettings:
    """Outlier ejection settings (times in seconds, percentages 0-100). Envoy's defaults,
    except ``max_ejection_percent``: Envoy's 10 % suits clusters of hundreds of hosts;
    a disaggregated fleet has pools of 2-16 engines, where 10 % would allow only one."""

    enabled: bool = setting(True, doc="eject engines whose legs keep failing")
    consecutive_errors: int = setting(5, gt=0, doc="failed legs in a row that eject an engine")
    interval_s: float = setting(10.0, gt=0, unit="s", doc="how often success and failure rates are judged")
    base_ejection_s: float = setting(30.0, gt=0, unit="s", doc="first ejection's length (times the ejection count)")
    max_ejection_s: float = setting(300.0, gt=0, unit="s", doc="longest ejection")
    max_ejection_percent: float = setting(50.0, gt=0, le=100, unit="%", doc="most of a pool ejected at once")
    success_rate_min_hosts: int = setting(5, gt=0, doc="engines with enough legs before success-rate ejection runs")
    success_rate_request_volume: int = setting(100, gt=0, doc="legs in an interval that make an engine count there")
    success_rate_stdev_factor: float = setting(1.9, gt=0, doc="ejected below the mean success rate minus this many "
                                                              "standard deviations")
    failure_percentage_threshold: float = setting(85.0, gt=0, le=100, unit="%",
                                                  doc="ejected above this share of failed legs in an interval")
    failure_percentage_min_hosts: int = setting(5, gt=0, doc="engines with enough legs before failure-percentage "
                                                             "ejection runs")
    failure_percentage_request_volume: int = setting(50, gt=0, doc="legs in an interval that make an engine count "
                                                                   "there")


@dataclass(slots=True)
class HostRecord:
    """One engine's outlier state: its current run of errors, this interval's counts, and
    its ejection (``ejected_until_s`` None when it is in)."""

    consecutive: int = 0
    proven: bool = False  # its last counted leg succeeded
    ok: int = 0
    errors: int = 0
    ejections: int = 0  # the ejection-time multiplier
    ejected_until_s: float | None = None
    reason: str = ""


@dataclass(slots=True)
class Sweep:
    """What one interval's sweep changed: engines ejected now (with the detector that
    did it) and engines returned."""

    ejected: list[tuple[int, str]] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)


class OutlierDetector:
    """Outlier state per engine id. ``may_eject(iid)`` is asked before every ejection."""

    def __init__(self, settings: OutlierSettings, may_eject: Callable[[int], bool] = lambda _iid: True) -> None:
        self.settings, self.may_eject = settings, may_eject
        self.hosts: dict[int, HostRecord] = {}

    def add(self, iid: int) -> None:
        self.hosts.setdefault(iid, HostRecord())

    def remove(self, iid: int) -> None:
        self.hosts.pop(iid, None)

    def is_ejected(self, iid: int) -> bool:
        host = self.hosts.get(iid)
        return host is not None and host.ejected_until_s is not None

    def release(self, iid: int) -> bool:
        """End ``iid``'s ejection now (its side has nothing else left); True if it was out.
        Its ejection-time multiplier stays, so a relapse is ejected for longer."""
        host = self.hosts.get(iid)
        if host is None or host.ejected_until_s is None:
            return False
        host.ejected_until_s, host.consecutive = None, 0
        return True

    def success(self, iid: int) -> None:
        """A leg on ``iid`` succeeded."""
        host = self.hosts.get(iid)
        if host is not None:
            host.ok += 1
            host.consecutive, host.proven = 0, True

    def failure(self, iid: int, now_s: float) -> bool:
        """A leg on ``iid`` failed; True if that ejected it (consecutive errors)."""
        host = self.hosts.get(iid)
        if host is None:
            return False
        host.errors += 1
        host.consecutive, host.proven = host.consecutive + 1, False
        s = self.settings
        return s.enabled and host.consecutive >= s.consecutive_errors and self._eject(iid, now_s, "consecutive_errors")

    def sweep(self, now_s: float) -> Sweep:
        """The per-interval work: return engines whose ejection is over, run the two
        statistical detectors on this interval's counts, then start a new interval."""
        out = Sweep()
        for iid, host in self.hosts.items():
            if host.ejected_until_s is not None and now_s >= host.ejected_until_s:
                host.ejected_until_s, host.consecutive = None, 0
                out.returned.append(iid)
            elif host.ejected_until_s is None and host.ejections and not host.errors:
                host.ejections -= 1  # a healthy interval earns back one step of ejection time
        if self.settings.enabled:
            for iid, reason in self._statistical():
                if self._eject(iid, now_s, reason):
                    out.ejected.append((iid, reason))
        for host in self.hosts.values():
            host.ok = host.errors = 0
        return out

    def _statistical(self) -> Iterable[tuple[int, str]]:
        s = self.settings
        rates = {iid: 100.0 * h.ok / (h.ok + h.errors) for iid, h in self.hosts.items()
                 if h.ejected_until_s is None and h.ok + h.errors >= s.success_rate_request_volume}
        if len(rates) >= s.success_rate_min_hosts:
            mean = statistics.fmean(rates.values())
            floor = mean - s.success_rate_stdev_factor * statistics.pstdev(rates.values())
            yield from ((iid, "success_rate") for iid, rate in rates.items() if rate < floor)
        volume = {iid: h for iid, h in self.hosts.items()
                  if h.ejected_until_s is None and h.ok + h.errors >= s.failure_percentage_request_volume}
        if len(volume) >= s.failure_percentage_min_hosts:
            yield from ((iid, "failure_percentage") for iid, h in volume.items()
                        if 100.0 * h.errors / (h.ok + h.errors) >= s.failure_percentage_threshold)

    def _eject(self, iid: int, now_s: float, reason: str) -> bool:
        host = self.hosts[iid]
        if host.ejected_until_s is not None or not self._room() or not self.may_eject(iid):
            return False
        host.ejections += 1
        s = self.settings
        host.ejected_until_s = now_s + min(s.max_ejection_s, s.base_ejection_s * host.ejections)
        host.reason = reason
        return True

    def _room(self) -> bool:
        """Whether one more engine may be ejected: below the percentage, or none is out."""
        out = sum(h.ejected_until_s is not None for h in self.hosts.values())
        allowed = math.floor(self.settings.max_ejection_percent * len(self.hosts) / 100.0)
        return out == 0 or out + 1 <= allowed

    def proven(self, iid: int) -> bool:
        """Whether ``iid``'s last counted leg succeeded (it serves requests well now)."""
        host = self.hosts.get(iid)
        return host is not None and host.proven

    def ejection_s(self, iid: int, now_s: float) -> float:
        """Seconds left of ``iid``'s ejection (0 when it is in)."""
        host = self.hosts.get(iid)
        if host is None or host.ejected_until_s is None:
            return 0.0
        return max(0.0, host.ejected_until_s - now_s)
