"""The ``@consumer`` decorator, the registry of handlers, and the message they receive.

Handlers live in a ``consumers`` module of any installed app; :func:`load_consumers`
imports them all (``runconsumer`` calls it)::

    from django_sqlqueue import consumer, Retry, Reject

    @consumer("orders.created", group="billing", batch_size=10, visibility_timeout=30, max_attempts=5)
    def charge(message):
        ...

Returning normally acks the message; an exception nacks it with backoff; ``Retry``
nacks it with a chosen delay; ``Reject`` dead-letters it at once.

A handler may be ``async def``: the worker awaits it (see :mod:`django_sqlqueue.worker.batch.handlers`)
with the same outcomes. As in an async view, it must use the async ORM or
``sync_to_async``, and ``await message.aextend_visibility(s)``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.utils.module_loading import autodiscover_modules

from .conf import QueueSettings
from .db.conn import on_own_connection
from .exceptions import ConfigurationError, InvalidMessage
from .rules.atomic_modes import validate_atomic
from .rules.rates import Limits, parse_rate
from .rules.validation import validate_group, validate_topic

if TYPE_CHECKING:
    from .db.store import QueueStore, Settlement

logger = logging.getLogger(__name__)

Handler = Callable[["ReceivedMessage"], Any]


class _Default(enum.Enum):
    """The type of :data:`DEFAULT`."""

    DEFAULT = "default"

    def __repr__(self) -> str:
        return "DEFAULT"


#: ``timeout=DEFAULT``: the consumer's visibility timeout (``None`` means no timeout).
DEFAULT = _Default.DEFAULT


@dataclass(frozen=True)
class ConsumerSpec:
    """A registered handler and its per-consumer options (None = the SQLQUEUE default)."""

    topic: str
    group: str
    handler: Handler
    batch_size: int | None = None
    visibility_timeout: float | None = None
    max_attempts: int | None = None
    #: Seconds a handler may run without progress (``DEFAULT``: the visibility timeout;
    #: None: no limit). See :mod:`django_sqlqueue.worker.threads.watchdog`.
    timeout: float | _Default | None = DEFAULT
    #: Per-message timeout, overriding ``timeout`` when it returns a number (the tasks
    #: backend's per-task timeouts); called before the handler, must be cheap.
    timeout_for: Callable[[ReceivedMessage], float | None] | None = None
    #: Called by the watchdog when it gives up a timed-out handler, before the attempt's
    #: outcome is written: ``on_timeout(message_id, payload, attempt, error, final)``
    #: (the tasks backend records the failed attempt in the task's result).
    on_timeout: Callable[[str, Any, int, BaseException, bool], None] | None = None
    #: The handler's writes and its ack commit in one transaction: True (per message),
    #: "batch" (per fetched batch of a partition) or False. See :mod:`django_sqlqueue.worker.batch.atomic`.
    atomic: bool | str = False
    #: Atomic consumers: called on the handler's thread just before its transaction begins
    #: (autocommit: what it writes commits at once), with the message it will get.
    before_atomic: Callable[[ReceivedMessage], None] | None = None
    #: Atomic consumers: called after the handler's transaction rolled back because the
    #: handler raised, before the nack or dead letter is written:
    #: ``on_rollback(message, error, final)`` (the tasks backend records the failed attempt).
    on_rollback: Callable[[ReceivedMessage, BaseException, bool], None] | None = None
    #: A priority level of a task queue: (the queue, the level). The worker polls the levels
    #: of one queue highest first (``worker/bands.py``); None: not a level.
    priority_band: tuple[str, int] | None = None
    settlement: Settlement | None = None  #: Final outcomes recorded with the ack, once (``db/store/settle.py``).
    #: At most this many handler calls per period across all workers, e.g. "20/s" (``worker/limits.py``).
    rate_limit: str | None = None
    #: Per-message limits (the tasks' ``@rate_limit``, ``@concurrency_limit``); None: none, no cost.
    limits_for: Callable[[ReceivedMessage], Limits | None] | None = None

    def __post_init__(self) -> None:
        validate_atomic(self.atomic, self.name)
        if self.rate_limit is not None:
            parse_rate(self.rate_limit, where=f"consumer {self.name}")  # ConfigurationError naming the problem
        if self.atomic and inspect.iscoroutinefunction(self.handler):
            raise ConfigurationError(
                f"consumer {self.name}: an async def handler cannot be atomic (its ORM calls run on another "
                f"thread's connection, outside the transaction); use a sync handler with atomic={self.atomic!r}."
            )

    @property
    def name(self) -> str:
        return f"{self.group}:{self.topic}"

    def resolve(self, conf: QueueSettings) -> ConsumerOptions:
        """Return the effective options, filling defaults from the settings."""
        visibility = self.visibility_timeout or conf.VISIBILITY_TIMEOUT
        return ConsumerOptions(
            batch_size=self.batch_size or conf.BATCH_SIZE,
            visibility_timeout=visibility,
            max_attempts=self.max_attempts or conf.MAX_ATTEMPTS,
            timeout=visibility if self.timeout is DEFAULT else self.timeout,
        )


@dataclass(frozen=True)
class ConsumerOptions:
    batch_size: int
    visibility_timeout: float
    max_attempts: int
    #: Seconds a handler may run without progress before its partition is given up (None: no limit).
    timeout: float | None = None


class ConsumerRegistry:
    """Handlers by (group, topic): one handler per topic within a consumer group."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], ConsumerSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: ConsumerSpec) -> None:
        with self._lock:
            existing = self._specs.get((spec.group, spec.topic))
            if existing is not None and existing.handler is not spec.handler:
                raise ConfigurationError(
                    f"consumer group {spec.group!r} already has a handler for topic {spec.topic!r} "
                    f"({_qualname(existing.handler)}); cannot also register {_qualname(spec.handler)}."
                )
            self._specs[(spec.group, spec.topic)] = spec

    def unregister(self, group: str, topic: str) -> None:
        with self._lock:
            self._specs.pop((group, topic), None)

    def all(self) -> list[ConsumerSpec]:
        with self._lock:
            return sorted(self._specs.values(), key=lambda s: (s.group, s.topic))

    def select(self, groups: list[str] | None = None, topics: list[str] | None = None) -> list[ConsumerSpec]:
        """Return the specs matching any of ``groups`` and any of ``topics`` (None = all)."""
        return [s for s in self.all() if (not groups or s.group in groups) and (not topics or s.topic in topics)]


registry = ConsumerRegistry()


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _positive(value: Any, what: str, kind: type) -> None:
    if value is None:
        return
    ok = isinstance(value, kind) if kind is int else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive {'integer' if kind is int else 'number'}, got {value!r}.")


def consumer(
    topic: str,
    *,
    group: str,
    batch_size: int | None = None,
    visibility_timeout: float | None = None,
    max_attempts: int | None = None,
    timeout: float | _Default | None = DEFAULT,
    atomic: bool | str = False,
    rate_limit: str | None = None,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``topic`` in consumer ``group``.

    Options left as None take ``SQLQUEUE``'s ``BATCH_SIZE``, ``VISIBILITY_TIMEOUT`` and
    ``MAX_ATTEMPTS``. ``batch_size=1`` serializes the partition strictly: one message in
    flight at a time.

    ``timeout``: seconds one handler call may run without progress (each
    ``message.extend_visibility()`` is progress and restarts it); by default the
    consumer's visibility timeout, ``None`` for no limit. A sync handler that overruns
    it is abandoned: the message is nacked with a
    :class:`~django_sqlqueue.exceptions.HandlerTimeout` (dead-lettered on its last
    attempt), its partition is given up and the worker goes on with a new handler
    thread; an ``async def`` handler is cancelled. See :mod:`django_sqlqueue.worker.threads.watchdog`.

    ``atomic=True``: the handler runs in ``transaction.atomic()`` on the queue's database
    and its ack commits in that same transaction, fenced by the partition's lease: its
    database writes and ``publish()`` calls happen exactly once. ``atomic="batch"``: one
    transaction (one commit) per fetched batch of a partition; a failing message rolls
    the batch back and its messages are retried one per transaction. Writes on other
    database aliases, emails and HTTP calls are outside the guarantee. Sync handlers
    only. See :mod:`django_sqlqueue.worker.batch.atomic` and ``docs/delivery-semantics.md``.

    ``rate_limit="20/s"`` (per ``s``, ``m`` or ``h``): at most that many handler calls across
    all workers; a message over it waits, not counted as an attempt (``worker/limits.py``).
    """
    try:
        validate_topic(topic)
        validate_group(group)
    except InvalidMessage as exc:
        raise ConfigurationError(f"@consumer: {exc}") from exc
    _positive(batch_size, "batch_size", int)
    _positive(visibility_timeout, "visibility_timeout", float)
    _positive(max_attempts, "max_attempts", int)
    validate_atomic(atomic, f"{group}:{topic}")
    if timeout is not DEFAULT:
        _positive(timeout, "timeout", float)

    def decorator(fn: Handler) -> Handler:
        if not callable(fn):
            raise ConfigurationError(f"@consumer must decorate a callable, not {fn!r}.")
        registry.register(
            ConsumerSpec(
                topic,
                group,
                fn,
                batch_size,
                visibility_timeout,
                max_attempts,
                timeout,
                atomic=atomic,
                rate_limit=rate_limit,
            )
        )
        return fn

    return decorator


def load_consumers() -> list[ConsumerSpec]:
    """Import the ``consumers`` module of every installed app and return all specs."""
    autodiscover_modules("consumers")
    return registry.all()


#: Callables returning consumer specs not in the registry (the tasks backend's queues).
_spec_sources: list[Callable[[], list[ConsumerSpec]]] = []


def register_spec_source(source: Callable[[], list[ConsumerSpec]]) -> None:
    """Have :func:`known_consumers` include ``source()``'s specs (once, however often registered)."""
    if source not in _spec_sources:
        _spec_sources.append(source)


def known_consumers() -> list[ConsumerSpec]:
    """Every consumer this project declares: the ``@consumer`` handlers of every app's
    ``consumers`` module and the registered sources' (task queues), by group and topic.

    What operators' views (console, ``queue_status``) show as a consumer's options: the
    code of *this* process, which is the workers' code when they run the same project.
    """
    try:
        declared = load_consumers()
    except Exception:  # an app's consumers module fails to import: a view must not fail on it
        logger.exception("could not import the apps' consumers modules")
        declared = registry.all()
    specs = {(s.group, s.topic): s for s in declared}
    for s in source_specs():
        specs.setdefault((s.group, s.topic), s)
    return [specs[k] for k in sorted(specs)]


def source_specs() -> list[ConsumerSpec]:
    """The registered sources' consumers: the task queues, whose topics the package publishes to."""
    found: list[ConsumerSpec] = []
    for source in _spec_sources:
        try:
            found += source()
        except Exception:  # a view must not fail on a broken integration
            logger.exception("could not list consumers from %r", source)
    return found


def check_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``sqlqueue.E015``: ``@consumer`` is used without the app. Registered here: ``checks.py``
    is imported by the app's ``ready()``, which never runs then (``publish()`` raises ``NotInstalled``)."""
    if apps.is_installed("django_sqlqueue"):
        return []
    msg = "django_sqlqueue is used (@consumer) but is not in INSTALLED_APPS: no worker can run its consumers."
    hint = "Add 'django_sqlqueue' to INSTALLED_APPS, then run `manage.py migrate django_sqlqueue`."
    return [checks.Error(msg, hint=hint, id="sqlqueue.E015")]


checks.register(check_installed, "sqlqueue")


@dataclass
class ReceivedMessage:
    """What a handler receives: one delivery of one message to one consumer group."""

    topic: str
    #: The key the message was published with ("" when none).
    key: str
    #: The partition it was hashed to; messages of one partition arrive in offset order.
    partition: int
    #: Its position in the partition, assigned by the sequencer after it committed.
    offset: int
    id: str
    payload: Any
    metadata: dict[str, Any]
    #: 1 on the first delivery, 2 on the first retry, ...
    attempt: int
    created_at: dt.datetime
    deliver_at: dt.datetime
    group: str
    _store: QueueStore | None = field(default=None, repr=False, compare=False)
    #: The subscriber (worker) that holds the partition's lease and delivered the message.
    _subscriber: str | None = field(default=None, repr=False, compare=False)
    #: Called after a successful ``extend_visibility``: progress restarts the handler's timeout.
    _on_progress: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    #: Delivered to an atomic consumer: the handler runs in a transaction on this thread's connection.
    _atomic: bool = field(default=False, repr=False, compare=False)

    def extend_visibility(self, seconds: float) -> bool:
        """Keep the message invisible to redelivery for ``seconds`` more, from now.

        Call it periodically during long work so the visibility timeout does not expire
        and hand the message to another delivery. The retry count is not changed. A
        successful call is also progress: it restarts the consumer's ``timeout``. Return
        False (nothing written) when this worker no longer holds the message's partition:
        its delivery state belongs to the new holder then, like every other write.
        """
        if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0):
            raise ValueError(f"extend_visibility() takes a positive number of seconds, got {seconds!r}.")
        if self._store is None:
            raise RuntimeError("this message was not delivered by a worker")
        if _in_event_loop():
            raise RuntimeError(
                "extend_visibility() cannot run inside an async handler (the database call would block "
                "the event loop); use `await message.aextend_visibility(seconds)`."
            )
        return self._extend_visibility_sync(seconds)

    async def aextend_visibility(self, seconds: float) -> bool:
        """Async variant of :meth:`extend_visibility`, for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        # Validate here, so a bad argument raises before any thread hop.
        if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0):
            raise ValueError(f"aextend_visibility() takes a positive number of seconds, got {seconds!r}.")
        return await sync_to_async(self._extend_visibility_sync, thread_sensitive=True)(seconds)

    def _extend_visibility_sync(self, seconds: float) -> bool:
        if self._store is None or self._subscriber is None:
            raise RuntimeError("this message was not delivered by a worker")
        store, subscriber = self._store, self._subscriber

        def extend() -> bool:
            return store.extend_visibility(self.group, self.topic, subscriber, self.partition, self.offset, seconds)

        if self._atomic and store.dialect.concurrent_writers:
            # Not on this thread's connection: it is in the atomic handler's transaction,
            # which would keep the write -- and the share lock on the lease row that fences
            # it, blocking the lease keeper's renewals -- until the handler commits.
            # (Without concurrent writers -- SQLite -- the handler's transaction holds the
            # database write lock anyway; a second connection would wait for it.)
            extended = on_own_connection(extend)
        else:
            extended = extend()
        if extended and self._on_progress is not None:
            self._on_progress()
        if not extended:
            logger.warning(
                "visibility not extended: the partition's lease was lost group=%s topic=%s partition=%d offset=%d",
                self.group,
                self.topic,
                self.partition,
                self.offset,
            )
        return extended


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
