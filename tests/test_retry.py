"""with_retries: real deadlocks, lock-wait timeouts and lost connections are retried;
anything else propagates at once."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, ProgrammingError, connection, transaction

from django_sqlqueue.models import Partition
from django_sqlqueue.retry import is_transient, with_retries

from .engine_helpers import Calls
from .factories import PartitionFactory

pytestmark = pytest.mark.django_db(transaction=True)


def lock_and_bump(key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT head_offset FROM queue_partitions WHERE topic = 'dl' AND partition_key = %s FOR UPDATE",
            [key],
        )
        cursor.execute(
            "UPDATE queue_partitions SET head_offset = head_offset + 1 WHERE topic = 'dl' AND partition_key = %s",
            [key],
        )


def crossing_transactions(spawn, *, retried: bool):
    """Two threads lock rows x and y in opposite orders: a real deadlock, one victim."""
    PartitionFactory(topic="dl", partition_key="x")
    PartitionFactory(topic="dl", partition_key="y")
    barrier = threading.Barrier(2, timeout=10)
    attempts = Calls()

    def run(name: str, first: str, second: str):
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

    a = spawn(lambda: run("a", "x", "y"), name="a")
    b = spawn(lambda: run("b", "y", "x"), name="b")
    return a.join_ok(), b.join_ok(), attempts.list()


def heads() -> dict[str, int]:
    return dict(Partition.objects.filter(topic="dl").values_list("partition_key", "head_offset"))


def test_control_crossing_transactions_deadlock(spawn):
    """Without with_retries, one of the two transactions is the deadlock victim."""
    results = crossing_transactions(spawn, retried=False)[:2]
    errors = [r for r in results if isinstance(r, OperationalError)]
    assert len(errors) == 1, results
    assert errors[0].args[0] == 1213
    assert is_transient(errors[0]) == (True, False)
    assert heads() == {"x": 1, "y": 1}  # the victim's first update was rolled back


def test_with_retries_runs_the_deadlock_victim_again(spawn):
    a, b, attempts = crossing_transactions(spawn, retried=True)
    assert (a, b) == ("a", "b")  # both succeeded
    assert len(attempts) == 3 and sorted(set(attempts)) == [
        "a",
        "b",
    ]  # exactly one ran twice
    assert heads() == {"x": 2, "y": 2}  # each transaction applied once, nothing twice


def test_lock_wait_timeout_is_retried_then_raised_after_the_last_attempt(spawn):
    PartitionFactory(topic="dl", partition_key="x")
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            lock_and_bump("x")
            locked.set()
            assert release.wait(20)

    h = spawn(holder, name="holder")
    assert locked.wait(10)
    calls = Calls()
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")

    def blocked() -> None:
        calls.add(1)
        with transaction.atomic():
            lock_and_bump("x")

    try:
        with pytest.raises(OperationalError) as info:
            with_retries(blocked, using="default", what="blocked", attempts=2)
    finally:
        release.set()
        h.join_ok()
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
    assert info.value.args[0] == 1205
    assert len(calls) == 2
    # Once the lock is free, the same operation goes through on the first try.
    assert with_retries(blocked, using="default", what="free") is None
    assert heads() == {"x": 2}


def test_lost_connection_is_reopened_and_retried(spawn):
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (conn_id,) = cursor.fetchone()

    def kill() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"KILL CONNECTION {int(conn_id)}")

    spawn(kill, name="killer").join_ok()
    calls = Calls()

    def query() -> int:
        calls.add(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            return cursor.fetchone()[0]

    new_id = with_retries(query, using="default", what="after kill")
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
    assert info.value.args[0] == 1064
    assert len(calls) == 1


def test_non_transient_operational_error_propagates_at_once():
    calls = Calls()

    def unknown_column() -> None:
        calls.add(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM queue_partitions")

    with pytest.raises(OperationalError) as info:
        with_retries(unknown_column, using="default", what="unknown column")
    assert info.value.args[0] == 1054
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
