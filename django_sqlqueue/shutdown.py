"""Signal handling for workers: the first SIGTERM/SIGINT drains, the second exits at once."""

from __future__ import annotations

import logging
import os
import signal
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
    """
    received = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal received
        received += 1
        if received == 1:
            logger.warning("received %s, draining (send it again to exit at once)", signal.Signals(signum).name)
            on_first()
        else:
            logger.warning("received %s again, exiting now", signal.Signals(signum).name)
            os._exit(FORCED_EXIT_STATUS)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
