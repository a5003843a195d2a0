"""``runconsumer --health-file PATH``: liveness without a port.

The worker's poll loop calls :meth:`HealthFile.beat` after each round; the file's mtime
is updated (the file created if missing) when the round was healthy, at most once per
``interval`` seconds. A round is healthy when the database was reachable -- no outage
in progress for the poll loop or the side threads (``outage.py``) -- and no side thread
or handler thread has died (the worker then stops). A poll loop that hangs, or a
handler running on the poll loop's thread (``--concurrency 1`` without a timeout),
stops the updates too.

A Kubernetes liveness probe compares the mtime with the clock, e.g.
``find /tmp/sqlqueue-alive -mmin -1 | grep -q .`` or
``test $(($(date +%s) - $(stat -c %Y /tmp/sqlqueue-alive))) -lt 30``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Least seconds between two updates of the file.
TOUCH_INTERVAL = 1.0


class HealthFile:
    """Touches ``path`` after healthy poll-loop rounds (``path`` None: does nothing)."""

    def __init__(
        self, path: str | None, *, interval: float = TOUCH_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._failing = False

    def beat(self, healthy: bool) -> None:
        """Record the end of a poll-loop round: touch the file if ``healthy`` and due."""
        if self.path is None or not healthy:
            return
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        try:
            with open(self.path, "a"):
                os.utime(self.path)
        except OSError as exc:
            if not self._failing:  # once per run of failures: the probe will say the rest
                logger.warning("cannot touch the health file path=%s error=%s", self.path, exc)
            self._failing = True
        else:
            self._failing = False
