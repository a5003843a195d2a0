"""One factory per queue model (rows written through the ORM, as an operator would)."""

from __future__ import annotations

import factory
from django.utils import timezone

from django_sqlqueue import models


class MessageFactory(factory.django.DjangoModelFactory):
    """A sequenced message (offset set), as the sequencer would leave it."""

    class Meta:
        model = models.Message

    topic = "factory.topic"
    partition = factory.Sequence(lambda n: n % 4)
    key = factory.Sequence(lambda n: f"key-{n % 4}")
    offset = factory.Sequence(lambda n: n + 1)
    id = factory.Sequence(lambda n: f"msg-{n}")
    payload = factory.Sequence(lambda n: {"n": n})
    metadata = factory.LazyFunction(dict)
    deliver_at = factory.LazyFunction(timezone.now)
    created_at = factory.LazyFunction(timezone.now)
    published_at = factory.LazyFunction(timezone.now)


class TopicFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.Topic

    topic = factory.Sequence(lambda n: f"topic-{n}")
    partitions = 8
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.LazyFunction(timezone.now)


class PartitionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.Partition

    topic = "factory.topic"
    partition = factory.Sequence(lambda n: n)
    head_offset = 0
    created_at = factory.LazyFunction(timezone.now)


class DeliveryStateFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.DeliveryState

    consumer_group = "billing"
    topic = "factory.topic"
    partition = 0
    message_offset = factory.Sequence(lambda n: n + 1)
    invisible_until = factory.LazyFunction(timezone.now)


class PartitionLeaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.PartitionLease

    consumer_group = "billing"
    topic = "factory.topic"
    partition = factory.Sequence(lambda n: n)
    leased_by = "worker-1"
    leased_at = factory.LazyFunction(timezone.now)
    lease_renewed_at = factory.LazyFunction(timezone.now)


class ConsumerOffsetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.ConsumerOffset

    consumer_group = "billing"
    topic = "factory.topic"
    partition = factory.Sequence(lambda n: n)
    offset_acked = 0
    updated_at = factory.LazyFunction(timezone.now)


class SubscriberHeartbeatFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.SubscriberHeartbeat

    consumer_group = "billing"
    topic = "factory.topic"
    subscriber_name = factory.Sequence(lambda n: f"host:{1000 + n}")
    heartbeat_at = factory.LazyFunction(timezone.now)


class PausedTopicFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.PausedTopic

    consumer_group = "billing"
    topic = "factory.topic"
    paused_at = factory.LazyFunction(timezone.now)
    paused_by = "cli"
