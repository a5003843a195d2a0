"""Engine connections (django_sqlqueue/db/session.py): a frozen transaction's locks go.

A thread stands in for a worker frozen inside one of its fenced transactions: it
share-locks its lease row (``lock_held``, the fence of every delivery write) and then
does nothing. Another connection, as a thief of the expired lease would, updates that
row. The chaos suite (tests/chaos) does the same to real ``runconsumer`` processes with
SIGSTOP.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import pytest
from django.db import DatabaseError, connection, transaction

from django_sqlqueue.db.session import engine_connections, handler_section, handler_thread_connections
from django_sqlqueue.models import PartitionLease

from ..support.engine_helpers import by_vendor, db_now, kill_session, requires_vendor, session_id, store

pytestmark = [
    pytest.mark.django_db(transaction=True),
    requires_vendor("mysql", "postgresql"),
]

TOPIC = "es.topic"
MARK = dt.datetime(2001, 2, 3, 4, 5, 6, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _mariadb_or_postgresql() -> None:
    if connection.vendor == "mysql" and not connection.mysql_is_mariadb:
        pytest.skip("MySQL has no idle-in-transaction timeout (documented in engine_session.py)")


def expired_lease_of_w1() -> None:
    s = store()
    s.register_topic(TOPIC, 1)
    assert s.acquire_leases("g", TOPIC, [0], "w1", 30) == [0]
    # Expired a minute ago: a thief may take it.
    PartitionLease.objects.filter(topic=TOPIC).update(lease_renewed_at=db_now() - dt.timedelta(minutes=1))


def short_lock_wait() -> None:
    """Make this thread's lock waits fail after 8 s instead of the server's default (50 s)."""
    with connection.cursor() as cursor:
        cursor.execute(
            by_vendor(mysql="SET SESSION innodb_lock_wait_timeout = 8", postgresql="SET lock_timeout = '8s'")
        )


#: How the frozen holder's thread treats its connection: engine, ordinary, or a handler thread.
Guard = Callable[[str], AbstractContextManager[object]]


def engine(using: str) -> AbstractContextManager[object]:
    return engine_connections(using, 1)


def ordinary(using: str) -> AbstractContextManager[object]:
    return nullcontext()


def frozen_holder(guard: Guard, locked: threading.Event, resume: threading.Event, outcome: dict[str, object]) -> None:
    """w1 share-locks its lease row as every fenced write does, then freezes until ``resume``."""
    try:
        s = store()
        with guard(s.using), s.transaction() as cursor:
            outcome["held"] = s.lock_held(cursor, "g", TOPIC, "w1", [0])
            locked.set()
            resume.wait(30)
            cursor.execute("SELECT 1")
        outcome["committed"] = True
    except DatabaseError as exc:
        outcome["error"] = exc
    finally:
        locked.set()
        connection.close()


def assert_the_frozen_holders_lease_is_stolen(guard: Guard) -> None:
    expired_lease_of_w1()
    locked, resume, outcome = threading.Event(), threading.Event(), {}
    holder = threading.Thread(target=frozen_holder, args=(guard, locked, resume, outcome), daemon=True)
    holder.start()
    assert locked.wait(10)
    assert outcome.get("held") == {0}, outcome
    short_lock_wait()
    # The thief's UPDATE waits for w1's share lock; the server ends w1's session once its
    # transaction idled for 1 s, and the steal goes through (a lock-wait error otherwise).
    assert store().acquire_leases("g", TOPIC, [0], "w2", 30) == [0]
    resume.set()
    holder.join(30)
    # w1, resumed, finds its connection gone: its transaction was rolled back.
    assert "committed" not in outcome and isinstance(outcome.get("error"), DatabaseError), outcome
    assert PartitionLease.objects.get(topic=TOPIC).leased_by == "w2"


def test_a_frozen_engine_transaction_is_ended_so_its_expired_lease_can_be_stolen():
    assert_the_frozen_holders_lease_is_stolen(engine)


def test_other_connections_may_idle_in_a_transaction():
    """Handler threads are not engine connections: their transactions may idle."""
    expired_lease_of_w1()
    locked, resume, outcome = threading.Event(), threading.Event(), {}
    holder = threading.Thread(target=frozen_holder, args=(ordinary, locked, resume, outcome), daemon=True)
    holder.start()
    assert locked.wait(10)
    timer = threading.Timer(2.5, resume.set)
    timer.start()
    holder.join(30)
    assert outcome.get("committed") is True, outcome


def idle_timeout_setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            by_vendor(
                mysql="SELECT @@SESSION.idle_transaction_timeout",
                postgresql="SELECT current_setting('idle_in_transaction_session_timeout')",
            )
        )
        return str(cursor.fetchone()[0])


def test_the_setting_is_applied_to_the_open_connection_and_every_reconnect_inside_the_block_only():
    def run() -> list[str]:
        seen = [idle_timeout_setting()]  # before: the server's default
        with engine_connections(store().using, 2.5):  # rounded up to whole seconds
            seen.append(idle_timeout_setting())
            connection.close()  # a lost connection: the next statement reconnects
            seen.append(idle_timeout_setting())
        seen.append(idle_timeout_setting())  # after the block: the default again
        connection.close()
        seen.append(idle_timeout_setting())  # and on the thread's next connections
        return seen

    outcome: dict[str, list[str]] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("seen", run()), daemon=True)
    thread.start()
    thread.join(30)
    three = by_vendor(mysql="3", postgresql="3s")
    assert outcome["seen"] == ["0", three, three, "0", "0"]
    assert idle_timeout_setting() == "0"  # this thread's connection is not an engine connection


def test_a_connection_the_server_dropped_before_the_block_is_replaced_not_raised():
    """Issue 32 (tests/chaos/test_databases.py): a server restarted while a worker waited for its
    leases dropped its open connection; entering the block then raised 'Lost connection' and
    the worker died. Now the dead connection is closed and the next one configured as it opens."""

    def run() -> list[str]:
        doomed = session_id()  # this thread's open connection
        killer = threading.Thread(target=lambda: (kill_session(doomed), connection.close()), daemon=True)
        killer.start()
        killer.join(30)
        with engine_connections(store().using, 2.5):
            seen = [idle_timeout_setting()]  # a new connection, configured
        connection.close()
        return seen

    outcome: dict[str, list[str]] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("seen", run()), daemon=True)
    thread.start()
    thread.join(30)
    assert outcome["seen"] == [by_vendor(mysql="3", postgresql="3s")]


# -- threads that run handlers too (handler threads, an inline worker's poll loop) --------------


@contextmanager
def handler_thread_after_a_handler(using: str) -> Iterator[None]:
    """A handler thread whose handler ran first (and used the database: on MariaDB the session
    is back at the default) and which now writes its batch's outcomes."""
    with handler_thread_connections(using, 1):
        with handler_section():
            assert idle_timeout_setting() == "0"
        yield


def test_a_handler_threads_frozen_fenced_transaction_is_ended_so_its_expired_lease_can_be_stolen():
    """A batch's outcome writes (acks, nacks, dead letters) on a handler thread: the same bound."""
    assert_the_frozen_holders_lease_is_stolen(handler_thread_after_a_handler)


def test_a_handlers_own_transaction_on_such_a_thread_may_idle_and_the_next_fence_is_bounded_again():
    expired_lease_of_w1()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            s = store()
            with handler_thread_connections(s.using, 1):
                with s.transaction() as cursor:  # a batch's outcome writes: bounded
                    assert s.lock_held(cursor, "g", TOPIC, "w1", [0]) == {0}
                    outcome["fence"] = idle_timeout_setting()
                with handler_section(), transaction.atomic():
                    # The handler's own transaction idles past the bound and commits.
                    outcome["handler"] = idle_timeout_setting()
                    time.sleep(2.5)
                    PartitionLease.objects.filter(topic=TOPIC).update(leased_at=MARK)
                with s.transaction() as cursor:  # the next outcome writes: bounded again
                    assert s.lock_held(cursor, "g", TOPIC, "w1", [0]) == {0}
                    outcome["next fence"] = idle_timeout_setting()
            outcome["after"] = idle_timeout_setting()  # the thread's session: the default again
        except DatabaseError as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert "error" not in outcome, outcome
    one = by_vendor(mysql="1", postgresql="1s")
    assert outcome == {"fence": one, "handler": "0", "next fence": one, "after": "0"}
    assert PartitionLease.objects.get(topic=TOPIC).leased_at == MARK


def test_a_handler_that_does_not_use_the_database_costs_no_statement():
    """MariaDB keeps the session's bound across handlers that send nothing (the lazy reset)."""
    if connection.vendor != "mysql":
        pytest.skip("PostgreSQL bounds each fenced transaction in its fence statement instead")
    expired_lease_of_w1()
    seen: list[str] = []

    def run() -> None:
        s = store()
        try:
            with handler_thread_connections(s.using, 1):
                with s.transaction() as cursor:
                    s.lock_held(cursor, "g", TOPIC, "w1", [0])
                statements: list[str] = []
                with (
                    handler_section(),
                    connection.execute_wrapper(
                        lambda execute, sql, *args: statements.append(sql) or execute(sql, *args)
                    ),
                ):
                    pass  # a handler that does not touch the database
                seen.extend(statements)
                seen.append(idle_timeout_setting())
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert seen == ["1"]


def test_on_postgresql_the_fence_bounds_its_transaction_without_a_statement_of_its_own():
    if connection.vendor != "postgresql":
        pytest.skip("MariaDB's setting has no transaction scope: it is set on the session")
    expired_lease_of_w1()
    seen: dict[str, object] = {}

    def run() -> None:
        s = store()
        try:
            with handler_thread_connections(s.using, 1):
                statements: list[str] = []

                def record(execute, sql, *args):
                    statements.append(sql)
                    return execute(sql, *args)

                with connection.execute_wrapper(record), s.transaction() as cursor:
                    seen["held"] = s.lock_held(cursor, "g", TOPIC, "w1", [0])
                seen["statements"] = len(statements)
                seen["inside"] = "set_config" in statements[0]
            seen["after"] = idle_timeout_setting()  # SET LOCAL: gone with its transaction
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert seen == {"held": {0}, "statements": 1, "inside": True, "after": "0"}
