"""Garbage collection of the message log (also run by every worker on its partitions)."""

from __future__ import annotations

from collections.abc import Sequence

from .conf import get_settings
from .store import QueueStore


def collect_garbage(*, topics: Sequence[str] | None = None, using: str | None = None) -> dict[str, int]:
    """Delete messages every consuming group has acked; return deletions per topic.

    A message goes only when it is at or below the lowest watermark of every group that
    consumes its topic and, with ``SQLQUEUE["RETENTION"]``, older than that many seconds.
    """
    conf = get_settings()
    store = QueueStore(using or conf.DATABASE)
    if topics is None:
        topics = list(store.registered_topics())
    return {topic: store.collect_garbage(topic, None, conf.RETENTION) for topic in topics}
