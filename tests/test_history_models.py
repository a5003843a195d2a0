"""The history table's model (django_sqlqueue/history_models.py): one row per (group, topic,
minute, slot), enforced by the database, and its counters default to zero."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from django_sqlqueue import models as queue_models
from django_sqlqueue.history_models import HISTORY_SLOTS, HistoryMinute

pytestmark = pytest.mark.django_db


def test_the_key_is_group_topic_minute_and_slot():
    HistoryMinute.objects.create(consumer_group="g", topic="t", minute=100, slot=1, handled=2)
    HistoryMinute.objects.create(consumer_group="g", topic="t", minute=100, slot=2)
    HistoryMinute.objects.create(consumer_group="", topic="t", minute=100, slot=1, published=5)
    with pytest.raises(IntegrityError), transaction.atomic():
        HistoryMinute.objects.create(consumer_group="g", topic="t", minute=100, slot=1)
    row = HistoryMinute.objects.get(consumer_group="g", topic="t", minute=100, slot=2)
    assert (row.handled, row.failed, row.retried, row.dead_lettered, row.published, row.lag) == (0, 0, 0, 0, 0, None)
    assert str(row) == "g t @100 [2]" and "(published)" in str(HistoryMinute.objects.get(consumer_group=""))


def test_models_reexports_it():
    assert queue_models.HistoryMinute is HistoryMinute and queue_models.HISTORY_SLOTS == HISTORY_SLOTS == 4
