"""Atomic consumers (django_sqlqueue/atomic.py): the handler's writes and its ack commit together.

Real database, real workers on threads (``running``), real lease rows; nothing mocked. The
handlers' effects are ``Handled`` rows (no unique constraint: a duplicate would show).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.models import Message
from tests.consumerapp.models import Handled

from .engine_helpers import (
    Calls,
    caught_up,
    dead_letters,
    publish_to,
    running,
    spec,
    wait_until,
    watermark,
)

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "atomic.events"
GROUP = "g"
DLQ = f"{TOPIC}_dlq"


def effect(message, worker: str = "t1") -> Handled:
    """Write the handler's effect: one row per call."""
    return Handled.objects.create(
        group=message.group,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        offset=message.offset,
        message_id=message.id,
        attempt=message.attempt,
        worker=worker,
    )


def effects(topic: str = TOPIC) -> list[tuple[int, int]]:
    return sorted(Handled.objects.filter(topic=topic).values_list("partition", "offset"))


def test_effects_and_acks_commit_together():
    publish_to(TOPIC, 0, 5)
    publish_to(TOPIC, 3, 2)
    with running([spec(TOPIC, GROUP, effect, atomic=True)]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="all acked")
    assert effects() == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (3, 1), (3, 2)]
    assert watermark(GROUP, TOPIC, 0) == 5


def test_a_failing_handler_leaves_no_effect_is_retried_and_dead_lettered_at_its_last_attempt():
    calls = Calls()

    def handler(message):
        effect(message)
        calls.add(message.attempt)
        raise RuntimeError("boom after writing")

    publish_to(TOPIC, 0, 1)
    with running([spec(TOPIC, GROUP, handler, atomic=True, max_attempts=3)]):
        wait_until(lambda: dead_letters(DLQ), what="dead letter")
    assert calls.list() == [1, 2, 3]
    assert effects() == []
    assert watermark(GROUP, TOPIC, 0) in (0, 1)
    assert Message.objects.filter(topic=DLQ).count() == 1
