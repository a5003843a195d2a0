"""Signal handling for workers: the first SIGTERM/SIGINT drains, the second exits at once."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Exit status after a second signal (128 + SIGTERM, as a shell reports a killed process).
FORCED_EXIT_STATUS = 143


@contextmanager
def graceful_signals(on_first: Callable[[], None]) -> Iterator[None]:
    """Install SIGTERM/SIGINT handlers for the duration of the block, then restore them.

    The first signal calls ``on_first`` (ask the worker to drain: finish the message in
    hand, release leases, deregister). A second signal ends the process immediately,
    without cleanup; leases then expire and in-flight messages are redelivered after
    their visibility timeout.

    **Nothing runs in the signal handler but a write to a pipe.** Python runs handlers on
    the main thread between two bytecodes, possibly while that thread holds a lock --
    the worker's poll loop waits on ``threading.Event`` objects all the time, and an
    ``Event`` is a ``Condition`` over a plain ``Lock`` -- so a handler that set an event
    (or logged: a buffered stream is not reentrant either) could deadlock the process
    on itself. The handler writes the signal's number to a pipe; a small watcher thread
    reads it and calls ``on_first`` (and logs) in an ordinary thread context.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    received = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal received
        received += 1
        if received == 1:
            try:
                os.write(write_fd, bytes([signum]))
            except OSError:  # the pipe is closed: the block has ended
                pass
        else:
            name = signal.Signals(signum).name
            os.write(2, f"received {name} again, exiting now\n".encode())
            os._exit(FORCED_EXIT_STATUS)

    def watch() -> None:
        data = os.read(read_fd, 1)  # the first signal, or b"" once the block has ended
        if data:
            # INFO: deploys and scale-downs send it routinely. The second signal, which abandons
            # the messages in hand, is the unusual one: handler() writes it to stderr whatever
            # the log level.
            logger.info("received %s, draining (send it again to exit at once)", signal.Signals(data[0]).name)
            on_first()

    watcher = threading.Thread(target=watch, name="sqlqueue-signals", daemon=True)
    watcher.start()
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        os.close(write_fd)
        watcher.join(5)
        os.close(read_fd)
