"""A worker's periodic garbage collection of the partitions it holds.

Every ``GC_INTERVAL`` seconds a worker deletes, in the partitions it leases, the
messages every consuming group has acked (``store/gc.py`` says what may go, in short
transactions). A pass spends at most :data:`ROUND_BUDGET` seconds of one poll-loop round:
when it stops with more left, the next round goes on where it stopped, without waiting
for ``GC_INTERVAL``, so a backlog is worked off between polls at the log's speed while
the poll loop never stops for long. It also forgets
subscribers whose heartbeat stopped a day ago. Each worker collects only what it holds,
so workers never delete in the same partitions at once. It also deletes the per-hour
counters older than ``STATS_RETENTION`` (every topic's, one index range, usually empty):
two workers' passes may delete the same rows, the second then waits for the first and
finds nothing; and the console's per-minute history older than ``HISTORY_RETENTION``.

It also samples every consumer group's running totals and lag on every topic into the
current minute of the history (``db/store/history.py``) every ``LAG_SAMPLE_INTERVAL``
seconds: every group's, not only the ones this worker serves, so a group whose workers all
died still shows its growing lag while any worker runs. Several workers' samples of one
minute meet on the same rows (the minute keeps its last), they do not add up.

It runs on the poll loop's thread, between polls, on the poll loop's connection: not on
the lease keeper's, so a long delete never delays a lease renewal, and not on a thread
of its own, so it costs no connection (``manage.py queue_gc`` collects every topic from
outside the workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from ...conf import QueueSettings
from ...db.conn import close_quietly
from ...db.retry import Retrying
from ...db.store import QueueStore
from ..outage import OutageReporter
from ..subscription import Subscription

logger = logging.getLogger(__name__)

#: Heartbeat rows not renewed for this long are deleted (the group stays known through
#: its watermark rows).
FORGET_SUBSCRIBERS_AFTER = 24 * 3600.0
#: Seconds between a worker's history samples (a minute keeps its last).
LAG_SAMPLE_INTERVAL = 20.0
#: Seconds of garbage collection one poll-loop round may spend (a statement in progress
#: finishes: each aims at store/gc.py's TARGET_SECONDS).
ROUND_BUDGET = 0.25


class GarbageCollector:
    """Collects the held partitions of ``subscriptions`` when :meth:`run_if_due` finds it due."""

    def __init__(
        self,
        subscriptions: Sequence[Subscription],
        store: QueueStore,
        conf: QueueSettings,
        *,
        db: Retrying,
        outage: OutageReporter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.subscriptions = subscriptions
        self.store = store
        self.conf = conf
        self.db = db
        self.outage = outage
        self.clock = clock
        self._last = clock()
        self._sampled: float | None = None  # the first lag sample is taken at once
        #: (group, topic) pairs whose last pass ran out of budget, and the seq it stopped at.
        self._resume: dict[tuple[str, str], int] = {}

    def run_if_due(self) -> None:
        """Collect if ``GC_INTERVAL`` passed since the last pass (the first pass waits one
        interval) or the last pass left work; sample the lags if ``LAG_SAMPLE_INTERVAL``
        passed since the last sample."""
        now = self.clock()
        if self.conf.HISTORY_RETENTION > 0 and (self._sampled is None or now - self._sampled >= LAG_SAMPLE_INTERVAL):
            self._sampled = now
            self.sample_lags()
        if self._resume:
            self.run(only=set(self._resume))
        elif now - self._last >= self.conf.GC_INTERVAL:
            self._last = now
            self.run()

    def sample_lags(self) -> int:
        """Write every (group, topic)'s totals and lag into this minute's history; return the pairs written."""
        store = self.store
        try:
            return self.db("sample history", store.sample)
        except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
            self.outage.failure(logger, exc, "sampling the lags for the history failed")
            close_quietly(store.using)
            return 0

    def run(self, only: set[tuple[str, str]] | None = None) -> int:
        """Collect the held partitions of every subscription (of the (group, topic) pairs
        ``only``: the passes left unfinished) for at most :data:`ROUND_BUDGET` seconds;
        return messages deleted."""
        total = 0
        deadline = self.clock() + ROUND_BUDGET
        for sub in self.subscriptions:
            pair = (sub.group, sub.topic)
            if only is not None and pair not in only:
                continue
            budget = deadline - self.clock()
            if budget <= 0:  # the round's time is spent: this one goes first next round
                self._resume.setdefault(pair, 0)
                continue
            try:
                gc_pass = self.db(
                    "garbage collection",
                    partial(
                        self.store.garbage_pass,
                        sub.topic,
                        sorted(sub.held),
                        self.conf.RETENTION,
                        budget=budget,
                        start=self._resume.pop(pair, 0),
                    ),
                )
                if only is None:
                    self.db(
                        "forget subscribers",
                        partial(self.store.forget_subscribers, sub.topic, FORGET_SUBSCRIBERS_AFTER),
                    )
            except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                self.outage.failure(logger, exc, "garbage collection failed topic=%s", sub.topic)
                close_quietly(self.store.using)
                continue
            if not gc_pass.done:
                self._resume[pair] = gc_pass.resume
            if gc_pass.deleted:
                logger.log(
                    logging.INFO if gc_pass.done else logging.DEBUG,
                    "garbage-collected %d messages topic=%s%s",
                    gc_pass.deleted,
                    sub.topic,
                    "" if gc_pass.done else " (more left: going on next round)",
                )
            total += gc_pass.deleted
        if only is not None:
            return total
        self._prune("per-hour counter", self.store.prune_topic_hours, self.conf.STATS_RETENTION, "STATS_RETENTION")
        if self.conf.HISTORY_RETENTION > 0:
            self._prune("history", self.store.prune_history, self.conf.HISTORY_RETENTION, "HISTORY_RETENTION")
        return total

    def _prune(self, what: str, prune: Callable[[float], int], retention: float, setting: str) -> None:
        """Delete the ``what`` rows older than ``retention`` (every topic's); an outage is reported."""
        try:
            pruned = self.db(f"prune {what}", partial(prune, retention))
        except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
            self.outage.failure(logger, exc, "pruning the %s rows failed", what)
            close_quietly(self.store.using)
        else:
            if pruned:
                logger.info("pruned %d %s rows older than %s", pruned, what, setting)
