"""When the poll loop looks for work next: the worker's cadence.

The latency a message sees is mostly the time it waits for its partition's worker to look;
the cost of looking is one statement (an empty poll is one ``poll_state`` query, see
``store/delivery.py``). The cadence spends those statements where they buy latency, right
after work was found, and saves them while the queue is idle:

- **a full batch, or parked delayed messages:** look again at once (more is waiting);
- **a poll delivered something:** look again at once. Messages that arrived while the
  batch ran are picked up by this re-poll, and a steady stream is a chain of polls with no
  sleep between them. Not while a PostgreSQL listener is connected: there each new
  message's notification wakes the loop (also one that arrived during the batch), so the
  re-poll would find nothing;
- **a poll found nothing:** wait, and the wait grows with the time since work was last
  found: ``POLL_INTERVAL / 8`` at first, then doubling (``/4``, ``/2``, ``POLL_INTERVAL``,
  ``2 x`` ...) up to ``POLL_INTERVAL_MAX``. A trickle that paused for a few milliseconds is
  picked up within an eighth of the interval; a queue that went quiet is polled every
  ``POLL_INTERVAL_MAX``, as before. Per burst of work that ends, the short looks cost
  three statements more than a fixed ``POLL_INTERVAL`` cadence would.

So ``POLL_INTERVAL`` is the longest a worker with work in the last interval waits before it
looks again, and ``POLL_INTERVAL_MAX`` the longest it ever waits. Something can also cut a
wait short (``Worker._pause``): a batch finishing on a handler thread, a PostgreSQL
notification that a topic it consumes got a message (``worker/threads/listener.py``), a stop.

Pure arithmetic on a monotonic clock: no database, no threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: The first wait after a poll that found nothing, as a fraction of ``POLL_INTERVAL``.
FIRST_LOOK = 1 / 8


class Cadence:
    """Tells the poll loop how long to wait after each round, and whether the next round is
    a full poll or a look (the probe, ``Probe``)."""

    def __init__(
        self, poll_interval: float, poll_interval_max: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.poll_interval = poll_interval
        self.poll_interval_max = max(poll_interval, poll_interval_max)
        self._clock = clock
        #: When a poll last found work; the start counts as such, so a worker that starts
        #: in a busy system finds its first work soon.
        self._last_work = clock()
        #: Whether the last round found work (the next one is then a full poll).
        self._chain = True
        #: Whether new messages announce themselves (a PostgreSQL listener is connected):
        #: then the short looks are not needed, see :attr:`first`.
        self.pushed = False

    @property
    def first(self) -> float:
        """The wait after the first empty poll: ``POLL_INTERVAL / 8``, or ``POLL_INTERVAL``
        while notifications wake the worker for new messages (the looks that remain are for
        retries coming due and partitions changing hands, which no notification announces)."""
        return self.poll_interval if self.pushed else self.poll_interval * FIRST_LOOK

    @property
    def hot(self) -> bool:
        """Whether work was found less than ``POLL_INTERVAL`` ago (and nothing announces new
        messages): the looks are short, and the rounds that precede them take a probe."""
        return not self.pushed and self._clock() - self._last_work < self.poll_interval

    def full_poll_due(self, *, woken: bool) -> bool:
        """Whether the next round polls every subscription (True) or only those whose topic
        the probe saw change: a look, made while :attr:`hot` after a round that found
        nothing. ``woken``: something cut the wait short (a notification, a finished batch)."""
        return woken or self._chain or not self.hot

    def after_round(self, *, delivered: bool, more: bool) -> float:
        """Seconds to wait before the next round, given what this one did.

        ``delivered``: a poll delivered (or dead-lettered) messages; ``more``: a batch was
        full or delayed messages were parked, so more is waiting now.
        """
        now = self._clock()
        # While notifications announce new messages, a message that arrived during the
        # batch has woken the loop already (the wake-up event stays set): the re-poll after
        # a delivery would only find nothing, at the cost of a poll state query per batch.
        self._chain = more or (delivered and not self.pushed)
        if delivered or more:
            self._last_work = now
        if self._chain:
            return 0.0
        # Doubling from the last work: waits of first, first, 2 x first, 4 x first, ... so
        # the looks fall at about 1, 2, 4, 8 ... x first after the last work.
        return min(self.poll_interval_max, max(self.first, now - self._last_work))
