"""Consumers run by the multi-process tests (tests/test_processes.py).

Each call is recorded in ``Handled`` first; the payload then scripts the outcome:
``{"sleep": s}``, ``{"sleep_first": s}`` (attempt 1 only), ``{"sleep_in": {group: s}}``, ``{"fail": [groups]}``,
``{"retry": [groups], "delay": s}``, ``{"reject": [groups]}``.
"""

from __future__ import annotations

import os
import time

from django_sqlqueue import ReceivedMessage, Reject, Retry, consumer

from .models import Handled

WORKER = os.environ.get("SQLQUEUE_TEST_WORKER", f"pid{os.getpid()}")


class ScriptedFailure(Exception):
    pass


def behave(message: ReceivedMessage) -> None:
    Handled.objects.create(
        group=message.group,
        topic=message.topic,
        partition_key=message.partition_key,
        offset=message.offset,
        message_id=message.id,
        attempt=message.attempt,
        worker=WORKER,
    )
    script = message.payload if isinstance(message.payload, dict) else {}
    if script.get("sleep_first") and message.attempt == 1:
        time.sleep(script["sleep_first"])
    if script.get("sleep"):
        time.sleep(script["sleep"])
    if message.group in script.get("sleep_in", {}):
        time.sleep(script["sleep_in"][message.group])
    if message.group in script.get("fail", ()):
        raise ScriptedFailure(f"scripted failure of {message.id} in {message.group}")
    if message.group in script.get("retry", ()):
        raise Retry(delay=script.get("delay", 30))
    if message.group in script.get("reject", ()):
        raise Reject(f"poison message {message.id}")


for group in ("g1", "g2"):
    consumer("proc.events", group=group, batch_size=10, visibility_timeout=4, max_attempts=3)(behave)
consumer("proc.strict", group="strict", batch_size=1, visibility_timeout=4)(behave)
