"""Garbage collection of the message log (also run by every worker on its partitions)."""

from __future__ import annotations

from collections.abc import Sequence

from ..conf import get_settings
from ..db.store import QueueStore
from .base import OperationError, brief_repr

#: The most ``pace`` may be: one statement in 101 of the time (slower is not collecting).
MAX_PACE = 100.0


def collect_garbage(
    *, topics: Sequence[str] | None = None, using: str | None = None, pace: float = 0.0
) -> dict[str, int]:
    """Delete messages every consuming group has acked; return deletions per topic.

    ``pace``: after each statement, sleep ``pace`` times as long as it took (0, the default:
    full speed; 1: the database spends half the time on it; 3: a quarter), for a big manual
    clean-up next to a busy publisher. 0 to :data:`MAX_PACE`, else :class:`OperationError`.

    A message goes only when it is at or below the lowest watermark of every group that
    consumes its topic and, with ``SQLQUEUE["RETENTION"]``, older than that many seconds.
    The per-hour counters (``queue_topic_hours``) of hours older than
    ``SQLQUEUE["STATS_RETENTION"]`` go too (every topic's, whatever ``topics`` says), and
    the console's history minutes older than ``SQLQUEUE["HISTORY_RETENTION"]``.
    Every database of the queue in turn (``SQLQUEUE["TOPIC_DATABASES"]``), or ``using``
    only; each of ``topics`` in its own database.
    """
    if isinstance(pace, bool) or not isinstance(pace, (int, float)) or not 0 <= pace <= MAX_PACE:
        raise OperationError(f"pace must be a number from 0 to {MAX_PACE:g}, got {brief_repr(pace)}.")
    conf = get_settings()
    deleted: dict[str, int] = {}
    for db in [using] if using else conf.databases:
        store = QueueStore(db)
        if topics is None:
            mine = list(store.registered_topics())
        else:
            mine = [topic for topic in topics if using or conf.database_for(topic) == db]
        for topic in mine:
            deleted[topic] = deleted.get(topic, 0) + store.collect_garbage(topic, None, conf.RETENTION, pace=pace)
        prune_stats(using=db)
    return deleted


def prune_stats(*, using: str | None = None) -> int:
    """Delete the per-hour counters older than ``SQLQUEUE["STATS_RETENTION"]`` and the history
    minutes older than ``SQLQUEUE["HISTORY_RETENTION"]``; return rows deleted."""
    conf = get_settings()
    store = QueueStore(using or conf.DATABASE)
    pruned = store.prune_topic_hours(conf.STATS_RETENTION)
    if conf.HISTORY_RETENTION > 0:
        pruned += store.prune_history(conf.HISTORY_RETENTION)
    return pruned
