"""ops/seek.py: moving a group's watermarks (preview, rewind, fast-forward, by time) and refusing bad input.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.db.store import seek_reads
from django_sqlqueue.models import ConsumerOffset, DeliveryState, PartitionLease
from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.groups import list_groups
from django_sqlqueue.ops.seek import plan_seek, seek

from ..support.console_scene import build, wm

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_seek_preview_counts_redelivered_and_skipped_without_writing():
    scene = build()
    plan = plan_seek("shipping", "orders", position="earliest")
    assert plan.redeliver == 20 and plan.skip == 0
    plan = plan_seek("retired", "orders", position="latest")
    assert plan.skip == 20 and plan.redeliver == 0
    assert wm("retired", 0) == 0 and PartitionLease.objects.count() == 2
    # Acked above the watermark: not counted as skipped by a fast-forward.
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=1,
        acked=True,
        invisible_until=timezone.now(),
    )
    assert plan_seek("retired", "orders", position="latest", partitions=[0]).skip == scene.heads[0] - 1


def test_a_range_too_long_to_count_is_shown_as_up_to_its_offsets(monkeypatch):
    # 20 messages in the scene's partitions; a cap of 0 leaves every range uncounted: the
    # preview gives the offsets moved, an upper bound, and says so wherever it is shown.
    build()
    exact = plan_seek("shipping", "orders", position="earliest")
    monkeypatch.setattr(seek_reads, "COUNT_CAP", 0)
    plan = plan_seek("shipping", "orders", position="earliest")
    assert not plan.exact and plan.redeliver == exact.redeliver == 20
    assert "up to 20 message(s) redelivered, 0 skipped" in plan.describe()
    moved = [p for p in plan.partitions if p.redeliver]
    assert moved and all(p.shown() == (f"up to {p.redeliver}", "0") for p in moved)
    assert exact.exact and "up to" not in exact.describe()


def test_seek_to_earliest_creates_a_group_that_does_not_exist():
    """A seek of a group new on the topic writes its watermarks -- even where none moves --
    and says that it creates the group (before, it printed "0 redelivered" and wrote nothing)."""
    scene = build()
    assert not ConsumerOffset.objects.filter(consumer_group="newcomer").exists()
    preview = plan_seek("newcomer", "orders", position="earliest")
    assert preview.created and "will be created" in preview.describe()
    assert not ConsumerOffset.objects.filter(consumer_group="newcomer").exists()
    done = seek("newcomer", "orders", position="earliest")
    assert done.created and "'newcomer' had no watermarks on 'orders' and is created" in done.describe()
    marks = dict(
        ConsumerOffset.objects.filter(consumer_group="newcomer", topic="orders").values_list(
            "partition", "offset_acked"
        )
    )
    assert sorted(marks) == sorted(scene.heads)
    assert all(mark == 0 for mark in marks.values())  # nothing collected yet: everything is delivered
    assert any(g.group == "newcomer" for g in list_groups(topic="orders"))
    # A second seek: the group exists now.
    assert not seek("newcomer", "orders", position="earliest").created


def test_seek_rewind_releases_leases_and_clears_delivery_state():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        acked=True,
        invisible_until=timezone.now(),
    )
    plan = seek("billing", "orders", offset=1, partitions=[0])
    assert plan.applied and plan.leases_released == 1
    assert plan.redeliver == (scene.heads[0] - 2 - 1) + 1
    assert wm("billing", 0) == 1 and wm("billing", 1) == scene.heads[1] - 2
    assert not DeliveryState.objects.filter(consumer_group="billing", partition=0).exists()
    assert list(PartitionLease.objects.values_list("partition", flat=True)) == [1]


def test_seek_fast_forward_keeps_state_above_target():
    scene = build()
    head = scene.heads[0]
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=head,
        acked=False,
        retry_count=2,
        status=2,
        invisible_until=timezone.now(),
    )
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=1,
        acked=False,
        status=1,
        invisible_until=timezone.now(),
    )
    plan = seek("retired", "orders", offset=head - 1, partitions=[0])
    assert plan.skip == head - 1 and wm("retired", 0) == head - 1
    kept = DeliveryState.objects.filter(consumer_group="retired", partition=0)
    assert [(s.message_offset, s.retry_count) for s in kept] == [(head, 2)]


def test_seek_by_time():
    build()
    later = timezone.now() + dt.timedelta(seconds=1)
    plan = plan_seek("shipping", "orders", time=later)
    assert all(p.target == p.head for p in plan.partitions) and plan.skip == 0 and plan.redeliver == 0
    plan = plan_seek("shipping", "orders", time=timezone.now() - dt.timedelta(hours=1))
    assert all(p.target == 0 for p in plan.partitions) and plan.redeliver == 20


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, "exactly one"),
        ({"offset": -1}, "integer >= 0"),
        ({"offset": 10_000}, "beyond the head"),
        ({"position": "middle"}, "earliest, latest"),
        ({"position": "latest", "partitions": [99]}, "no partition 99"),
        ({"time": dt.datetime(2020, 1, 1)}, "aware"),
    ],
)
def test_seek_bad_input_is_refused_and_writes_nothing(kwargs, error):
    build()
    before = list(ConsumerOffset.objects.values_list("consumer_group", "partition", "offset_acked"))
    with pytest.raises(OperationError, match=error):
        seek("billing", "orders", **kwargs)
    assert list(ConsumerOffset.objects.values_list("consumer_group", "partition", "offset_acked")) == before
    assert PartitionLease.objects.count() == 2


def test_an_error_over_many_unknown_partitions_names_ten_and_counts_the_rest():
    """Issue 28 (F11): a preview of 300,000 partition numbers made an error of 2.3 MB (every
    unknown one named), kept in the session as a flash message. Now: ten, and a count."""
    build()
    with pytest.raises(OperationError) as refused:
        plan_seek("billing", "orders", position="earliest", partitions=range(300_000))
    message = str(refused.value)
    assert "has no partition 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 299988 more (known: 0..1)" in message
    assert len(message) < 200
    with pytest.raises(OperationError, match=r"no partition 5, 7 \(known"):
        plan_seek("billing", "orders", position="earliest", partitions=[0, 5, 7])
