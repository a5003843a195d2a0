"""The chaos run's consumers: each handling is appended to a file of this process, then acked.

Two groups consume ``chaos.events`` (every message carries ``{"key", "seq"}``):

- ``strict``: ``batch_size=1``, one message of a partition in flight at a time
  (visibility timeout 4 s);
- ``batch``: ``batch_size=10``, the default kind of consumer; its visibility timeout
  (10 s) is longer than a SIGSTOP of the harness (5.5 s), so that what a paused worker
  handles after SIGCONT is still invisible to the partition's new holder and only the
  lease fence keeps its late ack out (the harness checks that such messages are
  redelivered).

Both have a ``max_attempts`` far above what the faults can cost a message, so nothing of
``chaos.events`` is dead-lettered because workers were killed under it. ``chaos.hang``
carries one message whose handler never returns (group ``batch``, ``max_attempts=2``, a
handler timeout of 3 s): it must end in ``chaos.hang_dlq`` without stalling the rest.

On request the handler threads also stop their process inside a batch's outcome transaction
(``freeze_in_fence``, an execute wrapper): the lease rows share-locked, nothing committed.

A record is one line, written with one ``write()`` to a file opened ``O_APPEND`` (atomic
between the threads of a ``--concurrency`` worker) before the handler returns, so it
survives a ``kill -9`` of the process right after; a handling whose process died before
the line was written did not complete and is redelivered. The harness reads the files
(tests/chaos/harness.py, ``Record``).
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
import time
from typing import Any

from django.db.backends.signals import connection_created

from django_sqlqueue import ReceivedMessage, consumer

DIRECTORY = os.environ["CHAOS_DIR"]
SLOT = os.environ.get("SQLQUEUE_TEST_WORKER", "?")
PID = os.getpid()
_fd = os.open(os.path.join(DIRECTORY, f"handled-{SLOT}-{PID}.tsv"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

#: ``timeout=`` (issue 14: a handler that runs longer is given up) where the engine has it.
HAS_TIMEOUT = "timeout" in inspect.signature(consumer).parameters
HANG_TIMEOUT = 3.0


def record(kind: str, message: ReceivedMessage, start: float) -> None:
    """Append one handling: kind, group, topic, partition, offset, id, key, seq, attempt, pid, slot, start, end."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    fields = (
        kind,
        message.group,
        message.topic,
        message.partition,
        message.offset,
        message.id,
        message.key,
        payload.get("seq", -1),
        message.attempt,
        PID,
        SLOT,
        f"{start:.6f}",
        f"{time.monotonic():.6f}",
    )
    os.write(_fd, ("\t".join(map(str, fields)) + "\n").encode())


#: Created by the harness to have this process stopped inside a handler (see handle()).
PAUSE_REQUEST = os.path.join(DIRECTORY, f"pause-{PID}")


def handle(message: ReceivedMessage) -> None:
    start = time.monotonic()
    time.sleep(0.001)  # a little work, as a real handler does
    if message.group == "batch" and os.path.exists(PAUSE_REQUEST):
        # The harness asked for a SIGSTOP in the middle of a batch: the process stops
        # itself here, and the harness sends SIGCONT after longer than a lease. This
        # message's ack and the rest of its batch then come after SIGCONT, from a worker
        # that has lost the partition meanwhile.
        try:
            os.unlink(PAUSE_REQUEST)
        except FileNotFoundError:  # another handler thread of this process took the request
            pass
        else:
            record("pause", message, time.monotonic())
            os.kill(PID, signal.SIGSTOP)
            # kill() can return before the group stop has reached this thread (another thread
            # takes the signal and stops the rest): this thread then ran on, wrote its record
            # before the stop and was frozen in the batch's ack transaction instead, which is
            # not the fault meant here. Wait for the stop in the handler.
            time.sleep(0.2)
    record("handled", message, start)


#: Created by the harness to have this process stopped inside a batch's outcome transaction.
ACK_PAUSE_REQUEST = os.path.join(DIRECTORY, f"ackpause-{PID}")
_FENCE = ("queue_partition_leases", "SHARE")


def freeze_in_fence(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """An execute wrapper on the handler threads' connections: when the harness asks, run the
    fence of a batch's outcome writes (``lock_held``: the lease rows share-locked) and stop
    the process right after it, inside that transaction, with the locks held."""
    result = execute(sql, params, many, context)
    if (
        all(part in sql for part in _FENCE)
        and threading.current_thread().name.startswith("sqlqueue-handler")
        and os.path.exists(ACK_PAUSE_REQUEST)
    ):
        try:
            os.unlink(ACK_PAUSE_REQUEST)
        except FileNotFoundError:  # another handler thread took the request
            return result
        group, topic, _name, partition = params[0], params[1], params[2], params[3]
        # PostgreSQL's one-statement ack passes its partitions as one array (StoreBase.held_leases);
        # that statement has committed by now: the pause falls after the ack, not inside it.
        if isinstance(partition, list):
            partition = partition[0]
        fields = ("ackpause", group, topic, partition, -1, "", "", -1, 0, PID, SLOT, f"{time.monotonic():.6f}")
        os.write(_fd, ("\t".join(map(str, (*fields, fields[-1]))) + "\n").encode())
        os.kill(PID, signal.SIGSTOP)
        time.sleep(0.2)  # the group stop reaches this thread here, before the COMMIT (see handle())
    return result


def _watch_fences(sender: Any, connection: Any, **kwargs: Any) -> None:
    if freeze_in_fence not in connection.execute_wrappers:
        connection.execute_wrappers.append(freeze_in_fence)


connection_created.connect(_watch_fences, dispatch_uid="chaosapp.freeze_in_fence")


def hang(message: ReceivedMessage) -> None:
    """Never return (an HTTP call without a timeout): the worker's handler timeout must free the partition."""
    record("hang", message, time.monotonic())
    threading.Event().wait()


consumer("chaos.events", group="strict", batch_size=1, visibility_timeout=4, max_attempts=1000)(handle)
consumer("chaos.events", group="batch", batch_size=10, visibility_timeout=10, max_attempts=1000)(handle)
_hang_options: dict[str, Any] = {"timeout": HANG_TIMEOUT} if HAS_TIMEOUT else {}
consumer("chaos.hang", group="batch", batch_size=1, max_attempts=2, **_hang_options)(hang)
