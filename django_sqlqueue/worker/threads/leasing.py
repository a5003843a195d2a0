"""The lease keeper: heartbeats, fair share, lease renewal and acquisition.

It runs on its own thread with its own database connection, so a slow handler on the
poll loop never delays a renewal. Every ``LEASE_RENEW_INTERVAL`` it does, for each
subscription:

1. heartbeat (``queue_subscriber_heartbeats``);
2. fair share: the cap is floor(partitions / live subscribers), plus one for the first
   ``partitions % live`` subscribers in the sorted list of live names, so the caps add
   up to the partition count exactly (a cap of ceil(partitions / live) for everyone
   could leave the last subscriber with far less than its share: 26 of 4,096 partitions
   instead of 54 among 75 workers). If computing it fails, no cap (availability over
   fairness, as the RFC says);
3. renew its leases -- a lease another subscriber stole after it expired is not
   renewed, and the partition drops out of ``held``;
4. release the excess over the cap: the last ones in sorted key order, so the same
   partitions are given up every time;
5. acquire free or expired partitions up to the cap (a few statements per round however
   many partitions: see ``store/leases.py``). Each live subscriber has a rank in the
   sorted list of live names, and prefers the partitions ``p`` with ``p % live == rank``:
   workers that compute their share at the same moment ask for disjoint partitions
   instead of racing for the same ones, so each first acquisition is a whole share.
   Within a preference the order is seeded by the subscriber name.

A (group, topic) paused by an operator (``queue_paused_topics``) holds nothing: the
round releases its leases and takes none. Topics with one partition per key get head
rows for new keys first (``discover_partitions``).

Workers that start together share partitions from the start: the first round
heartbeats, then waits ``STARTUP_SETTLE`` seconds so that every worker started at about
the same time is counted before anyone computes its share.

Between rounds it checks membership every ``MEMBERSHIP_CHECK_INTERVAL`` (when that is
shorter than the renew interval): if the number of live subscribers changed, or it holds
fewer partitions than its share while some are free, it runs a round at once. So a
worker that starts next to one holding every partition gets its share within about a
second, not a whole renew interval later.

It is the one place that creates the group's watermark rows: for the partitions it
acquires, and for held partitions the poll found without one (``sub.missing_offsets``,
taken with ``Subscription.take_missing``).

It owns ``Subscription.held``: each round ends by settling it to the leases the database
renewed and granted (``Subscription.settle``). The poll loop's watchdog may give a
partition up meanwhile (a handler timeout); ``settle`` leaves such a partition out when the
round read its lease before the give-up released it (``subscription.py``).

It is a :class:`~django_sqlqueue.worker.threads.service.ServiceThread`: if it dies, the worker stops
and exits non-zero rather than poll on with leases nobody renews.

Failures caused by an unreachable database go to the worker's
:class:`~django_sqlqueue.worker.outage.OutageReporter` (a few lines per outage, shared with the
poll loop); other failures are logged with their traceback.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from functools import partial

from ...conf import QueueSettings
from ...db.session import engine_connections
from ...db.store import QueueStore
from ...instruments import NO_INSTRUMENTS, Instruments
from ..outage import OutageReporter, is_unreachable
from ..subscription import Subscription
from .service import ServiceThread

logger = logging.getLogger(__name__)

#: Seconds between cheap membership checks (two small queries per subscription).
MEMBERSHIP_CHECK_INTERVAL = 1.0
#: Seconds between the first heartbeat and the first share computation (at most a third
#: of the lease duration).
STARTUP_SETTLE = 1.0


class LeaseKeeper(ServiceThread):
    """Keeps the leases of a worker's subscriptions; see the module docstring."""

    thread_name = "sqlqueue-lease-keeper"
    title = "lease keeper"

    def __init__(
        self,
        subscriptions: list[Subscription],
        store: QueueStore,
        conf: QueueSettings,
        *,
        outage: OutageReporter | None = None,
        instruments: Instruments = NO_INSTRUMENTS,
    ) -> None:
        super().__init__(
            using=store.using,
            outage=outage or OutageReporter(alias=store.using, report_interval=conf.OUTAGE_REPORT_INTERVAL),
            stop_timeout=conf.LEASE_DURATION,
        )
        self.subscriptions = subscriptions
        self.store = store
        self.conf = conf
        self.instruments = instruments

    def body(self) -> None:
        renew = self.conf.LEASE_RENEW_INTERVAL
        with engine_connections(self.using, self.conf.LEASE_DURATION - renew):
            self.announce()
            self.stop_event.wait(min(STARTUP_SETTLE, self.conf.LEASE_DURATION / 3))
            next_round = 0.0
            while not self.stop_event.is_set():
                if time.monotonic() >= next_round:
                    self.tick()
                    next_round = time.monotonic() + renew
                else:
                    self.check_membership()
                wait = min(MEMBERSHIP_CHECK_INTERVAL, next_round - time.monotonic())
                self.stop_event.wait(max(0.0, wait))

    def announce(self) -> None:
        """Heartbeat every subscription once, so workers starting together count each other."""
        for sub in self.subscriptions:
            try:
                self.db("heartbeat", partial(self.store.heartbeat, sub.group, sub.topic, sub.name))
            except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                self.failed(exc, "heartbeat failed group=%s topic=%s", sub.group, sub.topic)

    def check_membership(self) -> None:
        """Run a round now for subscriptions whose group changed or that could take more."""
        store, lease = self.store, self.conf.LEASE_DURATION
        for sub in self.subscriptions:
            try:
                # Taken and emptied in one step under the subscription's lock: a poll that
                # reports meanwhile adds to the emptied set, for the next look.
                missing = sub.take_missing()
                if missing:
                    self.db("create watermarks", partial(store.ensure_offsets, sub.group, sub.topic, sorted(missing)))
                active = self.db("count subscribers", partial(store.active_subscribers, sub.group, sub.topic, lease))
                hungry = sub.cap is not None and len(sub.held) < sub.cap
                if active != sub.active or (
                    hungry
                    and self.db("find free partitions", partial(store.free_partitions, sub.group, sub.topic, lease))
                ):
                    self.rebalance(sub)
            except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                self.failed(exc, "membership check failed group=%s topic=%s", sub.group, sub.topic)
            else:
                self.outage.reachable()

    # -- one round -----------------------------------------------------------------------

    def tick(self) -> None:
        """Run one round for every subscription; errors are logged, never fatal."""
        for sub in self.subscriptions:
            try:
                self.rebalance(sub)
            except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                self.failed(exc, "lease round failed group=%s topic=%s", sub.group, sub.topic)
            else:
                self.outage.reachable()
            finally:
                sub.ready.set()

    def fair_share(self, sub: Subscription) -> int | None:
        """This subscriber's share, or None (no cap) if it cannot be computed.

        The share is floor(partitions / live), plus one if this subscriber's rank in the
        sorted live names is below ``partitions % live``: every live subscriber computes
        the same split, and the shares add up to the partitions, so a subscriber below its
        share always finds the partitions it lacks released by those above theirs. The
        larger shares go to the ranks whose preferred slice (``p % live == rank``) is the
        larger one. A subscriber not in the list yet (its heartbeat unseen) takes
        ceil(partitions / live). Never less than 1. Also records ``sub.rank``.
        """
        store, lease = self.store, self.conf.LEASE_DURATION
        try:
            names = self.db("list subscribers", lambda: store.active_subscriber_names(sub.group, sub.topic, lease))
            total = self.db("count partitions", lambda: store.partition_count(sub.topic))
        except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
            self.outage.failure(
                logger, exc, "fair share failed, acquiring without a cap group=%s topic=%s", sub.group, sub.topic
            )
            sub.active = sub.cap = sub.rank = None
            return None
        active = len(names)
        sub.rank = names.index(sub.name) if sub.name in names else None
        sub.active = active
        if sub.rank is None:
            share = math.ceil(total / max(active, 1))
        else:
            base, extra = divmod(total, active)
            share = base + (1 if sub.rank < extra else 0)
        sub.cap = max(1, share)
        return sub.cap

    def rebalance(self, sub: Subscription) -> None:
        store, lease = self.store, self.conf.LEASE_DURATION
        group, topic, name = sub.group, sub.topic, sub.name
        # Before the round reads any lease: partitions the watchdog gives up from here on
        # are left out of what the round settles ``held`` to.
        sub.start_lease_round()
        self.db("heartbeat", lambda: store.heartbeat(group, topic, name))
        if sub.per_key:
            self.db("discover partitions", lambda: store.discover_partitions(topic))
        if self.db("check pause", lambda: store.paused(group, topic)):
            if not sub.paused:
                logger.warning("paused by an operator, releasing leases group=%s topic=%s", group, topic)
            self.hand_over(sub, frozenset(), None)
            sub.paused = True
            return
        if sub.paused:
            logger.warning("resumed by an operator group=%s topic=%s", group, topic)
            sub.paused = False
        cap = self.fair_share(sub)
        held = self.db("renew leases", lambda: store.renew_leases(group, topic, name))
        logger.debug(
            "renewed leases group=%s topic=%s subscriber=%s held=%d cap=%s active=%s",
            group,
            topic,
            name,
            len(held),
            cap,
            sub.active,
        )
        lost = sub.held - set(held)
        if lost:
            logger.warning("lost leases group=%s topic=%s partitions=%s", group, topic, sorted(lost))
            self.instruments.leases(group, topic, lost=len(lost))
        if cap is not None and len(held) > cap:
            excess = held[cap:]
            self.hand_over(sub, frozenset(held[:cap]), excess)
            logger.info("released leases over fair share %d group=%s topic=%s partitions=%s", cap, group, topic, excess)
            held = held[:cap]
        wanted = None if cap is None else cap - len(held)
        if wanted is None or wanted > 0:
            free = self.db("find free partitions", lambda: store.free_partitions(group, topic, lease))
            free.sort(key=lambda p: self._preference(sub, p))
            candidates = free if wanted is None else free[:wanted]
            taken = (
                self.db("acquire leases", lambda: store.acquire_leases(group, topic, candidates, name, lease))
                if candidates
                else []
            )
            if len(taken) < len(candidates):
                logger.debug(
                    "leases taken by another subscriber group=%s topic=%s partitions=%s",
                    group,
                    topic,
                    sorted(set(candidates) - set(taken)),
                )
            if taken:
                self.db("create watermarks", partial(store.ensure_offsets, group, topic, taken))
                logger.info("acquired leases group=%s topic=%s partitions=%s", group, topic, taken)
                self.instruments.leases(group, topic, acquired=len(taken))
                held = sorted({*held, *taken})
        sub.settle(held)

    @staticmethod
    def _preference(sub: Subscription, partition: int) -> tuple[bool, bytes]:
        """Sort key for free partitions: this subscriber's own slice first, then a seeded order."""
        live, rank = sub.active, sub.rank
        mine = rank is not None and live is not None and live > 0 and partition % live == rank
        seeded = hashlib.blake2b(f"{sub.name}\0{partition}".encode(), digest_size=8).digest()
        return (not mine, seeded)

    def hand_over(self, sub: Subscription, keep: frozenset[int], release: list[int] | None) -> None:
        """Release leases (``release``, or all) after the poll loop finished its batch of them.

        The poll loop stops taking new batches of a partition once it is out of
        ``sub.held``; a batch already in the handlers finishes and is acked before the
        lease goes, so a rebalance does not redeliver it to the next holder (writes of a
        worker that no longer holds a lease are dropped, see ``store/acks.py``). A batch
        that takes longer than a third of the lease is not waited for: at-least-once.
        """
        given_up = len(release) if release is not None else len(sub.held - keep)
        sub.settle(keep)
        budget = self.conf.LEASE_DURATION / 3
        deadline = time.monotonic() + budget
        got = sub.poll_lock.acquire(timeout=budget)
        try:
            # With --concurrency > 1 a batch of the partition may still run on a handler
            # thread after the poll that dispatched it returned: wait for it as well. No
            # new batch of it can start: it is out of ``held`` and we hold the poll lock.
            sub.in_flight.wait_idle(release, timeout=max(0.0, deadline - time.monotonic()))
            self.db("release leases", lambda: self.store.release_leases(sub.group, sub.topic, sub.name, release))
            if given_up:
                self.instruments.leases(sub.group, sub.topic, released=given_up)
        finally:
            if got:
                sub.poll_lock.release()

    def release_all(self) -> None:
        """Graceful shutdown: give every partition back and deregister, so others take over at once."""
        for sub in self.subscriptions:
            try:
                self.db("release leases", partial(self.store.release_leases, sub.group, sub.topic, sub.name))
                if sub.held:
                    self.instruments.leases(sub.group, sub.topic, released=len(sub.held))
                self.db("deregister", partial(self.store.deregister, sub.group, sub.topic, sub.name))
                sub.settle(())
                logger.info("released all leases group=%s topic=%s subscriber=%s", sub.group, sub.topic, sub.name)
            except Exception as exc:
                if is_unreachable(exc):
                    logger.warning(
                        "could not release leases, database unreachable; they expire in %gs group=%s topic=%s",
                        self.conf.LEASE_DURATION,
                        sub.group,
                        sub.topic,
                    )
                else:
                    logger.exception("could not release leases group=%s topic=%s", sub.group, sub.topic)
