"""Log lines that come in floods (refused requests, failed legs) at a bounded rate: every
event at DEBUG, the first of each kind at ``level`` at once, and then at most one summary
per ``every_s`` seconds with the counts by kind. No I/O of its own but the logger."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable


class RateLimitedLog:
    """One logger's flood control. ``what`` names the events in the summary
    ("refused requests", "failed legs")."""

    def __init__(self, log: logging.Logger, what: str, level: int = logging.INFO, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.level, self.every_s, self.clock = log, what, level, every_s, clock
        self._counts: Counter[str] = Counter()
        self._seen: set[str] = set()
        self._since = clock()

    def note(self, kind: str, detail: str) -> None:
        """One event of ``kind`` (a short label: it keys the counts), described by ``detail``."""
        self.log.debug("%s: %s", kind, detail)
        if kind not in self._seen:  # a new kind of trouble is news: say it now
            self._seen.add(kind)
            self.log.log(self.level, "%s: %s (further ones are summarised every %.0f s)", kind, detail, self.every_s)
        self._counts[kind] += 1
        now = self.clock()
        if now - self._since >= self.every_s:
            summary = ", ".join(f"{k} x{n}" for k, n in self._counts.most_common())
            self.log.log(self.level, "%d %s in the last %.0f s: %s", sum(self._counts.values()), self.what,
                         now - self._since, summary)
            self._counts.clear()
            self._since = now
