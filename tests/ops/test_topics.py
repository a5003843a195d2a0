"""ops/topics.py: the topics in the log, who consumes them, and purging a topic.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_sqlqueue import publish
from django_sqlqueue.models import DeliveryState, Message
from django_sqlqueue.ops.base import NotFound
from django_sqlqueue.ops.topics import list_topics, log_topics, purge_topic

from ..support.console_scene import build, wm

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_log_topics_lists_every_topic_with_messages_including_unconsumed():
    build()
    assert log_topics() == ["orders", "orders_dlq", "typo"]


def test_log_topics_skip_scan_finds_neighbouring_names():
    # The skip scan steps from one topic to the next larger one: names that are prefixes
    # of each other, or differ only in case, must all come out (binary collation).
    for topic in ("a", "a.b", "a-", "A", "b_", "zz"):
        publish(topic, {})
    assert log_topics() == ["A", "a", "a-", "a.b", "b_", "zz"]


def test_list_topics_flags_unconsumed_and_dead_letter_topics():
    build()
    topics = {t.topic: t for t in list_topics()}
    assert topics["orders"].consumed_by == ["billing", "retired", "shipping"]
    assert topics["typo"].unconsumed and not topics["typo"].dead_letter_topic
    assert topics["orders_dlq"].unconsumed and topics["orders_dlq"].dead_letter_topic


def test_purge_topic_deletes_messages_moves_watermarks_and_fences_leases():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        invisible_until=timezone.now(),
        status=1,
    )
    assert purge_topic("orders", dry_run=True).messages == 20
    assert Message.objects.filter(topic="orders").count() == 20
    done = purge_topic("orders", batch_size=7)
    assert (done.messages, done.delivery_states, done.leases) == (20, 1, 2)
    assert not Message.objects.filter(topic="orders").exists()
    assert Message.objects.filter(topic="typo").count() == 3
    for part, head in scene.heads.items():
        assert wm("retired", part) == head and wm("billing", part) == head


def test_purge_unknown_topic_is_refused():
    with pytest.raises(NotFound, match="nosuch"):
        purge_topic("nosuch")
