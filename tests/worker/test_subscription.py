"""One consumer's state in a worker (django_sqlqueue/worker/subscription.py): who writes what.

``held`` belongs to the lease keeper, which the poll loop's watchdog may take a partition
from; ``missing_offsets`` is reported by the poll loop and taken by the keeper. The first
tests drive a real keeper and a real poll against the database and put the other
thread's write exactly where it used to be lost: between the keeper's read of the
database (or of the reports) and its write. The interleaving is forced from the test
(the keeper's retrying ``db`` runs the give-up right after its renewal; the reports'
set runs the poll while the keeper reads it); nothing mocks the database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from django_sqlqueue.models import ConsumerOffset, PartitionLease
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.subscription import PartitionsInFlight, Subscription
from django_sqlqueue.worker.threads.executor import PartitionExecutor
from django_sqlqueue.worker.threads.watchdog import Watchdog

from ..support.engine_helpers import fast_conf, publish_to, spec, watermark

pytestmark = pytest.mark.django_db(transaction=True)


def noop(message: object) -> None:
    pass


def leases_of(name: str, topic: str) -> frozenset[int]:
    return frozenset(PartitionLease.objects.filter(topic=topic, leased_by=name).values_list("partition", flat=True))


class ThenAfter:
    """A keeper's retrying ``db`` that runs ``then()`` once, right after the real step ``what``."""

    def __init__(self, db: Callable[[str, Callable[[], Any]], Any], what: str, then: Callable[[], None]) -> None:
        self.db, self.what, self.then = db, what, then

    def __call__(self, what: str, fn: Callable[[], Any]) -> Any:
        result = self.db(what, fn)
        if what == self.what and self.then is not None:
            then, self.then = self.then, None
            then()
        return result


def test_a_partition_the_watchdog_gives_up_during_a_lease_round_stays_given_up():
    """The watchdog gives partition 2 up (a handler timed out) after the keeper renewed its
    leases and before it settles ``held``: the round must not put 2 back, or the poll loop
    would go on delivering a partition whose lease is gone (review item 2)."""
    topic = "sub.give-up"
    conf = fast_conf(TOPICS={topic: {"partitions": 4}})
    worker = Worker([spec(topic, "g", noop)], name="one", conf=conf)
    worker.register_topics()
    sub, keeper = worker.subscriptions[0], worker.keeper
    keeper.rebalance(sub)
    assert sub.held == frozenset({0, 1, 2, 3}) == leases_of("one", topic)

    executor = PartitionExecutor(1)
    watchdog = Watchdog(executor, worker.store, worker.batches, db=worker.db, on_stuck=lambda dead: None)
    try:
        renewal = keeper.db
        keeper.db = ThenAfter(renewal, "renew leases", lambda: watchdog._release(sub, 2))
        keeper.rebalance(sub)  # renews 0-3, then the give-up, then the round settles `held`
    finally:
        executor.shutdown(5)
    assert leases_of("one", topic) == frozenset({0, 1, 3})  # the give-up released the lease
    assert sub.held == frozenset({0, 1, 3}), "the lease round put the given-up partition back"

    # The next round finds itself below its share and takes the partition again, as any
    # worker would: a new lease, delivered from the watermark.
    keeper.db = renewal
    keeper.rebalance(sub)
    assert sub.held == frozenset({0, 1, 2, 3}) == leases_of("one", topic)
    keeper.release_all()


def test_a_give_up_still_releasing_when_a_round_begins_is_not_undone_by_it():
    """The round may read the lease before the release lands: the give-up stays in force
    for that round too (``start_lease_round`` keeps what is still releasing)."""
    topic = "sub.give-up-early"
    conf = fast_conf(TOPICS={topic: {"partitions": 2}})
    worker = Worker([spec(topic, "g", noop)], name="one", conf=conf)
    worker.register_topics()
    sub, keeper = worker.subscriptions[0], worker.keeper
    keeper.rebalance(sub)
    with sub.giving_up(1):
        keeper.rebalance(sub)  # renews 0 and 1: the release has not happened yet
        assert sub.held == frozenset({0})
        worker.store.release_leases("g", topic, "one", [1])
    keeper.rebalance(sub)  # the give-up is over: partition 1 is free, and taken again
    assert sub.held == frozenset({0, 1})
    keeper.release_all()


class ReadWith(frozenset):
    """A set of reported partitions that runs ``meanwhile()`` when the keeper reads it."""

    meanwhile: Callable[[], None] | None = None

    def __iter__(self) -> Iterator[int]:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return super().__iter__()


def test_a_missing_watermark_reported_while_the_keeper_takes_the_reports_is_not_lost():
    """A poll on the poll loop's thread reports partition 1 without its watermark row
    while the keeper reads the earlier reports: the keeper's next look creates the row
    (before, its reset overwrote the report: a lost update, review item 2)."""
    topic = "sub.missing"
    worker = Worker([spec(topic, "g", noop, timeout=None)], name="one", conf=fast_conf())
    worker.register_topics()
    sub, keeper = worker.subscriptions[0], worker.keeper
    keeper.rebalance(sub)
    publish_to(topic, 1, 1)
    ConsumerOffset.objects.filter(consumer_group="g", topic=topic, partition=1).delete()

    def poll_loop_polls() -> None:
        def poll() -> None:
            try:
                assert worker.poll(sub) == (0, False)  # partition 1 is skipped and reported
            finally:
                connections.close_all()

        thread = threading.Thread(target=poll)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()

    reports = ReadWith({0})
    reports.meanwhile = poll_loop_polls
    sub.missing_offsets = reports  # an earlier report, being taken when the poll reports
    keeper.check_membership()
    assert reports.meanwhile is None  # the poll did run while the keeper read the reports
    keeper.check_membership()
    assert watermark("g", topic, 1) == 0, "the report made meanwhile was lost"
    keeper.release_all()


# -- the methods, on their own ---------------------------------------------------------------


def subscription() -> Subscription:
    return Subscription.create(spec("sub.unit", "g", noop), "one", fast_conf())


def test_settle_leaves_out_what_was_given_up_since_the_round_began():
    sub = subscription()
    sub.start_lease_round()
    assert sub.settle([0, 1, 2]) == frozenset({0, 1, 2}) == sub.held
    sub.start_lease_round()
    with sub.giving_up(1):
        assert sub.held == frozenset({0, 2})  # at once: no poll delivers it from here on
    assert sub.settle([0, 1, 2]) == frozenset({0, 2})  # this round read it before the release
    sub.start_lease_round()  # a new round reads the database after the release
    assert sub.settle([0, 1, 2]) == frozenset({0, 1, 2})  # ... and may take it again


def test_reports_of_missing_watermarks_add_up_until_taken():
    sub = subscription()
    sub.report_missing({1})
    sub.report_missing([3, 1])
    assert sub.take_missing() == frozenset({1, 3})
    assert sub.take_missing() == frozenset() == sub.missing_offsets


def test_partitions_in_flight_wait_for_the_named_partitions_only():
    in_flight = PartitionsInFlight()
    in_flight.add((1, 2))
    assert in_flight.snapshot() == frozenset({1, 2})
    assert in_flight.wait_idle([3], timeout=0)
    assert not in_flight.wait_idle([2], timeout=0.01)
    threading.Timer(0.05, in_flight.discard, args=((1, 2),)).start()
    assert in_flight.wait_idle(None, timeout=5)
