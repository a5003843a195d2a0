"""The lease keeper: heartbeats, fair share, lease renewal and acquisition, GC.

It runs on its own thread with its own database connection, so a slow handler on the
poll loop never delays a renewal. Every ``LEASE_RENEW_INTERVAL`` it does, for each
subscription:

1. heartbeat (``queue_subscriber_heartbeats``);
2. fair share: cap = ceil(partitions / live subscribers); if computing it fails, no cap
   (availability over fairness, as the RFC says);
3. renew its leases -- a lease another subscriber stole after it expired is not
   renewed, and the partition drops out of ``held``;
4. release the excess over the cap: the last ones in sorted key order, so the same
   partitions are given up every time;
5. acquire free or expired partitions up to the cap, in an order seeded by the
   subscriber name so that newcomers do not all race for the same keys.

Between rounds it checks membership every ``MEMBERSHIP_CHECK_INTERVAL`` (when that is
shorter than the renew interval): if the number of live subscribers changed, or it holds
fewer partitions than its share while some are free, it runs a round at once. So a
worker that starts next to one holding every partition gets its share within about a
second, not a whole renew interval later.

Every ``GC_INTERVAL`` it also garbage-collects the partitions it holds.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time

from django.db import connections

from .conf import QueueSettings
from .retry import with_retries
from .store import QueueStore
from .subscription import Subscription

logger = logging.getLogger(__name__)

#: Heartbeat rows not renewed for this long are deleted (the group stays known through
#: its watermark rows).
FORGET_SUBSCRIBERS_AFTER = 24 * 3600.0
#: Seconds between cheap membership checks (two small queries per subscription).
MEMBERSHIP_CHECK_INTERVAL = 1.0


class LeaseKeeper:
    """Keeps the leases of a worker's subscriptions; see the module docstring."""

    def __init__(self, subscriptions: list[Subscription], store: QueueStore, conf: QueueSettings) -> None:
        self.subscriptions = subscriptions
        self.store = store
        self.conf = conf
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_gc = time.monotonic()

    # -- thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqlqueue-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=self.conf.LEASE_DURATION)

    def _run(self) -> None:
        renew = self.conf.LEASE_RENEW_INTERVAL
        try:
            next_round = 0.0
            while not self.stop_event.is_set():
                if time.monotonic() >= next_round:
                    self.tick()
                    next_round = time.monotonic() + renew
                else:
                    self.check_membership()
                wait = min(MEMBERSHIP_CHECK_INTERVAL, next_round - time.monotonic())
                self.stop_event.wait(max(0.0, wait))
        finally:
            connections.close_all()

    def check_membership(self) -> None:
        """Run a round now for subscriptions whose group changed or that could take more."""
        store, lease = self.store, self.conf.LEASE_DURATION
        for sub in self.subscriptions:
            try:
                active = self._db(
                    "count subscribers", lambda sub=sub: store.active_subscribers(sub.group, sub.topic, lease)
                )
                hungry = sub.cap is not None and len(sub.held) < sub.cap
                if active != sub.active or (
                    hungry
                    and self._db(
                        "find free partitions", lambda sub=sub: store.free_partitions(sub.group, sub.topic, lease)
                    )
                ):
                    self.rebalance(sub)
            except Exception:
                logger.exception("membership check failed group=%s topic=%s", sub.group, sub.topic)
                connections[self.store.using].close()

    # -- one round -----------------------------------------------------------------------

    def tick(self) -> None:
        """Run one round for every subscription; errors are logged, never fatal."""
        for sub in self.subscriptions:
            try:
                self.rebalance(sub)
            except Exception:
                logger.exception("lease round failed group=%s topic=%s", sub.group, sub.topic)
                connections[self.store.using].close()
            finally:
                sub.ready.set()
        if time.monotonic() - self._last_gc >= self.conf.GC_INTERVAL:
            self._last_gc = time.monotonic()
            self.collect_garbage()

    def _db(self, what: str, fn):  # type: ignore[no-untyped-def]
        return with_retries(fn, using=self.store.using, what=what)

    def fair_share(self, sub: Subscription) -> int | None:
        """ceil(partitions / live subscribers), or None (no cap) if it cannot be computed."""
        store, lease = self.store, self.conf.LEASE_DURATION
        try:
            active = self._db("count subscribers", lambda: store.active_subscribers(sub.group, sub.topic, lease))
            total = len(self._db("list partitions", lambda: store.partitions(sub.topic)))
        except Exception:
            logger.exception("fair share failed, acquiring without a cap group=%s topic=%s", sub.group, sub.topic)
            sub.active = sub.cap = None
            return None
        sub.active = active
        sub.cap = max(1, math.ceil(total / max(active, 1)))
        return sub.cap

    def rebalance(self, sub: Subscription) -> None:
        store, lease = self.store, self.conf.LEASE_DURATION
        group, topic, name = sub.group, sub.topic, sub.name
        self._db("heartbeat", lambda: store.heartbeat(group, topic, name))
        cap = self.fair_share(sub)
        held = self._db("renew leases", lambda: store.renew_leases(group, topic, name))
        lost = sub.held - set(held)
        if lost:
            logger.warning("lost leases group=%s topic=%s keys=%s", group, topic, sorted(lost))
        if cap is not None and len(held) > cap:
            excess = held[cap:]
            self._db("release leases", lambda: store.release_leases(group, topic, name, excess))
            logger.info("released leases over fair share %d group=%s topic=%s keys=%s", cap, group, topic, excess)
            held = held[:cap]
        wanted = None if cap is None else cap - len(held)
        if wanted is None or wanted > 0:
            free = self._db("find free partitions", lambda: store.free_partitions(group, topic, lease))
            free.sort(key=lambda key: hashlib.blake2b(f"{name}\0{key}".encode(), digest_size=8).digest())
            taken: list[str] = []
            for key in free:
                if wanted is not None and len(taken) >= wanted:
                    break
                if self._db("acquire lease", lambda key=key: store.acquire_lease(group, topic, key, name, lease)):
                    taken.append(key)
            if taken:
                self._db("create watermarks", lambda: store.ensure_offsets(group, topic, taken))
                logger.info("acquired leases group=%s topic=%s keys=%s", group, topic, sorted(taken))
                held = sorted({*held, *taken})
        sub.held = frozenset(held)

    def release_all(self) -> None:
        """Graceful shutdown: give every partition back and deregister, so others take over at once."""
        for sub in self.subscriptions:
            try:
                self._db("release leases", lambda sub=sub: self.store.release_leases(sub.group, sub.topic, sub.name))
                self._db("deregister", lambda sub=sub: self.store.deregister(sub.group, sub.topic, sub.name))
                sub.held = frozenset()
                logger.info("released all leases group=%s topic=%s subscriber=%s", sub.group, sub.topic, sub.name)
            except Exception:
                logger.exception("could not release leases group=%s topic=%s", sub.group, sub.topic)

    def collect_garbage(self) -> None:
        for sub in self.subscriptions:
            keys = sorted(sub.held)
            try:
                deleted = self._db(
                    "garbage collection",
                    lambda sub=sub, keys=keys: self.store.collect_garbage(sub.topic, keys, self.conf.RETENTION),
                )
                self._db(
                    "forget subscribers",
                    lambda sub=sub: self.store.forget_subscribers(sub.topic, FORGET_SUBSCRIBERS_AFTER),
                )
                if deleted:
                    logger.info("garbage-collected %d messages topic=%s", deleted, sub.topic)
            except Exception:
                logger.exception("garbage collection failed topic=%s", sub.topic)
