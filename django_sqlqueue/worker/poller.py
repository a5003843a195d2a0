"""Planning one poll of one subscription: which partitions, which messages, to whom.

Per poll and subscription (see ``loop.py`` for the cadence):

1. ``poll_state``: one query over the leased partitions that may have work. Partitions
   with committed messages not numbered yet are sequenced (``db/sequencer.py``); watermarks
   that can pass acked rows are advanced (``db/store/acks.py``). A partition without the
   group's watermark row is skipped and reported to the lease keeper, which creates
   watermark rows (``threads/leasing.py``). On PostgreSQL the query and the sequencing
   round are one statement (``PollStore.poll_and_sequence``);
2. ``fetch``: one query for the fresh and due messages of every partition with work (with
   handler threads, no more partitions than threads are free, rotating);
3. select each partition's batch: the lowest deliverable offsets up to ``batch_size``;
   delayed messages are parked, messages out of attempts are dead-lettered;
4. ``mark_delivered``: one transaction recording the deliveries before any handler runs,
   fenced by the leases -- a partition lost since the poll began delivers nothing;
5. the batches run (``batch/runner.py``), handed in one call to the worker's dispatch
   strategy, chosen when the worker was built (``dispatch.py``): on this thread when no
   handler of the worker has a timeout and ``--concurrency`` is 1; otherwise on handler
   threads (``threads/executor.py``), one batch per partition -- with ``--concurrency 1``
   the poll waits for them, watching their timeouts (``threads/watchdog.py``).

A partition whose batch is still on a handler thread is not polled again until its
outcomes are written, so order within a partition holds.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from dataclasses import replace

from ..conf import QueueSettings
from ..db.retry import Retrying
from ..db.sequencer import Sequencer, StaleReadAhead
from ..db.store import FetchedMessage, FetchPlan, PartitionState, QueueStore
from ..instruments import NO_INSTRUMENTS, Instruments
from .batch.outcomes import attempt_number, expired_error
from .batch.runner import BatchRunner
from .dispatch import Dispatch
from .subscription import Subscription

# A child of "django_sqlqueue.worker": configuring that logger still catches these records.
logger = logging.getLogger(__name__)


class Poller:
    """Runs polls for one worker; see the module docstring."""

    def __init__(
        self,
        store: QueueStore,
        sequencer: Sequencer,
        conf: QueueSettings,
        *,
        db: Retrying,
        dispatch: Dispatch,
        instruments: Instruments = NO_INSTRUMENTS,
    ) -> None:
        """``dispatch`` runs the poll's batches (``dispatch.py``); its batch runner also
        dead-letters the messages out of attempts that a poll meets."""
        self.store = store
        self.sequencer = sequencer
        self.conf = conf
        self.db = db
        self.dispatch = dispatch
        self.batches: BatchRunner = dispatch.batches
        self.instruments = instruments
        self._turn = 0

    def poll(self, sub: Subscription) -> tuple[int, bool]:
        """Deliver one batch per partition with work; return (messages handled, any batch full)."""
        with sub.poll_lock:  # the lease keeper hands partitions over between polls
            if not sub.held:
                return 0, False
            return self._poll(sub, time.perf_counter())

    def _poll(self, sub: Subscription, started: float) -> tuple[int, bool]:
        group, topic = sub.group, sub.topic
        by_key = self._states(sub)
        plans = self._plans(sub, by_key)
        free = self.dispatch.slots()
        if free is not None:
            plans = self._share_slots(plans, free)
        if not plans:
            self.instruments.polled(group, topic, time.perf_counter() - started, 0)
            return 0, False
        logger.debug(
            "poll group=%s topic=%s leased=%d with_work=%d partitions=%s",
            group,
            topic,
            len(sub.held),
            len(plans),
            [p.partition for p in plans],
        )
        limit = sub.options.batch_size
        fetched = self.db("fetch", lambda: self.store.fetch(group, topic, plans, limit))
        batches, parked, full = self._select(sub, fetched, by_key)
        if not batches and not parked:
            self.instruments.polled(group, topic, time.perf_counter() - started, 0)
            return 0, False
        for key, batch in batches.items():
            logger.debug(
                "batch group=%s topic=%s partition=%d size=%d offsets=%d-%d",
                group,
                topic,
                key,
                len(batch),
                batch[0].offset,
                batch[-1].offset,
            )
        if parked:
            logger.debug("parked delayed messages group=%s topic=%s count=%d", group, topic, len(parked))
        batches = self._mark_delivered(sub, batches, parked)
        self.instruments.polled(group, topic, time.perf_counter() - started, len(batches))
        for batch in batches.values():
            self.instruments.batch(group, topic, len(batch))
        watermarks = {key: by_key[key].watermark for key in batches}
        handled = self.dispatch.run(sub, batches, watermarks)
        # Parking delayed messages is progress too: poll again at once, or ready messages
        # behind many delayed ones would wait through idle backoff.
        return handled, full or bool(parked)

    def _states(self, sub: Subscription) -> dict[int, PartitionState]:
        """The poll state of the held partitions this poll may deliver, by partition, in
        the order the store returned them; unsequenced messages are numbered first."""
        group, topic = sub.group, sub.topic
        began = time.perf_counter()
        fused = self._poll_and_sequence(sub)
        if fused is not None:
            states, heads = fused
        else:
            states = self.db(
                "poll state", lambda: self.store.poll_state(group, topic, sub.name, self.conf.LEASE_DURATION)
            )
            heads = {}
        busy = sub.in_flight.snapshot()
        # A partition whose batch is still on a handler thread is left alone (order).
        states = [s for s in states if s.partition in sub.held and s.partition not in busy]
        missing = frozenset(s.partition for s in states if not s.has_offsets_row)
        if missing:
            # Left to the lease keeper, which creates watermark rows (normally when it
            # takes a lease; a failure there, or an operator, can leave one missing).
            sub.report_missing(missing)
            states = [s for s in states if s.has_offsets_row]
        by_key: dict[int, PartitionState] = {s.partition: s for s in states}
        unsequenced = [s.partition for s in states if s.unsequenced]
        if unsequenced and fused is None:
            began = time.perf_counter()
            heads = self.db("sequence", lambda: self.sequencer.sequence(topic, unsequenced))
        if heads:
            numbered = sum(head - by_key[p].head for p, head in heads.items() if p in by_key)
            self.instruments.sequenced(topic, time.perf_counter() - began, numbered)
        for partition, head in heads.items():
            if partition in by_key:
                by_key[partition] = replace(by_key[partition], head=head)
        return by_key

    def _poll_and_sequence(self, sub: Subscription) -> tuple[list[PartitionState], dict[int, int]] | None:
        """PostgreSQL: the poll state and the sequencing round in one statement
        (``PollStore.poll_and_sequence``): the states, and the new heads of the partitions
        numbered. None: the database has no such statement, or a row vanished before the
        round (a purge): the caller polls the separate way, whose sequencer reads afresh."""
        fragment = self.sequencer.round_fragment(sub.topic, "todo.parts")
        if fragment is None:
            return None

        def poll() -> tuple[list[PartitionState], dict[int, int]]:
            with self.sequencer.stale_read_ahead(sub.topic):
                return self.store.poll_and_sequence(sub.group, sub.topic, sub.name, self.conf.LEASE_DURATION, fragment)

        try:
            return self.db("poll state", poll)
        except StaleReadAhead:
            return None

    def _plans(self, sub: Subscription, by_key: dict[int, PartitionState]) -> list[FetchPlan]:
        """What to fetch of each partition (fresh messages, due ones); watermarks that can
        pass acked rows are advanced first (``by_key`` gets the new ones)."""
        group, topic = sub.group, sub.topic
        plans: list[FetchPlan] = []
        for state in list(by_key.values()):
            if state.advanceable:
                key, wm = state.partition, state.watermark
                new = self.db(
                    "advance watermark",
                    functools.partial(self.store.advance_watermark, group, topic, sub.name, key, wm),
                )
                state = by_key[key] = _with_watermark(state, new)
            fresh_after = max(state.watermark, state.delivered_max or 0)
            fresh = state.head > fresh_after
            due = state.next_due is not None and state.next_due <= state.now
            if sub.strict and state.in_flight:
                continue  # strict serialization: wait for the message in flight
            if fresh or due:
                plans.append(FetchPlan(state.partition, fresh_after if fresh else None, due))
        return plans

    def _mark_delivered(
        self, sub: Subscription, batches: dict[int, list[FetchedMessage]], parked: list[FetchedMessage]
    ) -> dict[int, list[FetchedMessage]]:
        """Record the deliveries (and the parked messages); return the batches to run."""
        first = [m for batch in batches.values() for m in batch if m.retry_count is None]
        again = [m for batch in batches.values() for m in batch if m.retry_count is not None]
        timeout = sub.options.visibility_timeout
        held = self.db(
            "mark delivered",
            lambda: self.store.mark_delivered(sub.group, sub.topic, sub.name, first, again, parked, timeout),
        )
        # A partition whose lease was lost since the poll began (stolen after expiry,
        # released by an operator) was not recorded: deliver none of its messages.
        return {key: batch for key, batch in batches.items() if key in held}

    def _share_slots(self, plans: list[FetchPlan], free: int) -> list[FetchPlan]:
        """Fetch no more partitions than there are ``free`` handler threads, rotating the
        start so that every partition with work gets its turn."""
        if len(plans) <= free:
            return plans
        self._turn = (self._turn + 1) % len(plans)
        rotated = plans[self._turn :] + plans[: self._turn]
        return rotated[:free]

    def _select(
        self, sub: Subscription, fetched: list[FetchedMessage], states: dict[int, PartitionState]
    ) -> tuple[dict[int, list[FetchedMessage]], list[FetchedMessage], bool]:
        """Choose each partition's batch: the lowest deliverable offsets, up to batch_size.

        Fresh messages whose ``deliver_at`` lies ahead are parked, not delivered; messages
        delivered ``max_attempts`` times already go to the DLQ without another attempt.
        A row that could not be decoded is delivered like any other: its batch
        dead-letters it in offset order, without calling the handler (``batch/runner.py``).
        """
        by_key: dict[int, list[FetchedMessage]] = defaultdict(list)
        for m in fetched:
            by_key[m.partition].append(m)
        limit, max_attempts = sub.options.batch_size, sub.options.max_attempts
        batches: dict[int, list[FetchedMessage]] = {}
        parked: list[FetchedMessage] = []
        full = False
        for key, messages in by_key.items():
            now = states[key].now
            batch: list[FetchedMessage] = []
            for m in sorted(messages, key=lambda m: m.offset):
                if m.retry_count is None and m.deliver_at > now:
                    parked.append(m)
                    continue
                if len(batch) >= limit:
                    full = True
                    break
                if attempt_number(m) > max_attempts:
                    error = m.undecodable or expired_error(m, sub)
                    self.batches.dead_letter(sub, m, attempt_number(m) - 1, error)
                    continue
                batch.append(m)
            if len(batch) >= limit:
                full = True
            if batch:
                batches[key] = batch
        return batches, parked, full


def _with_watermark(state: PartitionState, watermark: int) -> PartitionState:
    return replace(state, watermark=watermark, advanceable=False)
