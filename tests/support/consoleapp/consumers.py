"""``console.events`` consumed by groups ``c1`` and ``c2``.

The payload scripts the outcome: ``{"fail_while": path, "fail_groups": [...]}`` fails in
those groups while the file exists (max_attempts=1: dead-lettered at once). Every
successful handling is recorded by publishing to ``console.handled`` (nobody consumes
it), in the handler's own transaction, so the tests read it from the log.
"""

from __future__ import annotations

import os

from django.db import transaction

from django_sqlqueue import ReceivedMessage, consumer, publish
from django_sqlqueue.rules.dlq import REPLAY_KEY

WORKER = os.environ.get("SQLQUEUE_TEST_WORKER", f"pid{os.getpid()}")


def handle(message: ReceivedMessage) -> None:
    script = message.payload if isinstance(message.payload, dict) else {}
    if message.group in script.get("fail_groups", ()) and os.path.exists(script.get("fail_while", "")):
        raise ValueError(f"scripted failure of {message.id} in {message.group}")
    with transaction.atomic():
        publish(
            "console.handled",
            {
                "group": message.group,
                "id": message.id,
                "offset": message.offset,
                "worker": WORKER,
                "replay": (message.metadata or {}).get(REPLAY_KEY),
            },
        )


for group in ("c1", "c2"):
    consumer("console.events", group=group, batch_size=5, visibility_timeout=4, max_attempts=1)(handle)
