"""with_retries: real deadlocks, lock-wait timeouts and lost connections are retried;
anything else propagates at once."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, ProgrammingError, connection, connections, transaction

from django_sqlqueue.db.retry import is_transient, with_retries
from django_sqlqueue.models import Partition

from ..support.engine_helpers import Calls, by_vendor, error_code, kill_session, requires_vendor, session_id
from ..support.factories import PartitionFactory
from ..support.ports import free_port

pytestmark = [pytest.mark.django_db(transaction=True), requires_vendor("mysql", "postgresql")]

#: The server's codes of the errors forced below (MySQL error numbers, PostgreSQL SQLSTATEs).
DEADLOCK = {"mysql": 1213, "postgresql": "40P01"}  # deadlock detected
LOCK_WAIT_TIMEOUT = {"mysql": 1205, "postgresql": "55P03"}  # lock_not_available
SYNTAX_ERROR = {"mysql": 1064, "postgresql": "42601"}


#: Two head rows of topic ``dl``, locked in opposite orders below.
X, Y = 0, 1


def lock_and_bump(partition: int) -> None:
    p = connection.ops.quote_name("partition")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT head_offset FROM queue_partitions WHERE topic = 'dl' AND {p} = %s FOR UPDATE",
            [partition],
        )
        cursor.execute(
            f"UPDATE queue_partitions SET head_offset = head_offset + 1 WHERE topic = 'dl' AND {p} = %s",
            [partition],
        )


def crossing_transactions(spawn, *, retried: bool):
    """Two threads lock rows x and y in opposite orders: a real deadlock, one victim."""
    PartitionFactory(topic="dl", partition=X)
    PartitionFactory(topic="dl", partition=Y)
    barrier = threading.Barrier(2, timeout=10)
    attempts = Calls()

    def run(name: str, first: int, second: int):
        def once() -> str:
            attempts.add(name)
            with transaction.atomic():
                lock_and_bump(first)
                if attempts.list().count(name) == 1:
                    barrier.wait()  # both hold their first row: now each asks for the other's
                lock_and_bump(second)
            return name

        if retried:
            return with_retries(once, using="default", what=f"transaction {name}")
        try:
            return once()
        except OperationalError as exc:
            return exc

    a = spawn(lambda: run("a", X, Y), name="a")
    b = spawn(lambda: run("b", Y, X), name="b")
    return a.join_ok(), b.join_ok(), attempts.list()


def heads() -> dict[int, int]:
    return dict(Partition.objects.filter(topic="dl").values_list("partition", "head_offset"))


def test_control_crossing_transactions_deadlock(spawn):
    """Without with_retries, one of the two transactions is the deadlock victim."""
    results = crossing_transactions(spawn, retried=False)[:2]
    errors = [r for r in results if isinstance(r, OperationalError)]
    assert len(errors) == 1, results
    assert error_code(errors[0]) == by_vendor(**DEADLOCK)
    assert is_transient(errors[0]) == (True, False)
    assert heads() == {X: 1, Y: 1}  # the victim's first update was rolled back


def test_with_retries_runs_the_deadlock_victim_again(spawn):
    a, b, attempts = crossing_transactions(spawn, retried=True)
    assert (a, b) == ("a", "b")  # both succeeded
    assert len(attempts) == 3 and sorted(set(attempts)) == [
        "a",
        "b",
    ]  # exactly one ran twice
    assert heads() == {X: 2, Y: 2}  # each transaction applied once, nothing twice


def test_lock_wait_timeout_is_retried_then_raised_after_the_last_attempt(spawn):
    PartitionFactory(topic="dl", partition=X)
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            lock_and_bump(X)
            locked.set()
            assert release.wait(20)

    h = spawn(holder, name="holder")
    assert locked.wait(10)
    calls = Calls()
    with connection.cursor() as cursor:
        # A one-second lock wait on this session (PostgreSQL waits forever by default).
        cursor.execute(
            by_vendor(mysql="SET SESSION innodb_lock_wait_timeout = 1", postgresql="SET lock_timeout = '1s'")
        )

    def blocked() -> None:
        calls.add(1)
        with transaction.atomic():
            lock_and_bump(X)

    try:
        with pytest.raises(OperationalError) as info:
            with_retries(blocked, using="default", what="blocked", attempts=2)
    finally:
        release.set()
        h.join_ok()
        with connection.cursor() as cursor:
            cursor.execute(
                by_vendor(mysql="SET SESSION innodb_lock_wait_timeout = DEFAULT", postgresql="RESET lock_timeout")
            )
    assert error_code(info.value) == by_vendor(**LOCK_WAIT_TIMEOUT)
    assert len(calls) == 2, f"the lock-wait timeout was not retried: {info.value}"
    # Once the lock is free, the same operation goes through on the first try.
    assert with_retries(blocked, using="default", what="free") is None
    assert heads() == {X: 2}


def test_lost_connection_is_reopened_and_retried(spawn):
    conn_id = session_id()
    spawn(lambda: kill_session(conn_id), name="killer").join_ok()
    calls = Calls()

    def query() -> int:
        calls.add(1)
        return session_id()

    try:
        new_id = with_retries(query, using="default", what="after kill")
    finally:
        if connection.connection is not None and not connection.is_usable():
            connection.close()  # whatever happened above, the next test gets a live connection
    assert len(calls) == 2
    assert new_id != conn_id


def test_syntax_error_propagates_at_once():
    calls = Calls()

    def broken() -> None:
        calls.add(1)
        with connection.cursor() as cursor:
            cursor.execute("SELEC 1")

    with pytest.raises(ProgrammingError) as info:
        with_retries(broken, using="default", what="broken")
    assert error_code(info.value) == by_vendor(**SYNTAX_ERROR)
    assert len(calls) == 1


def test_non_transient_operational_error_propagates_at_once():
    """A statement the server will reject every time, raised as an OperationalError: an
    unknown column on MySQL (1054); on PostgreSQL, where an unknown column is a
    ProgrammingError, a program limit (54000, more array dimensions than allowed)."""
    calls = Calls()
    statement, code = by_vendor(
        mysql=("SELECT no_such_column FROM queue_partitions", 1054),
        postgresql=("SELECT array_fill(0, ARRAY[1, 1, 1, 1, 1, 1, 1])", "54000"),
    )

    def rejected() -> None:
        calls.add(1)
        with connection.cursor() as cursor:
            cursor.execute(statement)

    with pytest.raises(OperationalError) as info:
        with_retries(rejected, using="default", what="rejected statement")
    assert error_code(info.value) == code
    assert is_transient(info.value) == (False, False)
    assert len(calls) == 1


def test_other_exceptions_propagate_at_once():
    calls = Calls()

    def fails() -> None:
        calls.add(1)
        raise KeyError("not a database error")

    with pytest.raises(KeyError):
        with_retries(fails, using="default", what="python error")
    assert len(calls) == 1


@requires_vendor("mysql")
def test_a_stop_cuts_the_pauses_between_lost_connection_retries(spawn):
    """During an outage a stopping worker must not sit out the retry pauses (~1.5 s for 5 attempts)."""
    import time

    closed_port = free_port()
    wrapper = type(connections["default"])({**connection.settings_dict, "PORT": str(closed_port)}, alias="down")
    calls = Calls()

    def connect() -> None:
        calls.add(1)
        wrapper.ensure_connection()  # refused: MySQL error 2002/2003, a lost connection

    stop = threading.Event()
    started = time.monotonic()
    waiter = spawn(lambda: with_retries(connect, using="default", what="connect", stop_event=stop), name="retrying")
    time.sleep(0.2)  # in the first pauses
    stop.set()
    with pytest.raises(OperationalError):
        waiter.join_ok()
    assert len(calls) == 5  # every attempt made, the ones after the stop without pausing
    assert time.monotonic() - started < 1.0
