"""rules/limits.py: the name rules and column widths, checked against the models and a real database."""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import ConsumerOffset, Message
from django_sqlqueue.rules.limits import (
    CONSUMER_GROUP_LENGTH,
    KEY_LENGTH,
    MAX_BATCH_SIZE,
    MAX_BIGINT,
    MAX_DLQ_SUFFIX_LENGTH,
    MAX_LIST_LIMIT,
    MAX_MESSAGE_ID_LENGTH,
    MAX_TOPIC_LENGTH,
    MESSAGE_ID_LENGTH,
    TOPIC_COLUMN_LENGTH,
    TOPIC_RE,
)


@pytest.mark.parametrize("name", ["orders", "orders.created", "a-b_c.D9", "x" * 200, ".a", "a..", "_."])
def test_topic_names_are_ascii_letters_digits_dots_underscores_and_dashes(name: str) -> None:
    assert TOPIC_RE.match(name)  # (the length is checked apart: MAX_TOPIC_LENGTH)


@pytest.mark.parametrize(
    "name", ["", "orders\n", "orders created", "orders/created", "ordérs", "orders:1", ".", "..", "...", ".\n"]
)
def test_other_names_are_refused(name: str) -> None:
    # "orders\n": "$" would match before the newline; the rule ends at "\Z". Dots alone are
    # path segments: a console link naming them is normalised to another page.
    assert not TOPIC_RE.match(name)


def test_operator_sizes_have_bounds() -> None:
    """The ops layer refuses batch sizes and list limits outside 1..these (tests/ops)."""
    assert 1000 <= MAX_BATCH_SIZE <= 32766 // 2  # one batch's IN list fits SQLite's parameter limit
    assert 50 <= MAX_LIST_LIMIT <= MAX_BIGINT


def test_the_columns_are_as_wide_as_the_limits_say() -> None:
    assert TOPIC_COLUMN_LENGTH == MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH
    assert Message._meta.get_field("topic").max_length == TOPIC_COLUMN_LENGTH
    assert Message._meta.get_field("key").max_length == KEY_LENGTH
    assert Message._meta.get_field("id").max_length == MESSAGE_ID_LENGTH
    assert ConsumerOffset._meta.get_field("consumer_group").max_length == CONSUMER_GROUP_LENGTH
    # A dead letter's id is "<group>:<original id>": the longest of each fits the column.
    assert CONSUMER_GROUP_LENGTH + 1 + MAX_MESSAGE_ID_LENGTH <= MESSAGE_ID_LENGTH


@pytest.mark.django_db
def test_the_longest_dead_letter_is_stored_whole() -> None:
    """The longest topic with the longest suffix, the longest group and id, the longest key."""
    topic = "t" * MAX_TOPIC_LENGTH
    dead_topic = topic + "_" * MAX_DLQ_SUFFIX_LENGTH
    dead_id = "g" * CONSUMER_GROUP_LENGTH + ":" + "i" * MAX_MESSAGE_ID_LENGTH
    write_dead_letter(
        dead_topic,
        key="k" * KEY_LENGTH,
        id=dead_id,
        payload={},
        metadata={},
        created_at=timezone.now(),
        failure_count=1,
        last_error="",
        original_topic=topic,
        using="default",
    )
    stored = Message.objects.get(topic=dead_topic)
    assert (stored.id, stored.key, stored.original_topic) == (dead_id, "k" * KEY_LENGTH, topic)
