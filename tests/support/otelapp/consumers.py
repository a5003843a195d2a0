"""Consumers of the tracing tests' runconsumer processes (tests/processes/test_tracing.py).

Installed only by tests/support/process_settings_otel.py. ``otel.events`` (group ``otel``) scripts
its outcome by payload: ``{"forward": topic}`` publishes to ``topic`` from inside the
handler (its send span must be a child of the process span), ``{"fail": true}`` raises.
``otel.slow`` (group ``otelslow``, timeout 0.3 s) sleeps ``{"sleep": s}`` seconds: the
watchdog abandons it, and the handler returns later all the same.
"""

from __future__ import annotations

import time

from django_sqlqueue import ReceivedMessage, consumer, publish


class ScriptedFailure(Exception):
    pass


@consumer("otel.events", group="otel", batch_size=10, visibility_timeout=10, max_attempts=2)
def traced(message: ReceivedMessage) -> None:
    script = message.payload if isinstance(message.payload, dict) else {}
    if script.get("forward"):
        publish(script["forward"], {"from": message.id}, key=message.key)
    if script.get("fail"):
        raise ScriptedFailure(f"scripted failure of {message.id}")


@consumer("otel.slow", group="otelslow", batch_size=1, visibility_timeout=10, max_attempts=1, timeout=0.3)
def slow(message: ReceivedMessage) -> None:
    time.sleep(message.payload.get("sleep", 0))
