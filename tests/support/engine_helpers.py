"""Shared helpers of the consumer-engine tests: fast settings, an in-process worker on a
thread, waiting on database state, and short readers of the queue tables.

Everything here reads or writes real rows; times that the engine compares come from the
database clock (``QueueStore.now()``), never from Python's.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections

from django_sqlqueue import publish_many
from django_sqlqueue.conf import DEFAULT_PARTITIONS, QueueSettings
from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.sequencer import sequence as run_sequencer
from django_sqlqueue.db.store import FetchPlan, QueueStore
from django_sqlqueue.models import ConsumerOffset, DeliveryState, Message, Partition
from django_sqlqueue.publisher import PublishedMessage
from django_sqlqueue.rules.partitioning import partition_for
from django_sqlqueue.worker.loop import Worker

IN_FLIGHT = DeliveryState.Status.IN_FLIGHT
RETRY = DeliveryState.Status.RETRY
SCHEDULED = DeliveryState.Status.SCHEDULED

#: Settings that make a worker react within tens of milliseconds.
FAST = {
    "LEASE_RENEW_INTERVAL": 0.2,
    "LEASE_DURATION": 2.0,
    "POLL_INTERVAL": 0.01,
    "POLL_INTERVAL_MAX": 0.05,
    "BACKOFF_MIN": 0.05,
    "BACKOFF_MAX": 0.2,
}


def fast_conf(**overrides: Any) -> QueueSettings:
    return QueueSettings(**{**FAST, **overrides})


def store() -> QueueStore:
    return QueueStore("default")


def db_now():
    """The database's current time (the clock the engine compares with)."""
    return store().now()


def spec(topic: str, group: str, handler: Callable[..., Any], **options: Any) -> ConsumerSpec:
    return ConsumerSpec(topic=topic, group=group, handler=handler, **options)


# -- one vendor's behaviour ---------------------------------------------------------------


def requires_vendor(*vendors: str) -> pytest.MarkDecorator:
    """Skip a test unless the database is one of ``vendors`` (``connection.vendor``).

    For tests that force a server-side behaviour -- a lock-wait timeout, a killed
    session, a row-lock wait observed from outside -- through statements only some
    vendors have (see ``session_id``, ``lock_waiting``, ``kill_session`` and
    ``error_code`` below, written for MySQL/MariaDB and PostgreSQL). Another vendor
    (SQLite: one writer, no server sessions to kill or watch, no lock-wait timeout) has
    no equivalent to force, so such a test is skipped there instead of being weakened
    into one that proves less on every database.
    """
    return pytest.mark.skipif(
        connection.vendor not in vendors,
        reason=f"needs {' or '.join(vendors)}, not {connection.vendor}",
    )


def not_on_sqlite(reason: str) -> pytest.MarkDecorator:
    """Skip a test on SQLite, saying why its claim cannot apply there.

    SQLite has one writer at a time (the database write lock, taken at BEGIN with
    ``transaction_mode`` IMMEDIATE): a claim about concurrent writers -- one partition's
    publishers queue while others' proceed, an uncoordinated insert is overtaken -- has
    nothing to prove on it.
    """
    return pytest.mark.skipif(connection.vendor == "sqlite", reason=f"not applicable to SQLite: {reason}")


def by_vendor(**values: Any) -> Any:
    """The value for this connection's vendor: ``by_vendor(mysql=1213, postgresql="40P01")``."""
    return values[connection.vendor]


def error_code(exc: BaseException) -> int | str | None:
    """The server's code of a database error Django raised: MySQL's error number,
    PostgreSQL's SQLSTATE (Django re-raises the driver's exception ``from`` it)."""
    if connection.vendor == "postgresql":
        return getattr(exc.__cause__, "sqlstate", None)
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else None


def session_id() -> int:
    """The server's id of this thread's connection (MySQL thread id, PostgreSQL backend pid)."""
    with connection.cursor() as cursor:
        cursor.execute(by_vendor(mysql="SELECT CONNECTION_ID()", postgresql="SELECT pg_backend_pid()"))
        return cursor.fetchone()[0]


def lock_waiting(session: int) -> bool:
    """Whether the session ``session`` (a ``session_id()``) is waiting for a lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            by_vendor(
                mysql="SELECT COUNT(*) FROM information_schema.innodb_trx "
                "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
                postgresql="SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            ),
            [session],
        )
        return cursor.fetchone()[0] > 0


def kill_session(session: int) -> None:
    """Terminate the server session ``session`` from this thread's connection (another
    one): its client finds its connection lost on its next statement."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # With a timeout, pg_terminate_backend waits until the backend has exited.
            cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [session])
            assert cursor.fetchone()[0], f"backend {session} did not exit"
        else:
            cursor.execute(f"KILL CONNECTION {int(session)}")


# -- waiting and recording -------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` (which may read the database) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


class Calls:
    """A thread-safe list of what handlers saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)

    def list(self) -> list[Any]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class _ErrorLog(logging.Handler):
    """Collects ERROR records of django_sqlqueue (a failed poll is logged, not raised)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def running(
    specs: list[ConsumerSpec],
    *,
    name: str = "t1",
    conf: QueueSettings | None = None,
    allow_errors: bool = False,
    concurrency: int = 1,
) -> Iterator[Worker]:
    """Run ``Worker(specs).run()`` on a thread for the duration of the block.

    On exit the worker is stopped and joined; an exception of ``run()`` or an ERROR logged
    by the engine (a failed poll or lease round) fails the test.
    """
    worker = Worker(specs, name=name, conf=conf or fast_conf(), concurrency=concurrency)
    errors: list[BaseException] = []
    log = _ErrorLog()
    logger = logging.getLogger("django_sqlqueue")
    logger.addHandler(log)

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name=f"worker-{name}", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(15)
        logger.removeHandler(log)
        assert not thread.is_alive(), f"worker {name} did not stop within 15s"
    if errors:
        raise errors[0]
    if not allow_errors:
        assert not log.records, "engine logged errors: " + "; ".join(
            f"{r.getMessage()} {r.exc_text or ''}" for r in log.records
        )


# -- partitions and keys ---------------------------------------------------------------


@functools.cache
def key_for_partition(partition: int, partitions: int = DEFAULT_PARTITIONS, prefix: str = "k") -> str:
    """The first key ``<prefix><n>`` that hashes to ``partition`` of a topic of ``partitions``."""
    assert 0 <= partition < partitions
    for n in itertools.count():
        key = f"{prefix}{n}"
        if partition_for(key, partitions) == partition:
            return key
    raise AssertionError("unreachable")


def publish_to(
    topic: str,
    partition: int,
    n: int = 1,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    payload: Callable[[int], Any] | None = None,
    seq: bool = True,
    **extra: Any,
) -> list[PublishedMessage]:
    """Publish ``n`` messages to ``partition`` (through a key hashing to it); sequence them.

    ``payload(i)`` makes the i-th payload (1-based; default ``{"p": partition, "i": i}``);
    ``extra`` goes into every item (``id`` must then be a callable of i). With ``seq`` the
    topic is sequenced afterwards, so the messages have their offsets.
    """
    key = key_for_partition(partition, partitions)
    items = []
    for i in range(1, n + 1):
        item: dict[str, Any] = {"payload": payload(i) if payload else {"p": partition, "i": i}, "key": key}
        for name, value in extra.items():
            item[name] = value(i) if callable(value) else value
        items.append(item)
    published = publish_many(topic, items)
    assert {m.partition for m in published} == {partition}
    if seq:
        sequence(topic)
    return published


def sequence(topic: str) -> dict[int, int]:
    """Number the topic's committed messages (what a worker's poll does)."""
    return run_sequencer(topic)


def offset_of(topic: str, message_id: str) -> int | None:
    """The offset the sequencer gave the message ``message_id`` (None: not sequenced yet)."""
    return Message.objects.get(topic=topic, id=message_id).offset


def leased(group: str, topic: str, partition: int, name: str = "w1", duration: float = 30) -> None:
    """Make ``name`` hold the lease of ``partition`` (takes a missing or expired one)."""
    assert store().acquire_leases(group, topic, [partition], name, duration) == [partition]


# -- reading the tables ------------------------------------------------------------------


def watermark(group: str, topic: str, partition: int = 0) -> int | None:
    row = ConsumerOffset.objects.filter(consumer_group=group, topic=topic, partition=partition).first()
    return None if row is None else row.offset_acked


def head(topic: str, partition: int = 0) -> int:
    return Partition.objects.get(topic=topic, partition=partition).head_offset


def heads(topic: str) -> dict[int, int]:
    """Head offsets of the topic's partitions that have messages."""
    rows = Partition.objects.filter(topic=topic, head_offset__gt=0).values_list("partition", "head_offset")
    return dict(rows)


def caught_up(group: str, topic: str, partitions: list[int] | None = None) -> bool:
    """Every message of ``topic`` is sequenced and ``group``'s watermarks are at the heads
    (of ``partitions``, or of every partition that has messages)."""
    if Message.objects.filter(topic=topic, offset__isnull=True).exists():
        return False
    current = heads(topic)
    if partitions is None:
        partitions = list(current)
    return all(watermark(group, topic, p) == current.get(p) for p in partitions)


def delivery_rows(group: str, topic: str, partition: int | None = None) -> list[DeliveryState]:
    rows = DeliveryState.objects.filter(consumer_group=group, topic=topic)
    if partition is not None:
        rows = rows.filter(partition=partition)
    return list(rows.order_by("partition", "message_offset"))


def row(group: str, topic: str, partition: int, offset: int) -> DeliveryState:
    return DeliveryState.objects.get(consumer_group=group, topic=topic, partition=partition, message_offset=offset)


def dead_letters(topic: str) -> list[Message]:
    """Messages of a dead-letter topic in the order they were written (not sequenced yet)."""
    return list(Message.objects.filter(topic=topic).order_by("seq"))


def execute(sql: str, params: list[Any] | tuple[Any, ...] = ()) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def qn(column: str) -> str:
    """A column name quoted for this connection (``partition``, ``offset``, ``key`` are reserved)."""
    return connection.ops.quote_name(column)


def now_minus(seconds: float) -> tuple[str, list[Any]]:
    """SQL (and its parameter) for the database clock's now minus ``seconds``, in this
    connection's dialect (for ageing rows: data, not the clock)."""
    return get_dialect(connection).now_minus(seconds)


def age_lease(group: str, topic: str, partition: int, seconds: float) -> None:
    """Make a lease look last renewed ``seconds`` ago (data, not the clock)."""
    ago, ago_params = now_minus(seconds)
    assert (
        execute(
            f"UPDATE queue_partition_leases SET lease_renewed_at = {ago} "
            f"WHERE consumer_group = %s AND topic = %s AND {qn('partition')} = %s",
            [*ago_params, group, topic, partition],
        )
        == 1
    )


def age_messages(topic: str, partition: int, offsets: list[int], seconds: float) -> None:
    """Make messages look published ``seconds`` ago (for retention)."""
    ago, ago_params = now_minus(seconds)
    assert execute(
        f"UPDATE queue_messages SET published_at = {ago} "
        f"WHERE topic = %s AND {qn('partition')} = %s AND {qn('offset')} IN ({', '.join(['%s'] * len(offsets))})",
        [*ago_params, topic, partition, *offsets],
    ) == len(offsets)


def fetch_fresh(group: str, topic: str, partition: int, after: int = 0, limit: int = 100):
    """Fetch never-delivered messages of one partition above ``after``."""
    return store().fetch(group, topic, [FetchPlan(partition, after, False)], limit)


def fetch_due(group: str, topic: str, partition: int, limit: int = 100):
    return store().fetch(group, topic, [FetchPlan(partition, None, True)], limit)
