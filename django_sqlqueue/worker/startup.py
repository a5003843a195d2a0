"""What a worker does once, before its first poll.

- :func:`register_when_reachable` registers the consumed topics with their partition
  counts (:func:`register_topics`, which refuses a count other than the registered one),
  waiting out a database it cannot reach, or that refuses another connection, like any
  outage (``outage.py``): a worker started while the server is down starts once it gets in;
- :func:`check_connection_room` compares the server's room for more connections with the
  worker's budget (``budget.py``) and warns once if they do not fit;
- :func:`warn_unreached_topics` warns once per consumed topic that no message has reached
  and nothing declares -- a typo in ``@consumer(...)``, most likely (``sqlqueue.W003``).

They run on the poll loop's thread and connection, before the side threads open theirs
(``loop.py``); ``django_sqlqueue.testing.drain`` registers its topics the same way. This
module imports the data layer, ``checks`` (the test of a topic it shares with the system
check) and the worker's leaves (``budget``, ``outage``).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterable
from functools import partial

from ..checks import unreached_topics
from ..conf import QueueSettings
from ..db.conn import close_quietly
from ..db.retry import Retrying
from ..db.store import QueueStore
from ..exceptions import ConfigurationError
from .budget import ConnectionBudget, room_warning
from .outage import OutageReporter, is_unreachable

logger = logging.getLogger(__name__)


def register_topics(store: QueueStore, conf: QueueSettings, db: Retrying, topics: Iterable[str]) -> None:
    """Register ``topics`` with their partition counts; refuse a mismatch.

    Publishers hash keys with the count in their settings: a worker whose settings
    disagree with the registered count would consume a topic that publishers
    partition differently. Changing the count is an explicit operation
    (``manage.py queue_topic repartition``).
    """
    for topic in sorted(set(topics)):
        wanted = conf.partitions_for(topic)
        registered = db("register topic", partial(store.register_topic, topic, wanted))
        if registered != wanted:
            raise ConfigurationError(
                f"topic {topic!r} is registered with {_describe(registered)}, but SQLQUEUE gives it "
                f"{_describe(wanted)}. Change the partition count explicitly with "
                f"`manage.py queue_topic repartition {topic} <n>` (keys move to other partitions; drain "
                "the topic first if order across the change matters), or fix SQLQUEUE['TOPICS']."
            )


def _describe(partitions: int | None) -> str:
    return "one partition per key" if partitions is None else f"{partitions} partitions"


def register_when_reachable(
    store: QueueStore,
    conf: QueueSettings,
    db: Retrying,
    topics: Iterable[str],
    *,
    stop_event: threading.Event,
    outage: OutageReporter,
) -> bool:
    """:func:`register_topics`, waiting out an unreachable database; False if stopped first.

    A worker started while the server is down, or while it refuses more connections
    (MySQL 1040, PostgreSQL 53300), reports an outage (a few lines, no traceback) and
    starts once it gets in, instead of exiting with a traceback for its process
    manager to restart.
    """
    topics = list(topics)
    while not stop_event.is_set():
        try:
            register_topics(store, conf, db, topics)
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            outage.unreachable(exc)
            close_quietly(store.using)
            stop_event.wait(conf.POLL_INTERVAL_MAX)
        else:
            outage.reachable()
            return True
    return False


def check_connection_room(store: QueueStore, budget: ConnectionBudget, *, name: str) -> None:
    """Warn once if the server has less room for connections than ``budget`` needs.

    Runs on the poll loop's connection, before the side threads open theirs. A server
    that will not say (no privilege, SQLite) is not an error: logged at DEBUG.
    """
    try:
        limits = store.connection_limits()
    except Exception:  # a courtesy check: the worker goes on without it
        logger.debug("could not read the server's connection limits", exc_info=True)
        close_quietly(store.using)
        return
    if not limits:
        logger.debug("no connection limit to check (%s) alias=%s", store.connection.vendor, store.using)
        return
    warning = room_warning(limits, needed=budget.total)
    if warning is not None:
        logger.warning("%s; connections of this worker: %s subscriber=%s", warning, budget.describe(), name)
    else:
        logger.debug("connection limits %s leave room for this worker's %s", limits, budget.describe())


def is_async(handler: object) -> bool:
    """Whether ``handler`` is ``async def`` (a function or an object whose ``__call__`` is):
    such a handler needs an event loop thread, and a connection, of its own (``budget.py``)."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or (call is not None and inspect.iscoroutinefunction(call))


def warn_unreached_topics(store: QueueStore, conf: QueueSettings, consumed: Iterable[tuple[str, str]]) -> None:
    """Warn once per consumed topic ((group, topic) pairs) that looks like a typo: no message
    has reached it and nothing declares it (``checks.unreached_topics``, ``sqlqueue.W003``).

    A worker that consumes ``order.created`` for ``orders.created`` would otherwise lease the
    partitions of a topic that never gets a message, without a word. A courtesy check, like
    :func:`check_connection_room`: if it fails, the worker goes on without it.
    """
    try:
        found = unreached_topics(consumed, store.using, conf)
    except Exception:  # a courtesy check: the worker goes on without it
        logger.debug("could not look for consumed topics without messages", exc_info=True)
        close_quietly(store.using)
        return
    for topic in found:
        logger.warning(
            "%s -- a typo in @consumer(...)? (a new topic: declare it in SQLQUEUE['TOPICS'] to silence this; "
            "sqlqueue.W003)",
            topic.describe(),
        )
