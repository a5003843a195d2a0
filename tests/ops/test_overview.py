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

from ..support.console_scene import build, dead_letter

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
    assert "group shipping is paused on orders" in text
    rows = {g.group: g for g in o.groups}
    assert rows["billing"].dead_letters == 3 and rows["shipping"].dead_letters == 1
    assert rows["billing"].oldest_unhandled_at is not None
    topics = {t.info.topic: t for t in o.topics}
    assert topics["orders"].dead_letters == 4 and topics["orders"].unsequenced == 0


# -- dead-letter topics (issue 29, item 5) ---------------------------------------------------


def test_a_dead_letter_topic_consumed_by_no_group_is_not_a_problem():
    """One dead letter made a permanent problem "dead-letter topic orders_dlq is consumed by no
    group: its messages are never collected": no group consumes one by design."""
    build()
    o = overview()
    assert not [p for p in o.problems if "orders_dlq" in p]
    assert [t.info.topic for t in o.orphaned_topics] == ["typo"]
    assert "topic typo is consumed by no group: its messages are never collected" in o.problems


def test_topics_count_the_dead_letters_on_both_rows_of_a_pair():
    """The dead-letter topic's row said 0 while it held 4: both rows count the same dead letters."""
    build()
    dead_letter("billing", "x1", topic="typo")
    topics = {t.info.topic: t for t in overview().topics}
    assert topics["orders_dlq"].dead_letters == topics["orders"].dead_letters == 4
    assert topics["typo_dlq"].dead_letters == topics["typo"].dead_letters == 1
    capped = {t.info.topic: t.dead_letters for t in overview(cap=2).topics}
    assert capped["orders_dlq"] == capped["orders"] == 3  # capped like every count: cap + 1 rows read


def test_a_stale_lease_problem_names_its_time_zone():
    build()
    PartitionLease.objects.filter(partition=1).update(lease_renewed_at=dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert any("last renewed 2024-01-02 03:04:05 UTC" in p for p in overview().problems)


def test_overview_counts_messages_waiting_for_the_sequencer():
    build()
    publish("orders", {"late": 1}, key="k1")
    assert {t.info.topic: t.unsequenced for t in overview().topics}["orders"] == 1
