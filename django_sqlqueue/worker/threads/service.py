"""The side threads of a worker (lease keeper, scheduler): one small base, supervised.

A :class:`ServiceThread` runs :meth:`~ServiceThread.body` on a daemon thread with its own
database connection, closed when the thread ends. Its waits are ``stop_event.wait``, so
:meth:`~ServiceThread.stop` wakes it at once. Database failures inside the body are the
body's business (it reports them through the worker's
:class:`~django_sqlqueue.worker.outage.OutageReporter` and goes on); anything that escapes the
body ends the thread.

**Supervision.** A side thread that ends while nobody asked it to stop is a dead
service: a dead lease keeper renews nothing, so the worker would go on polling
partitions whose leases expire under it. The thread records why it ended
(:attr:`~ServiceThread.error`) and calls ``on_death``; the worker then stops, hands back
what it can and exits non-zero, so that a process manager restarts it (procrastinate
and Solid Queue supervise their side tasks the same way).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ...db.conn import close_all_quietly, close_quietly
from ...db.retry import Retrying
from ..outage import OutageReporter

logger = logging.getLogger(__name__)


def log_death(log: logging.Logger, title: str, error: BaseException) -> None:
    """Log one ERROR, with the traceback, for a worker thread that died (side or handler thread)."""
    log.error(
        "%s thread died: %s: %s", title, type(error).__name__, error, exc_info=(type(error), error, error.__traceback__)
    )


class ServiceThread:
    """A worker's side thread; subclasses implement :meth:`body`."""

    #: Thread name (shown in logs and by py-spy).
    thread_name = "sqlqueue-service"
    #: What the logs call it ("lease keeper").
    title = "service"

    def __init__(self, *, using: str, outage: OutageReporter, stop_timeout: float) -> None:
        self.using = using
        self.outage = outage
        self.stop_timeout = stop_timeout
        self.stop_event = threading.Event()
        self.db = Retrying(using, self.stop_event)
        #: Why the thread ended without being asked to (None: it did not, or not yet).
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._on_death: Callable[[ServiceThread], None] | None = None

    def body(self) -> None:
        """Run until ``stop_event`` is set (override)."""
        raise NotImplementedError

    def start(self, on_death: Callable[[ServiceThread], None] | None = None) -> None:
        """Start the thread; ``on_death(self)`` is called if it ends before :meth:`stop`."""
        self._on_death = on_death
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish and wait for it (at most ``stop_timeout`` seconds)."""
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(self.stop_timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def died(self) -> bool:
        """Whether the thread ended without being asked to stop."""
        return self._thread is not None and not self._thread.is_alive() and not self.stop_event.is_set()

    def failed(self, exc: BaseException, msg: str, *args: object) -> None:
        """Report a failed step (outage-aware) and drop the connection it may have broken."""
        self.outage.failure(logger, exc, msg, *args)
        close_quietly(self.using)

    def _run(self) -> None:
        try:
            self.body()
            if not self.stop_event.is_set():
                raise RuntimeError(f"the {self.title} returned without being asked to stop")
        except BaseException as exc:  # noqa: BLE001 - recorded and reported to the supervisor
            self.error = exc
        finally:
            close_all_quietly()
        if self.error is not None and not self.stop_event.is_set():
            log_death(logger, self.title, self.error)
            if self._on_death is not None:
                self._on_death(self)
