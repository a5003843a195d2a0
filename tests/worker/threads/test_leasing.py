"""The lease keeper (django_sqlqueue/worker/threads/leasing.py), one round at a time, without threads.

``LeaseKeeper.rebalance`` is called directly; assertions read the lease, heartbeat and
watermark rows. The keeper's thread and its supervision are tests/worker/threads/test_service.py.
"""

from __future__ import annotations

import pytest

from django_sqlqueue.instruments import Instruments
from django_sqlqueue.models import ConsumerOffset, PartitionLease, PausedTopic, SubscriberHeartbeat
from django_sqlqueue.worker.subscription import Subscription
from django_sqlqueue.worker.threads.leasing import LeaseKeeper

from ...support.engine_helpers import fast_conf, publish_to, spec, store, watermark
from ...support.factories import PausedTopicFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_lease_keeper_gives_back_the_last_partitions_over_its_fair_share():
    """LeaseKeeper.rebalance, one round at a time, without threads."""

    topic = "w.fair"
    parts = [0, 1, 2, 3, 4]
    conf = fast_conf(TOPICS={topic: {"partitions": 5}})
    assert store().register_topic(topic, 5) == 5  # as the workers do at start
    one = Subscription.create(spec(topic, "g", lambda m: None), "one", conf)
    two = Subscription.create(spec(topic, "g", lambda m: None), "two", conf)
    keeper = LeaseKeeper([one, two], store(), conf)

    keeper.rebalance(one)  # alone: takes everything
    assert one.held == frozenset(parts)
    assert all(watermark("g", topic, p) == 0 for p in parts)  # watermarks created with the leases
    keeper.rebalance(two)  # ceil(5 / 2) = 3 each, but nothing is free yet
    assert two.held == frozenset()
    keeper.rebalance(one)  # gives back the last two in partition order
    assert one.held == frozenset({0, 1, 2})
    keeper.rebalance(two)
    assert two.held == frozenset({3, 4})
    assert dict(PartitionLease.objects.values_list("partition", "leased_by")) == {
        0: "one", 1: "one", 2: "one", 3: "two", 4: "two",
    }  # fmt: skip
    keeper.release_all()
    assert not PartitionLease.objects.exists()
    assert SubscriberHeartbeat.objects.filter(deregistered_at__isnull=False).count() == 2


def test_subscribers_that_count_each_other_ask_for_disjoint_partitions():
    """Two workers computing their share at the same moment see the same free partitions;
    each asks first for its own slice (rank in the sorted live names), so neither's first
    acquisition is cut short by the other's."""

    topic = "w.ranks"
    conf = fast_conf(TOPICS={topic: {"partitions": 8}})
    store().register_topic(topic, 8)
    subs = [Subscription.create(spec(topic, "g", lambda m: None), name, conf) for name in ("w-b", "w-a", "w-c")]
    keeper = LeaseKeeper(subs, store(), conf)
    keeper.announce()  # all three heartbeat before anyone computes a share
    free = list(range(8))
    picks = {}
    for sub in subs:
        cap = keeper.fair_share(sub)
        assert cap is not None
        picks[sub.name] = sorted(free, key=lambda p, sub=sub: keeper._preference(sub, p))[:cap]
    assert [subs[i].rank for i in range(3)] == [1, 0, 2]
    assert [subs[i].cap for i in range(3)] == [3, 3, 2]  # 8 = 3 + 3 + 2: the two first ranks take one more
    assert sorted(picks["w-a"]) == [0, 3, 6] and sorted(picks["w-b"]) == [1, 4, 7]
    assert sorted(picks["w-c"]) == [2, 5]  # its slice has two, and so has its share
    for sub in subs:  # now acquiring one after the other: the first two get whole shares
        keeper.rebalance(sub)
    assert len(subs[0].held) == len(subs[1].held) == 3 and subs[2].held == frozenset({2, 5})


def test_shares_add_up_to_the_partitions_so_no_subscriber_is_left_below_its_share():
    """10 partitions, 4 subscribers: shares 3, 3, 2, 2 by rank. A cap of ceil(10 / 4) = 3 for
    everyone let the first three take 3 each and left the last one with 1 for good: nobody
    held more than the cap, so nobody released any (issue 14, bench/scale.py: one worker of
    20 held 20 of 512 partitions while the others held 25-26)."""

    topic = "w.shares"
    conf = fast_conf(TOPICS={topic: {"partitions": 10}})
    store().register_topic(topic, 10)
    subs = [Subscription.create(spec(topic, "g", lambda m: None), f"w-{i}", conf) for i in range(4)]
    keeper = LeaseKeeper(subs, store(), conf)
    keeper.announce()
    for _ in range(3):  # rounds in the order of the names, as workers taking turns would
        for sub in subs:
            keeper.rebalance(sub)
    assert [sub.cap for sub in subs] == [3, 3, 2, 2]
    assert [len(sub.held) for sub in subs] == [3, 3, 2, 2]
    assert PartitionLease.objects.count() == 10


def test_a_subscriber_whose_share_shrinks_gives_one_back_to_the_one_below_its_share():
    """A newcomer whose name sorts first shifts every rank: the subscriber that drops out of
    the larger shares releases one partition, and the one now entitled to it takes it."""

    topic = "w.shift"
    conf = fast_conf(TOPICS={topic: {"partitions": 7}})
    store().register_topic(topic, 7)
    b, c = (Subscription.create(spec(topic, "g", lambda m: None), name, conf) for name in ("w-b", "w-c"))
    keeper = LeaseKeeper([b, c], store(), conf)
    keeper.announce()
    for sub in (b, c, b, c):
        keeper.rebalance(sub)
    assert (len(b.held), len(c.held)) == (4, 3)  # 7 = 4 + 3
    a = Subscription.create(spec(topic, "g", lambda m: None), "w-a", conf)
    keeper.subscriptions.append(a)
    for _ in range(3):
        for sub in (a, b, c):
            keeper.rebalance(sub)
    assert [(sub.rank, sub.cap, len(sub.held)) for sub in (a, b, c)] == [(0, 3, 3), (1, 2, 2), (2, 2, 2)]
    assert PartitionLease.objects.count() == 7


def test_lease_keeper_releases_and_takes_nothing_of_a_paused_topic():
    """An operator's pause row: the next round gives every lease back; deleting it resumes."""

    topic = "w.pause"
    conf = fast_conf(TOPICS={topic: {"partitions": 3}})
    store().register_topic(topic, 3)
    sub = Subscription.create(spec(topic, "g", lambda m: None), "one", conf)
    keeper = LeaseKeeper([sub], store(), conf)
    keeper.rebalance(sub)
    assert sub.held == frozenset({0, 1, 2})
    PausedTopicFactory(consumer_group="g", topic=topic)
    PausedTopicFactory(consumer_group="other", topic=topic)  # another group's pause: no effect here
    keeper.rebalance(sub)
    assert (sub.paused, sub.held) == (True, frozenset())
    assert not PartitionLease.objects.exists()
    keeper.rebalance(sub)
    assert not PartitionLease.objects.exists()
    PausedTopic.objects.filter(consumer_group="g").delete()
    keeper.rebalance(sub)
    assert (sub.paused, sub.held) == (False, frozenset({0, 1, 2}))


def test_watermark_rows_the_poll_found_missing_are_created_by_the_keeper():
    """The keeper is the one place that creates watermark rows: for partitions it takes,
    and for held partitions a poll reports without one (deleted, or a failed creation)."""
    topic = "w.missing"
    conf = fast_conf()
    store().register_topic(topic, 8)
    publish_to(topic, 1, 3)
    sub = Subscription.create(spec(topic, "g", lambda m: None), "one", conf)
    keeper = LeaseKeeper([sub], store(), conf)
    keeper.rebalance(sub)
    assert sub.held == frozenset(range(8)) and watermark("g", topic, 1) == 0
    ConsumerOffset.objects.filter(consumer_group="g", topic=topic, partition=1).delete()
    sub.report_missing({1})  # what a poll does when it meets the partition
    keeper.check_membership()
    assert watermark("g", topic, 1) == 0 and sub.take_missing() == frozenset()


class Recorder(Instruments):
    """Instruments that keep what the keeper reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, int]] = []

    def leases(self, group: str, topic: str, *, acquired: int = 0, released: int = 0, lost: int = 0) -> None:
        self.seen.append((group, acquired, released, lost))

    def total(self, field: int) -> int:
        return sum(row[field] for row in self.seen)


def test_the_keeper_reports_leases_acquired_released_and_lost_to_its_instruments():
    """What runconsumer --metrics-port counts as sqlqueue_leases_{acquired,released,lost}_total."""
    topic = "w.instruments"
    conf = fast_conf(TOPICS={topic: {"partitions": 4}})
    store().register_topic(topic, 4)
    one = Subscription.create(spec(topic, "g", lambda m: None), "one", conf)
    two = Subscription.create(spec(topic, "g", lambda m: None), "two", conf)
    seen = Recorder()
    keeper = LeaseKeeper([one, two], store(), conf, instruments=seen)
    keeper.rebalance(one)  # alone: 4 acquired
    assert (seen.total(1), seen.total(2), seen.total(3)) == (4, 0, 0)
    keeper.rebalance(two)  # heartbeat: one's share is now 2
    keeper.rebalance(one)  # 2 released over its share
    keeper.rebalance(two)  # 2 acquired
    assert (seen.total(1), seen.total(2), seen.total(3)) == (6, 2, 0)
    # Partition 0's lease passes to "two" behind one's back (as after an expiry).
    PartitionLease.objects.filter(topic=topic, partition=0).update(leased_by="two")
    keeper.rebalance(one)
    assert seen.total(3) == 1 and 0 not in one.held
    assert (one.held, two.held) == (frozenset({1}), frozenset({2, 3}))
    keeper.release_all()  # counts what each held as far as it knew: 1 + 2
    assert seen.total(2) == 2 + 3
    assert not PartitionLease.objects.exists()
