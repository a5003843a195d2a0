"""Changing a topic's partition count is explicit; workers refuse settings that disagree."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_sqlqueue import publish
from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import Partition, Topic
from django_sqlqueue.ops import OperationError, repartition_topic
from django_sqlqueue.worker.loop import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def worker_for(topic: str) -> Worker:
    return Worker([ConsumerSpec(topic=topic, group="g", handler=lambda m: None)], name="w", conf=get_settings())


def test_a_worker_registers_its_topics_and_refuses_a_different_count():
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 4}}}):
        worker_for("orders").register_topics()
        assert Topic.objects.get(topic="orders").partitions == 4
        assert sorted(Partition.objects.filter(topic="orders").values_list("partition", flat=True)) == [0, 1, 2, 3]
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 6}}}):
        with pytest.raises(
            ConfigurationError, match=r"registered with 4 partitions.*gives it 6 partitions.*repartition"
        ):
            worker_for("orders").register_topics()
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"per_key": True}}}):
        with pytest.raises(ConfigurationError, match="one partition per key"):
            worker_for("orders").register_topics()


def test_repartition_requires_the_settings_first_and_refuses_per_key_topics():
    QueueStore("default").register_topic("orders", 4)
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 4}}}):
        with pytest.raises(OperationError, match=r"gives topic 'orders' 4 partitions, not 8.*first"):
            repartition_topic("orders", 8)
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 8}}}):
        with pytest.raises(OperationError, match="from 1 to 4096"):
            repartition_topic("orders", 0)
    with override_settings(SQLQUEUE={"TOPICS": {"tenants": {"per_key": True}}}):
        with pytest.raises(OperationError, match="one partition per key"):
            repartition_topic("tenants", 8)
    assert Topic.objects.get(topic="orders").partitions == 4  # nothing changed


def test_repartition_command_asks_changes_the_registry_and_workers_start_again():
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 4}}}):
        worker_for("orders").register_topics()
        publish("orders", 1, key="alice")
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 8}}}):
        with pytest.raises(CommandError, match="refusing without confirmation"):
            call_command("queue_topic", "repartition", "orders", "8")
        call_command("queue_topic", "repartition", "orders", "8", "--dry-run")
        assert Topic.objects.get(topic="orders").partitions == 4
        call_command("queue_topic", "repartition", "orders", "8", "--yes")
        assert Topic.objects.get(topic="orders").partitions == 8
        assert Partition.objects.filter(topic="orders").count() == 8
        worker_for("orders").register_topics()  # settings and registry agree again
    with override_settings(SQLQUEUE={"TOPICS": {"orders": {"partitions": 2}}}):
        call_command("queue_topic", "repartition", "orders", "2", "--yes")
        assert Topic.objects.get(topic="orders").partitions == 2
        # Partitions beyond the smaller count keep their head rows: their messages are still consumed.
        assert Partition.objects.filter(topic="orders").count() == 8
