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
from contextlib import nullcontext

import pytest
from django.db import DatabaseError, connection

from django_sqlqueue.db.session import engine_connections
from django_sqlqueue.models import PartitionLease

from ..support.engine_helpers import by_vendor, db_now, requires_vendor, store

pytestmark = [
    pytest.mark.django_db(transaction=True),
    requires_vendor("mysql", "postgresql"),
]

TOPIC = "es.topic"


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


def frozen_holder(engine: bool, locked: threading.Event, resume: threading.Event, outcome: dict[str, object]) -> None:
    """w1 share-locks its lease row as every fenced write does, then freezes until ``resume``."""
    try:
        s = store()
        with engine_connections(s.using, 1) if engine else nullcontext(), s.transaction() as cursor:
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


def test_a_frozen_engine_transaction_is_ended_so_its_expired_lease_can_be_stolen():
    expired_lease_of_w1()
    locked, resume, outcome = threading.Event(), threading.Event(), {}
    holder = threading.Thread(target=frozen_holder, args=(True, locked, resume, outcome), daemon=True)
    holder.start()
    assert locked.wait(10)
    assert outcome["held"] == {0}
    short_lock_wait()
    # The thief's UPDATE waits for w1's share lock; the server ends w1's session once its
    # transaction idled for 1 s, and the steal goes through (a lock-wait error otherwise).
    assert store().acquire_leases("g", TOPIC, [0], "w2", 30) == [0]
    resume.set()
    holder.join(30)
    # w1, resumed, finds its connection gone: its transaction was rolled back.
    assert "committed" not in outcome and isinstance(outcome.get("error"), DatabaseError), outcome
    assert PartitionLease.objects.get(topic=TOPIC).leased_by == "w2"


def test_other_connections_may_idle_in_a_transaction():
    """Handler threads are not engine connections: their transactions may idle."""
    expired_lease_of_w1()
    locked, resume, outcome = threading.Event(), threading.Event(), {}
    holder = threading.Thread(target=frozen_holder, args=(False, locked, resume, outcome), daemon=True)
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
