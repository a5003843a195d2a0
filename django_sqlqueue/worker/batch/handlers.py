"""Calling a consumer's handler, sync or ``async def``.

A sync handler is called on the worker's thread. An ``async def`` handler (or any
handler that returns an awaitable) is run to completion on an event loop owned by the
worker's thread: one loop per :class:`HandlerRunner`, created on the first async
handler and reused for every later message, closed when the worker stops.

Inside an async handler Django behaves as in an async view: the loop is running on the
thread, so synchronous ORM calls raise ``SynchronousOnlyOperation``. Use the async ORM
(``await Model.objects.acreate(...)``, ``aget``, ``async for``...) or wrap sync code in
``asgiref.sync.sync_to_async``; both run the queries on asgiref's thread-sensitive
executor thread and its connections, which the runner tidies after each async handler
(broken or expired connections are closed, as the worker does with its own).

The outcome is the same as for a sync handler: returning acks, raising nacks,
``Retry(delay)`` nacks with that delay, ``Reject`` dead-letters.

**Timeouts.** Given the batch's :class:`~django_sqlqueue.worker.batch.progress.BatchProgress`, an
awaited handler is cancelled for real at its deadline: the handler's task gets
``CancelledError`` at its current ``await`` (its ``finally`` blocks and ``async with``
exits run), and the attempt fails with :class:`~django_sqlqueue.exceptions.HandlerTimeout`.
The deadline follows progress: ``aextend_visibility`` moves it. A handler that blocks
the loop (a sync call inside ``async def``) cannot be cancelled: the watchdog abandons
its thread like a sync handler's (``threads/watchdog.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...db.conn import tidy_connections
from ...exceptions import HandlerTimeout
from .progress import BatchProgress

logger = logging.getLogger(__name__)


class HandlerRunner:
    """Invokes handlers for one worker thread; owns that thread's event loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, handler: Callable[[Any], Any], message: Any, progress: BatchProgress | None = None) -> Any:
        """Call ``handler(message)``; if it returns an awaitable, await it on this runner's
        loop, cancelled at the deadline ``progress`` gives (see the module docstring)."""
        result = handler(message)
        if inspect.isawaitable(result):
            if progress is not None and progress.handler_deadline() is not None:
                progress.cancel_in_place()
                return self.run(_until_deadline(result, progress, _name(handler)))
            return self.run(result)
        return result

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to completion on the reused loop and return its result."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        error: BaseException | None = None
        try:
            result = self._loop.run_until_complete(_as_coroutine(awaitable))
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after tidying
            error = exc
        # Outside the except block: sync_to_async would re-raise the active exception in
        # its thread and add its frames to the handler's traceback.
        self._loop.run_until_complete(_tidy_executor_connections())
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        """Cancel tasks a handler left behind, close the loop and the executor's connections."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(_close_executor_connections())
        except Exception:
            logger.exception("could not shut the handlers' event loop down cleanly")
        finally:
            loop.close()


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _until_deadline(awaitable: Awaitable[Any], progress: BatchProgress, name: str) -> Any:
    """Await ``awaitable``; cancel it once ``progress``'s deadline passes (re-read on each
    wake-up, so progress reported meanwhile moves it) and raise ``HandlerTimeout``."""
    task = asyncio.ensure_future(awaitable)
    while True:
        deadline = progress.handler_deadline()
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, _ = await asyncio.wait({task}, timeout=wait)
        if done:
            return task.result()
        deadline = progress.handler_deadline()
        if deadline is not None and time.monotonic() >= deadline:
            break
    started, timeout = progress.started, progress.timeout
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - CancelledError, or what the handler raised on its way out
        pass
    raise HandlerTimeout(
        f"handler {name} ran {time.monotonic() - started:.1f}s, over its timeout of {timeout:g}s without progress; "
        "it was cancelled"
    )


def _name(handler: Callable[..., Any]) -> str:
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', type(handler).__qualname__)}"


async def _tidy_executor_connections() -> None:
    from asgiref.sync import sync_to_async

    # Runs on the thread-sensitive executor: the thread whose connections the async ORM used.
    await sync_to_async(tidy_connections, thread_sensitive=True)()


async def _close_executor_connections() -> None:
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all, thread_sensitive=True)()
