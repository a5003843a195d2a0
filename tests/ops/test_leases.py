"""ops/leases.py: partition leases, subscribers and in-flight deliveries.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import DeliveryState, PartitionLease, SubscriberHeartbeat
from django_sqlqueue.ops.base import NotFound
from django_sqlqueue.ops.leases import list_deliveries, list_leases, list_subscribers, release_lease

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_leases_stale_flag_and_release():
    build()
    PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=5))
    SubscriberHeartbeat.objects.filter(subscriber_name="w2").update(heartbeat_at=timezone.now() - dt.timedelta(hours=1))
    leases = list_leases()
    assert [(lease.partition, lease.stale) for lease in leases] == [(0, False), (1, True)]
    assert [s.name for s in list_subscribers() if s.silent] == ["w2"]
    with pytest.raises(NotFound, match="held by 'other'"):
        release_lease("billing", "orders", 1, holder="other")
    assert release_lease("billing", "orders", 1, holder="w1") == 1
    assert [lease.partition for lease in list_leases()] == [0]


def test_deliveries_list_joins_message_ids():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        retry_count=2,
        status=2,
        invisible_until=timezone.now(),
        last_error="builtins.ValueError: nope\nTraceback (most recent call last):\n  ...",
    )
    rows = list_deliveries(status="retrying")
    assert len(rows) == 1 and rows[0].message_id.startswith("o") and rows[0].retry_count == 2
    assert rows[0].error_summary == "builtins.ValueError: nope" and rows[0].last_error.endswith("...")
    assert all(r.last_error is None and r.error_summary == "" for r in list_deliveries(status="in flight"))
    with pytest.raises(NotFound):
        list_deliveries(status="bogus")
