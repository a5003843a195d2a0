"""Consumers run by the multi-process tests (tests/processes/test_processes.py).

Each call is recorded in ``Handled`` first; the payload then scripts the outcome:
``{"sleep": s}``, ``{"sleep_first": s}`` (attempt 1 only), ``{"sleep_in": {group: s}}``, ``{"fail": [groups]}``,
``{"retry": [groups], "delay": s}``, ``{"reject": [groups]}``, ``{"fail_first": [groups]}`` (attempt 1 only),
``{"kill_thread": name}`` (fault injection: the worker's thread of that name dies, as if
its code had crashed: ``SystemExit`` is raised in it asynchronously),
``{"exit_first": code}`` (attempt 1 only: the handler raises ``SystemExit(code)``, as a
library calling ``sys.exit()`` would).

``proc.hang`` (group ``hang``) hangs forever on ``{"hang": true}`` (tests/processes/test_watchdog.py).

``proc.async`` is consumed by ``async def`` handlers (group ``async``) recording through
the async ORM, with the same script.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
import time

from django_sqlqueue import ReceivedMessage, Reject, Retry, consumer

from .models import Handled

WORKER = os.environ.get("SQLQUEUE_TEST_WORKER", f"pid{os.getpid()}")
VISIBILITY_TIMEOUT = 4


class ScriptedFailure(Exception):
    pass


def _record(message: ReceivedMessage) -> dict:
    return {
        "group": message.group,
        "topic": message.topic,
        "partition": message.partition,
        "key": message.key,
        "offset": message.offset,
        "message_id": message.id,
        "attempt": message.attempt,
        "worker": WORKER,
    }


def _outcome(message: ReceivedMessage, script: dict) -> None:
    if message.group in script.get("fail", ()) or (
        message.group in script.get("fail_first", ()) and message.attempt == 1
    ):
        raise ScriptedFailure(f"scripted failure of {message.id} in {message.group}")
    if message.group in script.get("retry", ()):
        raise Retry(delay=script.get("delay", 30))
    if message.group in script.get("reject", ()):
        raise Reject(f"poison message {message.id}")


def kill_thread(name: str) -> int:
    """Raise ``SystemExit`` in this process's threads called ``name``; return how many."""
    killed = 0
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            killed += ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit)
            )
    return killed


def behave(message: ReceivedMessage) -> None:
    Handled.objects.create(**_record(message))
    script = message.payload if isinstance(message.payload, dict) else {}
    if script.get("kill_thread"):
        kill_thread(script["kill_thread"])
    if "exit_first" in script and message.attempt == 1:
        raise SystemExit(script["exit_first"])
    if script.get("sleep_first") and message.attempt == 1:
        time.sleep(script["sleep_first"])
    if script.get("sleep"):
        time.sleep(script["sleep"])
    if message.group in script.get("sleep_in", {}):
        time.sleep(script["sleep_in"][message.group])
    _outcome(message, script)


async def behave_async(message: ReceivedMessage) -> None:
    await Handled.objects.acreate(**_record(message))
    script = message.payload if isinstance(message.payload, dict) else {}
    if script.get("sleep"):
        await asyncio.sleep(script["sleep"])
        await message.aextend_visibility(VISIBILITY_TIMEOUT)
    _outcome(message, script)


for group in ("g1", "g2"):
    consumer("proc.events", group=group, batch_size=10, visibility_timeout=4, max_attempts=3)(behave)
consumer("proc.strict", group="strict", batch_size=1, visibility_timeout=4)(behave)
consumer("proc.async", group="async", batch_size=5, visibility_timeout=VISIBILITY_TIMEOUT, max_attempts=3)(behave_async)


def hang_or_record(message: ReceivedMessage) -> None:
    """``{"hang": true}``: never returns (an HTTP call without a timeout); the rest are recorded."""
    Handled.objects.create(**_record(message))
    if isinstance(message.payload, dict) and message.payload.get("hang"):
        threading.Event().wait()


# tests/processes/test_watchdog.py: the hung-handler case (timeout = visibility timeout).
consumer("proc.hang", group="hang", batch_size=10, visibility_timeout=3, max_attempts=2)(hang_or_record)


if os.environ.get("SQLQUEUE_TEST_ATOMIC"):
    # tests/processes/test_atomic.py only (the in-process tests list the declared consumers):
    # the same script, in one transaction with the ack. ``behave`` records Handled first, so a
    # worker killed mid-handler leaves no Handled row of that attempt.
    consumer("proc.atomic", group="atomic", batch_size=10, visibility_timeout=VISIBILITY_TIMEOUT, atomic=True)(behave)
