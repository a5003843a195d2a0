"""Connection hygiene for long-running threads: a worker is not a request.

Django opens a connection per thread and closes it at the end of a request. A worker's
threads (poll loop, handler threads, lease keeper, scheduler) never end a request, so
they tidy their connections themselves: broken ones are closed (the next query opens a
new one), healthy ones are kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

logger = logging.getLogger(__name__)


def tidy_connections() -> None:
    """Close this thread's connections that broke or outlived ``CONN_MAX_AGE``; keep healthy ones.

    Django's ``close_old_connections()`` closes a connection whose ``CONN_MAX_AGE`` is 0
    (the default: "one connection per request") every time it is called, which would
    make a worker reconnect on every poll. A worker keeps its connection unless it broke,
    or unless a positive ``CONN_MAX_AGE`` has passed.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        if connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()
        elif (
            connection.settings_dict.get("CONN_MAX_AGE")
            and connection.close_at is not None
            and time.monotonic() >= connection.close_at
        ):
            connection.close()


def close_quietly(using: str) -> None:
    """Close this thread's connection to ``using`` after a failure; closing a broken one may raise too."""
    try:
        connections[using].close()
    except Exception:  # a broken connection being discarded
        logger.debug("closing the failed connection raised", exc_info=True)


def close_all_quietly() -> None:
    """Close every connection of this thread (a thread that ends), ignoring errors."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except Exception:  # a broken connection being discarded
            logger.debug("closing a connection raised", exc_info=True)


def on_own_connection(fn: Callable[[], bool]) -> bool:
    """Run ``fn`` on a short-lived thread, so on connections of its own, committed at once
    (``ReceivedMessage.extend_visibility`` in an atomic handler's transaction)."""

    result: list[bool] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="sqlqueue-extend-visibility", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
