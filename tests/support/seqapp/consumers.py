"""Consumers of the sequencing and ordering process tests: record every delivery."""

from __future__ import annotations

import os
import time

from django_sqlqueue import ReceivedMessage, Retry, consumer

from .models import Seen

WORKER = os.environ.get("SQLQUEUE_TEST_WORKER", f"pid{os.getpid()}")


def record(message: ReceivedMessage) -> None:
    Seen.objects.create(
        group=message.group,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        offset=message.offset,
        message_id=message.id,
        n=message.payload.get("n", -1) if isinstance(message.payload, dict) else -1,
        worker=WORKER,
    )
    script = message.payload if isinstance(message.payload, dict) else {}
    if script.get("sleep"):
        time.sleep(script["sleep"])
    if script.get("retry_first") and message.attempt == 1:
        raise Retry(delay=script["retry_first"])


for group in ("s1", "s2"):
    consumer("seq.events", group=group, batch_size=20, visibility_timeout=10)(record)
consumer("seq.one", group="s1", batch_size=50, visibility_timeout=10)(record)
consumer("seq.perkey", group="s1", batch_size=1, visibility_timeout=30)(record)
