"""The exactly-once run's consumers: one handler, three groups, each with its own ``atomic=``.

Every group consumes ``eo.events`` with the same handler, which

1. inserts one :class:`~tests.chaos.eoapp.models.Effect` row (no unique constraint),
2. increments its group's :class:`~tests.chaos.eoapp.models.Counter` (``n = n + 1``),
3. publishes one follow-up message to its group's follow-up topic (key: the message id,
   payload referencing it; no explicit ``id=``, so a second publish would store a second
   message).

``per`` is ``atomic=True`` (each message's writes and ack in one transaction), ``batch``
``atomic="batch"`` (a partition's batch in one transaction) and ``plain`` ``atomic=False``,
the control: at-least-once, so the faults of the run leave it duplicates.

``timeout=None``: a worker stopped inside a ``batch`` transaction holds the counter row
until it is continued and fenced off (5.5 s), and the other worker's handlers of that group
wait on the row meanwhile; a handler timeout shorter than that would add a fault of another
kind to this run (handler timeouts have tests of their own).

The harness asks for faults inside a handler by creating a file named after this process
and a group (tests/chaos/exactly_once.py): ``kill-<pid>-<group>``, and the next handler of
that group kills its own process (``kill -9``) after all three writes, before its
transaction commits (atomic) or its ack is written (plain); ``pause-<pid>-<group>``, and it
stops its process (``SIGSTOP``) after the effect row, the harness continuing it after longer
than a lease. Each such fault is written to ``inhandler-<pid>.tsv`` first.
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from typing import Any

from django.db.models import F

from django_sqlqueue import ReceivedMessage, consumer, publish
from tests.chaos.eoapp import EVENTS, FOLLOWUPS, MODES
from tests.chaos.eoapp.models import Counter, Effect

DIRECTORY = os.environ.get("CHAOS_DIR", "")
WORKER = os.environ.get("SQLQUEUE_TEST_WORKER", "?")
PID = os.getpid()
#: Seconds of "work" before the writes: the run lasts long enough for its faults, and a
#: random kill finds a handler in progress.
DELAY = float(os.environ.get("EO_HANDLER_DELAY", "0.002"))
#: ``@consumer(atomic=...)`` where the engine has it (issue 16); without it every group is
#: at-least-once, and the exactly-once test says so.
HAS_ATOMIC = "atomic" in inspect.signature(consumer).parameters


def _take(request: str, message: ReceivedMessage) -> bool:
    """Whether the harness asked for ``request`` (kill, pause) in this group; claim it if so."""
    if not DIRECTORY:
        return False
    path = os.path.join(DIRECTORY, f"{request}-{PID}-{message.group}")
    try:
        os.unlink(path)  # the claim: another handler thread of this process finds it gone
    except FileNotFoundError:
        return False
    line = f"{request}\t{message.group}\t{message.id}\t{message.attempt}\t{PID}\t{WORKER}\t{time.monotonic():.6f}\n"
    fd = os.open(os.path.join(DIRECTORY, f"inhandler-{PID}.tsv"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return True


def handle(message: ReceivedMessage) -> None:
    time.sleep(DELAY)
    Effect.objects.create(
        message_id=message.id, consumer_group=message.group, worker=WORKER, pid=PID, attempt=message.attempt
    )
    if _take("pause", message):
        os.kill(PID, signal.SIGSTOP)  # continued by the harness after longer than a lease
    Counter.objects.filter(name=message.group).update(n=F("n") + 1)
    publish(FOLLOWUPS[message.group], {"source": message.id, "group": message.group}, key=message.id)
    if _take("kill", message):
        os.kill(PID, signal.SIGKILL)


for _group, _mode in MODES.items():
    _options: dict[str, Any] = {"atomic": _mode} if HAS_ATOMIC else {}
    consumer(EVENTS, group=_group, batch_size=10, max_attempts=1000, timeout=None, **_options)(handle)
