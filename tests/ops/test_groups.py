"""ops/groups.py: consumer groups' lag, watermarks per partition, and dropping a group.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.models import ConsumerOffset
from django_sqlqueue.ops.base import NotFound, OperationError
from django_sqlqueue.ops.groups import drop_group, group_offsets, list_groups

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_list_groups_lag_and_liveness():
    build()
    rows = {(g.group, g.topic): g for g in list_groups()}
    assert rows[("billing", "orders")].lag == 4 and rows[("billing", "orders")].live_subscribers == 1
    assert rows[("shipping", "orders")].lag == 0
    assert rows[("retired", "orders")].lag == 20 and rows[("retired", "orders")].live_subscribers == 0


def test_group_offsets_per_partition():
    scene = build()
    rows = group_offsets("billing", "orders")
    assert [(r.partition, r.head, r.watermark, r.lag, r.leased_by) for r in rows] == [
        (p, h, h - 2, 2, "w1") for p, h in sorted(scene.heads.items())
    ]
    with pytest.raises(NotFound):
        group_offsets("nobody", "orders")


def test_drop_group_refuses_live_group_and_drops_retired_one():
    build()
    with pytest.raises(OperationError, match="live subscriber"):
        drop_group("billing")
    preview = drop_group("retired", dry_run=True)
    assert preview.rows["queue_offsets"] == 2 and ConsumerOffset.objects.filter(consumer_group="retired").count() == 2
    done = drop_group("retired")
    assert done.total == 2 and not ConsumerOffset.objects.filter(consumer_group="retired").exists()
    forced = drop_group("billing", force=True)
    assert forced.rows == {
        "queue_partition_leases": 2,
        "queue_delivery_state": 0,
        "queue_offsets": 2,
        "queue_subscriber_heartbeats": 1,
        "queue_paused_topics": 0,
    }
    with pytest.raises(NotFound):
        drop_group("retired")
