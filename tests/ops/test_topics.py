"""ops/topics.py: the topics in the log, who consumes them, and purging a topic.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import publish
from django_sqlqueue.models import DeliveryState, Message, PartitionLease
from django_sqlqueue.ops.base import NotFound, OperationError
from django_sqlqueue.ops.topics import TopicPurge, duration_text, list_topics, log_topics, purge_topic
from django_sqlqueue.rules.limits import MAX_BATCH_SIZE

from ..support.console_scene import SETTINGS, build, wm

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
    assert topics["orders_dlq"].original_topic == "orders" and topics["orders"].original_topic == ""


def test_only_a_topic_that_is_not_a_dead_letter_topic_is_orphaned():
    """A dead-letter topic is consumed by no group by design (issue 29, item 5)."""
    build()
    topics = {t.topic: t for t in list_topics()}
    assert topics["typo"].orphaned
    assert not topics["orders_dlq"].orphaned and not topics["orders"].orphaned


def test_list_topics_says_how_long_messages_are_kept():
    build()
    topics = {t.topic: t for t in list_topics()}
    assert topics["orders"].kept == "until every consuming group has handled them"
    assert topics["orders_dlq"].kept == "until replayed or purged"
    assert topics["typo"].kept == "forever: no group consumes it"
    with override_settings(SQLQUEUE={**SETTINGS, "RETENTION": 7 * 24 * 3600}):
        topics = {t.topic: t for t in list_topics()}
    assert topics["orders"].kept == "7 days after every consuming group has handled them"
    assert topics["orders_dlq"].kept == "until replayed or purged"  # GC never reads it


@pytest.mark.parametrize(
    "seconds, text",
    [
        (7 * 86400, "7 days"),
        (86400, "1 day"),
        (3600, "1 hour"),
        (5400, "90 minutes"),
        (90.5, "90.5 seconds"),
        (1, "1 second"),
    ],
)
def test_duration_text(seconds, text):
    assert duration_text(seconds) == text


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


# -- sizes and the order of the steps (issue 28, item 4) ---------------------------------------


@pytest.mark.parametrize("size", [0, -1, MAX_BATCH_SIZE + 1, 10**23, True, 1.5, "10", None])
def test_purge_topic_refuses_a_bad_batch_size_before_anything(size):
    """``--batch-size 0`` moved every watermark to the head, deleted nothing and said "deleted 0"."""
    scene = build()
    with pytest.raises(OperationError, match=rf"^batch_size must be an integer from 1 to {MAX_BATCH_SIZE}, got "):
        purge_topic("orders", batch_size=size)
    with pytest.raises(OperationError, match="batch_size"):
        purge_topic("orders", batch_size=size, dry_run=True)
    assert Message.objects.filter(topic="orders").count() == 20
    assert PartitionLease.objects.filter(topic="orders").count() == 2
    for part, head in scene.heads.items():
        assert wm("billing", part) == head - 2 and wm("retired", part) == 0


def test_purge_topic_calls_on_batch_inside_each_step_and_a_rerun_completes():
    build()
    seen: list[TopicPurge] = []

    def audit(step: TopicPurge) -> None:
        seen.append(step)
        if len(seen) == 3:
            raise RuntimeError("the audit row could not be written")

    with pytest.raises(RuntimeError):
        purge_topic("orders", batch_size=8, on_batch=audit)
    # The fence and the first batch committed, each with its audit; the second batch did not.
    assert seen[:2] == [TopicPurge("orders", 0, 0, 2), TopicPurge("orders", 8)]
    assert Message.objects.filter(topic="orders").count() == 12
    done = purge_topic("orders", batch_size=8, on_batch=seen.append)
    assert seen[3:] == [TopicPurge("orders", 0, 0, 0), TopicPurge("orders", 8), TopicPurge("orders", 4)]
    assert done == TopicPurge("orders", 12, 0, 0) and not Message.objects.filter(topic="orders").exists()
    purge_topic("orders", dry_run=True, on_batch=seen.append)  # a dry run writes nothing to audit
    assert len(seen) == 6
