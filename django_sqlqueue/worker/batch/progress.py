"""What a running batch is doing: shared by its handler thread and the worker's watchdog.

A batch runs on a handler thread (``threads/executor.py``, ``runner.py``). The poll loop's
watchdog (``threads/watchdog.py``) reads the batch's :class:`BatchProgress` to find a handler
that has gone longer than its timeout without progress, and may **abandon** the batch:
from that moment the batch's bookkeeping belongs to the watchdog, which writes what the
batch had decided so far, fails the attempt in hand and hands the rest back. The handler
thread learns it was abandoned the next time it reports (:meth:`BatchProgress.record`)
and writes nothing more.

**One lock, one winner.** Every transition takes :attr:`BatchProgress.lock`; the batch's
:class:`State` says who owns it:

- ``begin``: a handler call starts (its clock starts);
- ``touch``: the handler made progress (``extend_visibility``): its clock restarts;
- ``record``: the handler returned; its outcome is added to the batch's outcomes --
  unless the batch was abandoned meanwhile, in which case it is dropped;
- ``start_commit``: an atomic consumer's handler returned and its transaction is about
  to write the ack and commit (``atomic.py``); until ``end_commit`` (or ``record``) the
  batch cannot be abandoned -- so the watchdog's nack and the handler's commit never
  both happen: whichever takes the lock first wins, and a handler whose batch was
  abandoned finds ``start_commit`` refused and rolls its transaction back;
- ``start_writing``: the batch is about to write its outcomes; it can no longer be
  abandoned (its writes are short and fenced by the lease);
- ``abandon``: the watchdog takes the batch over -- only while a handler call is in hand
  and past its deadline.

So an outcome is written once, by the batch or by the watchdog, never by both; and
between ``record`` and the next ``begin`` (no handler in hand) the batch thread may touch
its outcomes without the lock, because ``abandon`` refuses then.

This module imports nothing of the package at run time (its collaborators' types only,
for the type checker).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...consumers import ReceivedMessage
    from ...db.store import FetchedMessage
    from ...tracing import ProcessSpan
    from ..subscription import Subscription
    from .outcomes import Outcomes


class State(enum.Enum):
    """Where a batch is; the transitions are in the module docstring."""

    #: Its handlers run, one at a time; abandonable while one is past its deadline.
    RUNNING = "running"
    #: An atomic consumer's transaction writes its ack and commits (not abandonable).
    COMMITTING = "committing"
    #: The batch thread writes its outcomes (not abandonable).
    WRITING = "writing"
    #: The watchdog took the batch over: the batch thread writes nothing more.
    ABANDONED = "abandoned"


#: Extra seconds the watchdog allows a handler that is cancelled in place (``async def``:
#: ``HandlerRunner`` cancels it at its deadline) before abandoning its thread.
CANCEL_GRACE = 2.0


class BatchProgress:
    """The state of one batch on a handler thread; see the module docstring."""

    def __init__(
        self,
        sub: Subscription,
        messages: Sequence[FetchedMessage],
        watermarks: Mapping[int, int],
        outcomes: Outcomes,
    ) -> None:
        self.lock = threading.Lock()
        #: The ``Subscription`` the batch belongs to.
        self.sub = sub
        #: The batch's messages, in the order they run.
        self.messages = messages
        #: Each partition's watermark when the batch was fetched (for the ack writes).
        self.watermarks = watermarks
        #: The batch's :class:`~.outcomes.Outcomes`: changed by the batch thread (see the module
        #: docstring for when it needs the lock), read by the watchdog once it abandoned.
        self.outcomes = outcomes
        self.state: State = State.RUNNING
        #: Position in ``messages`` of the message whose handler runs (-1: none).
        self.index = -1
        #: The handler's timeout (None: none), its start and its last progress (monotonic).
        self.timeout: float | None = None
        self.started = 0.0
        self.since = 0.0
        #: The handler is awaited and will be cancelled at its deadline (async).
        self.cancellable = False
        #: The thread running the handler, and the ``ReceivedMessage`` it was given.
        self.thread: threading.Thread | None = None
        self.received: ReceivedMessage | None = None
        #: The handler call's ``tracing.ProcessSpan`` (None: not traced): ended by the
        #: watchdog if it abandons the batch, else by the batch thread.
        self.span: ProcessSpan | None = None

    def begin(
        self,
        index: int,
        timeout: float | None,
        received: ReceivedMessage | None = None,
        span: ProcessSpan | None = None,
    ) -> bool:
        """A handler call on ``messages[index]`` (``received``: what the handler gets; ``span``:
        its process span) starts; False if the batch was abandoned."""
        with self.lock:
            if self.state is not State.RUNNING:
                return False
            self.index = index
            self.received = received
            self.span = span
            self.timeout = timeout
            self.started = self.since = time.monotonic()
            self.cancellable = False
            self.thread = threading.current_thread()
            return True

    def touch(self) -> None:
        """The handler made progress: restart its clock."""
        with self.lock:
            self.since = time.monotonic()

    def cancel_in_place(self) -> None:
        """The handler will be cancelled at its deadline (an awaitable): allow it a grace."""
        with self.lock:
            self.cancellable = True

    def handler_deadline(self) -> float | None:
        """When the handler in hand times out (monotonic), or None (no handler, no timeout)."""
        with self.lock:
            return self._deadline(grace=False)

    def watchdog_deadline(self) -> float | None:
        """When the watchdog may abandon the batch: the deadline, plus a grace if cancellable."""
        with self.lock:
            return self._deadline(grace=True)

    def _deadline(self, *, grace: bool) -> float | None:
        """(Under the lock.) The handler's deadline, None unless a call with a timeout runs."""
        if self.state is not State.RUNNING or self.index < 0 or self.timeout is None:
            return None
        return self.since + self.timeout + (CANCEL_GRACE if grace and self.cancellable else 0.0)

    def record(self, apply: Callable[[], object]) -> bool:
        """The handler returned: ``apply()`` adds its outcome, unless the batch was abandoned
        (then nothing happens and False is returned). Ends a commit (``start_commit``)."""
        with self.lock:
            if self.state is State.ABANDONED:
                return False
            apply()
            self.index = -1
            if self.state is State.COMMITTING:
                self.state = State.RUNNING
            return True

    def start_commit(self) -> bool:
        """An atomic handler's transaction commits now; False if the batch was abandoned
        (it must roll back: the watchdog failed the attempt). Until :meth:`end_commit` or
        :meth:`record` the batch cannot be abandoned."""
        with self.lock:
            if self.state is not State.RUNNING:
                return False
            self.state = State.COMMITTING
            return True

    def end_commit(self, apply: Callable[[], object] | None = None) -> None:
        """The commit begun by :meth:`start_commit` is over (committed or rolled back):
        ``apply()`` (if given) runs under the lock, and the batch is abandonable again."""
        with self.lock:
            if apply is not None:
                apply()
            if self.state is State.COMMITTING:
                self.state = State.RUNNING

    def start_writing(self) -> bool:
        """The batch writes its outcomes now; False if it was abandoned (it must not)."""
        with self.lock:
            if self.state is State.ABANDONED:
                return False
            self.state = State.WRITING
            return True

    def abandon(self, now: float) -> tuple[int, float, float] | None:
        """Take the batch over if its handler is past the watchdog's deadline.

        Return ``(index, seconds since the handler started, its timeout)``, or None when
        the batch is not abandonable now.
        """
        with self.lock:
            deadline = self._deadline(grace=True)
            if deadline is None or self.timeout is None or now < deadline:
                return None
            self.state = State.ABANDONED
            return self.index, now - self.started, self.timeout
