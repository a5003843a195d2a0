"""TopicStore (``store/topics.py``): the topic registry, partition head rows and pauses."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_sqlqueue import publish_many
from django_sqlqueue.db.store.topics import TopicStore

from .helpers import G, T

pytestmark = pytest.mark.django_db(transaction=True)


def test_register_topic_creates_head_rows_and_keeps_the_first_count():
    s = TopicStore("default")  # the module's store on its own
    assert s.registered_partitions("reg") == (False, None)
    assert s.register_topic("reg", 3) == 3
    assert s.partitions("reg") == [0, 1, 2]
    assert s.register_topic("reg", 5) == 3  # registered already: the caller compares
    assert s.partitions("reg") == [0, 1, 2]
    assert s.repartition("reg", 5) == (3, 5)
    assert s.registered_partitions("reg") == (True, 5)
    assert s.partitions("reg") == [0, 1, 2, 3, 4]
    # One partition per key: no fixed head rows; they appear as keys do.
    assert s.register_topic("perkey", None) is None
    assert s.registered_partitions("perkey") == (True, None)
    assert s.partitions("perkey") == []
    with override_settings(SQLQUEUE={"TOPICS": {"perkey": {"per_key": True}}}):
        published = publish_many("perkey", [{"payload": i, "key": k} for i, k in enumerate(["x", "y", "x"])])
    assert s.discover_partitions("perkey") == 2
    assert s.discover_partitions("perkey") == 0
    assert s.partitions("perkey") == sorted({m.partition for m in published})


def test_paused_reads_the_operator_pause_row():
    from ...support.factories import PausedTopicFactory

    s = TopicStore("default")  # the module's store on its own
    assert not s.paused(G, T)
    PausedTopicFactory(consumer_group=G, topic=T)
    assert s.paused(G, T)
    assert not s.paused("analytics", T)
