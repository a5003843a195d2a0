"""What the batch tests share: one partition leased, its messages delivered, a runner.

:func:`leased_batch` leases partition 0 to ``w1``, publishes messages to it, records their
delivery the way a poll does (``mark_delivered``) and builds a
:class:`~django_sqlqueue.worker.batch.runner.BatchRunner` to run them on the calling
thread. Everything is real: rows, leases, fences; no worker, no thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from django_sqlqueue.conf import QueueSettings
from django_sqlqueue.db.retry import Retrying
from django_sqlqueue.db.store import FetchedMessage
from django_sqlqueue.worker.batch.outcomes import BatchHooks, Stats
from django_sqlqueue.worker.batch.runner import BatchRunner
from django_sqlqueue.worker.subscription import Subscription
from tests.support.consumerapp.models import Handled
from tests.support.engine_helpers import fast_conf, fetch_fresh, leased, publish_to, spec, store


class Scene(NamedTuple):
    runner: BatchRunner
    sub: Subscription
    fetched: list[FetchedMessage]
    stats: Stats


def leased_batch(
    topic: str,
    handler: Callable[[Any], Any],
    n: int = 3,
    *,
    group: str = "g",
    stop: threading.Event | None = None,
    hooks: BatchHooks | None = None,
    conf: QueueSettings | None = None,
    metadata: dict[str, Any] | None = None,
    **options: Any,
) -> Scene:
    """Lease partition 0 of ``topic`` to w1, publish ``n`` messages, record their delivery;
    ``options`` go to the consumer spec (``max_attempts``, ``atomic``, ``timeout``...)."""
    conf = conf or fast_conf()
    sub = Subscription.create(spec(topic, group, handler, **options), "w1", conf)
    leased(group, topic, 0)
    s = store()
    publish_to(topic, 0, n, metadata=metadata or {})
    s.ensure_offsets(group, topic, [0])
    fetched = fetch_fresh(group, topic, 0)
    assert s.mark_delivered(group, topic, "w1", fetched, [], [], 30) == {0}
    sub.held = frozenset({0})
    stats = Stats()
    stop = stop or threading.Event()
    runner = BatchRunner(s, conf, stats=stats, stop_event=stop, db=Retrying("default", stop), hooks=hooks)
    return Scene(runner, sub, fetched, stats)


def effect(message: Any, worker: str = "t") -> Handled:
    """A handler's write: one ``Handled`` row per call (no unique key: twice shows as two rows)."""
    return Handled.objects.create(
        group=message.group,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        offset=message.offset,
        message_id=message.id,
        attempt=message.attempt,
        worker=worker,
    )


def effects(topic: str) -> list[int]:
    """The offsets whose handler's write is committed, once per write."""
    return sorted(Handled.objects.filter(topic=topic).values_list("offset", flat=True))
