"""ops/overview.py: the console's front page -- per-group and per-topic numbers and the problems flagged.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue import publish
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.ops.overview import overview
from django_sqlqueue.ops.pausing import pause

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_overview_flags_problems():
    build()
    PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=5))
    pause("shipping", "orders", by="bob")
    o = overview()
    text = "\n".join(o.problems)
    assert "group retired has no live subscriber on orders and is 20 message(s) behind" in text
    assert "stale lease: billing:orders[1]" in text
    assert "topic typo is consumed by no group" in text
    assert "dead-letter topic orders_dlq is consumed by no group" in text
    assert "group shipping is paused on orders" in text
    rows = {g.group: g for g in o.groups}
    assert rows["billing"].dead_letters == 3 and rows["shipping"].dead_letters == 1
    assert rows["billing"].oldest_unhandled_at is not None
    topics = {t.info.topic: t for t in o.topics}
    assert topics["orders"].dead_letters == 4 and topics["orders"].unsequenced == 0


def test_overview_counts_messages_waiting_for_the_sequencer():
    build()
    publish("orders", {"late": 1}, key="k1")
    assert {t.info.topic: t.unsequenced for t in overview().topics}["orders"] == 1
