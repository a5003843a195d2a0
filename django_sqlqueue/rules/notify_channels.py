"""The names of the PostgreSQL notification channels, one per topic (a leaf module: the
publisher and the workers' listener both need them; see ``worker/threads/listener.py``)."""

from __future__ import annotations

import hashlib

#: PostgreSQL's longest identifier (NAMEDATALEN - 1 bytes); ``pg_notify`` refuses a longer channel.
MAX_CHANNEL_BYTES = 63
CHANNEL_PREFIX = "sqlqueue."


def channel_for(topic: str) -> str:
    """The notification channel of ``topic``: ``sqlqueue.<topic>``, or, when that is longer
    than PostgreSQL's 63-byte identifiers, the topic's first 30 characters and a hash of it."""
    channel = CHANNEL_PREFIX + topic
    if len(channel.encode()) <= MAX_CHANNEL_BYTES:
        return channel
    digest = hashlib.sha1(topic.encode()).hexdigest()[:16]
    return f"{CHANNEL_PREFIX}{topic[:30]}~{digest}"
