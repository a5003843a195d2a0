"""What the store tests share: one group and topic, named partitions, and shortcuts to
fill, lease and deliver a partition."""

from __future__ import annotations

from django_sqlqueue.models import Message

from ...support.engine_helpers import fetch_fresh, publish_to, store
from ...support.engine_helpers import leased as lease

G, T = "billing", "orders"
#: Partitions of T (the default count) used by the tests, by name.
A, B, C, D, E, F = range(6)


def fill(partition: int, n: int, topic: str = T):
    """Publish ``n`` messages to ``partition`` of ``topic`` and sequence them (offsets 1..n)."""
    return publish_to(topic, partition, n)


def stored_offsets(**filters: object) -> list[int]:
    """Offsets of the stored messages matching ``filters``, in offset order."""
    return list(Message.objects.filter(**filters).order_by("offset").values_list("offset", flat=True))


def leased(partition: int, name: str = "w1", group: str = G, topic: str = T, duration: float = 30) -> None:
    lease(group, topic, partition, name, duration)


def deliver(
    partition: int,
    offsets: list[int],
    *,
    group: str = G,
    topic: str = T,
    name: str = "w1",
    visibility: float = 60,
) -> None:
    """Lease the partition to ``name`` and record fresh deliveries of ``offsets``."""
    leased(partition, name, group, topic)
    fetched = [m for m in fetch_fresh(group, topic, partition) if m.offset in offsets]
    assert sorted(m.offset for m in fetched) == sorted(offsets)
    assert store().mark_delivered(group, topic, name, fetched, [], [], visibility) == {partition}
