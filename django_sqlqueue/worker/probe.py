"""The probe: a worker's cheap look for new messages between full polls.

A full poll of a subscription (``poll_state``, ``store/polling.py``) is one statement, but
one with a handful of subqueries per leased partition: a MySQL/MariaDB server spends about
ten times as long parsing and planning it as running a one-row query. The short looks a
worker makes right after its work ran out (``cadence.py``) use this probe instead: one
statement for every topic of the worker, ``MAX(seq)`` per topic, one index dive each
(``QueueStore.newest_seqs``). A topic whose newest ``seq`` is unchanged got no message since
the previous probe, and its subscriptions are not polled in that look; a changed one is.

**What a look can miss, and who finds it.** ``seq`` is handed out at INSERT and becomes
visible at COMMIT: a message whose transaction began before, and committed after, one
the probe already saw does not change ``MAX(seq)``. Retries coming due and partitions
changing hands do not either. All of these are found by the full polls, which the cadence
still makes: at once after any work, and every ``POLL_INTERVAL`` x 1, 2, 4 ... after it
(the schedule a worker had before the looks existed). So a look only ever makes a message
*earlier*; it never stands between a message and its full poll.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..db.conn import close_quietly
from ..db.store import QueueStore

logger = logging.getLogger(__name__)


class Probe:
    """Remembers each topic's newest ``seq`` and says which changed since the last look."""

    def __init__(self, store: QueueStore, topics: Sequence[str]) -> None:
        self.store = store
        self.topics = sorted(set(topics))
        self._seen: list[int | None] | None = None

    def forget(self) -> None:
        """Drop the last reading (the next look then reports every topic as changed)."""
        self._seen = None

    def changed(self) -> set[str] | None:
        """The topics whose newest ``seq`` changed since the previous call; None when that is
        unknown (the first call, or the probe failed: the caller then polls everything, and
        the full poll reports a failing database)."""
        try:
            seqs = self.store.newest_seqs(self.topics)
        except Exception:
            logger.debug("probe failed", exc_info=True)
            close_quietly(self.store.using)
            self._seen = None
            return None
        seen, self._seen = self._seen, seqs
        if seen is None:
            return None
        return {topic for topic, old, new in zip(self.topics, seen, seqs, strict=True) if old != new}
