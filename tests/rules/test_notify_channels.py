"""rules/notify_channels.py: one PostgreSQL notification channel per topic, within 63 bytes.

tests/worker/threads/test_listener.py shows the channels at work (a notification waking a worker).
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqlqueue.rules.limits import MAX_TOPIC_LENGTH
from django_sqlqueue.rules.notify_channels import CHANNEL_PREFIX, MAX_CHANNEL_BYTES, channel_for

#: The longest topic whose channel is its plain name.
PLAIN = MAX_CHANNEL_BYTES - len(CHANNEL_PREFIX)


def test_a_short_topic_is_its_own_channel_up_to_63_bytes() -> None:
    assert channel_for("orders") == "sqlqueue.orders"
    assert channel_for("x" * PLAIN) == CHANNEL_PREFIX + "x" * PLAIN
    assert len(channel_for("x" * PLAIN)) == MAX_CHANNEL_BYTES


def test_a_longer_topic_is_cut_and_hashed_and_stays_apart_from_its_neighbours() -> None:
    longer = "x" * (PLAIN + 1)
    channel = channel_for(longer)
    assert channel.startswith(CHANNEL_PREFIX + "x" * 30 + "~") and len(channel.encode()) <= MAX_CHANNEL_BYTES
    assert channel_for(longer) == channel  # the same in every process: publishers and listeners agree
    longest = ["y" * MAX_TOPIC_LENGTH, "y" * (MAX_TOPIC_LENGTH - 1) + "z", "y" * PLAIN + "z"]
    channels = {channel_for(t) for t in [longer, *longest]}
    assert len(channels) == 4 and all(len(c.encode()) <= MAX_CHANNEL_BYTES for c in channels)


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="notification channels are PostgreSQL's (NOTIFY)")
def test_postgresql_takes_every_channel() -> None:
    with connection.cursor() as cursor:
        for topic in ("orders", "x" * PLAIN, "y" * MAX_TOPIC_LENGTH):
            cursor.execute("SELECT pg_notify(%s, '')", [channel_for(topic)])
            cursor.execute("LISTEN " + connection.ops.quote_name(channel_for(topic)))
            cursor.execute("UNLISTEN " + connection.ops.quote_name(channel_for(topic)))
