"""LeaseStore (``store/leases.py``): acquiring, renewing and releasing partition leases,
against real rows and the database clock."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from django_sqlqueue.db.store.leases import LeaseStore
from django_sqlqueue.models import PartitionLease

from ...support.engine_helpers import age_lease, db_now, store
from .helpers import A, B, C, D, G, T, fill, leased

pytestmark = pytest.mark.django_db(transaction=True)


def leases() -> LeaseStore:
    """The module's store on its own (no other store mixin behind it): what these tests exercise."""
    return LeaseStore("default")


def test_acquire_leases_takes_missing_leases_and_refuses_live_ones():
    fill(A, 1)
    s = leases()
    before = db_now()
    assert s.acquire_leases(G, T, [A], "w1", 30) == [A]
    assert s.acquire_leases(G, T, [A], "w2", 30) == []
    lease_row = PartitionLease.objects.get(consumer_group=G, topic=T, partition=A)
    assert lease_row.leased_by == "w1" and lease_row.lease_renewed_at >= before
    # Several at once: the live one is skipped, the missing ones are taken.
    assert s.acquire_leases(G, T, [C, A, B], "w2", 30) == [B, C]
    assert s.acquire_leases(G, T, [], "w2", 30) == []
    # Leases are per group: another group takes the same partition.
    assert s.acquire_leases("analytics", T, [A], "w2", 30) == [A]
    assert PartitionLease.objects.count() == 4


def test_acquire_leases_steals_only_expired_leases():
    fill(A, 1)
    s = leases()
    leased(A, "w1")
    leased(B, "w1")
    age_lease(G, T, A, 10)
    assert s.acquire_leases(G, T, [A], "w2", 30) == []  # 10s old: still live for a 30s lease
    assert PartitionLease.objects.get(partition=A).leased_by == "w1"
    age_lease(G, T, A, 31)
    before = db_now()
    assert s.acquire_leases(G, T, [A, B], "w2", 30) == [A]  # B is live
    lease_row = PartitionLease.objects.get(partition=A)
    assert lease_row.leased_by == "w2"
    assert lease_row.leased_at >= before and lease_row.lease_renewed_at >= before
    # The former holder learns it on renewal: the partition is not renewed nor returned.
    assert s.renew_leases(G, T, "w1") == [B]
    assert s.renew_leases(G, T, "w2") == [A]


def test_acquire_leases_insert_race_loses_cleanly(spawn):
    """Two subscribers insert the same missing lease; the loser gets nothing, not an error."""
    fill(A, 1)
    inserted, release = threading.Event(), threading.Event()

    def first() -> list[int]:
        with transaction.atomic():
            got = leases().acquire_leases(G, T, [A], "w1", 30)
            inserted.set()
            assert release.wait(10)
        return got

    holder = spawn(first, name="first")
    assert inserted.wait(10)
    second = spawn(lambda: leases().acquire_leases(G, T, [A], "w2", 30), name="second")
    second.join(0.5)
    assert second.is_alive(), "the second INSERT must wait for the first one's uncommitted row"
    release.set()
    assert holder.join_ok() == [A]
    assert second.join_ok() == []
    assert list(PartitionLease.objects.values_list("leased_by", flat=True)) == ["w1"]


def test_renew_leases_renews_and_returns_only_leases_still_held():
    for p in (A, B, C):
        fill(p, 1)
    s = leases()
    leased(A)
    leased(B)
    leased(C, "w2")
    age_lease(G, T, A, 20)
    age_lease(G, T, B, 20)
    before = db_now()
    assert s.renew_leases(G, T, "w1") == [A, B]
    for p in (A, B):
        assert PartitionLease.objects.get(partition=p).lease_renewed_at >= before
    # B expires and is stolen by w3: w1 renews only A from now on.
    age_lease(G, T, B, 31)
    assert s.acquire_leases(G, T, [B], "w3", 30) == [B]
    assert s.renew_leases(G, T, "w1") == [A]
    assert s.held_partitions(G, T, "w1") == [A]
    assert s.renew_leases(G, T, "w2") == [C]


def test_release_leases_all_or_some():
    for p in (A, B, C, D):
        fill(p, 1)
    s = leases()
    for p in (A, B, C):
        leased(p)
    leased(D, "w2")
    assert s.release_leases(G, T, "w1", [B]) == 1
    assert s.held_partitions(G, T, "w1") == [A, C]
    assert s.release_leases(G, T, "w1", []) == 0
    assert s.release_leases(G, T, "w1", [D]) == 0  # not ours
    assert s.release_leases(G, T, "w1") == 2
    assert list(PartitionLease.objects.values_list("partition", "leased_by")) == [(D, "w2")]


def test_free_partitions_lists_unleased_and_expired_partitions():
    for p in (A, B, C, D):
        fill(p, 1)
    fill(A, 1, topic="other.topic")
    s = leases()
    leased(A)
    leased(B)
    age_lease(G, T, B, 31)
    leased(C, group="analytics")  # another group's lease does not count
    assert s.free_partitions(G, T, 30) == [B, C, D]
    assert s.free_partitions(G, T, 60) == [C, D]  # B is live for a 60s lease
    assert store().partitions(T) == [A, B, C, D]  # head rows the sequencer created
