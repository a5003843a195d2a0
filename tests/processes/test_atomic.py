"""Atomic consumers in real ``runconsumer`` processes (django_sqlqueue/worker/batch/atomic.py): kill -9.

The handler (``tests/support/consumerapp/consumers.py``, group ``atomic``) records a ``Handled`` row
first, inside its transaction. A worker killed mid-handler leaves no row of that attempt: the
database rolls its transaction back when the connection drops. The other worker redelivers
once the lease and the visibility timeout have expired, and the message's effect exists once.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqlqueue import publish
from tests.support.consumerapp.models import Handled
from tests.support.engine_helpers import caught_up, key_for_partition, not_on_sqlite
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOPIC = "proc.atomic"
GROUP = "atomic"
ENV = {"SQLQUEUE_TEST_ATOMIC": "1"}


def uncommitted_write() -> bool:
    """Some session holds an open transaction that has written (the atomic handler's)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                "AND datname = current_database()"
            )
        else:
            # This database's sessions only: CI runs the chaos suite beside this one, on the
            # same server (its own database).
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_rows_modified > 0 AND "
                "trx_mysql_thread_id IN (SELECT id FROM information_schema.processlist WHERE db = DATABASE())"
            )
        return cursor.fetchone()[0] > 0


@not_on_sqlite("the killed worker's open transaction would hold the database write lock")
def test_kill9_mid_atomic_handler_leaves_no_effect_and_the_redelivery_applies_it_once(runconsumer):
    a = runconsumer("a", "--group", GROUP, "--topic", TOPIC, env=ENV)
    first = publish(TOPIC, {}, key=key_for_partition(0))
    wait_until(lambda: caught_up(GROUP, TOPIC), 20, "a consumed the first message")
    victim = publish(TOPIC, {"sleep_first": 60}, key=key_for_partition(0))
    # a is in the handler, its Handled row written but not committed (invisible here).
    wait_until(uncommitted_write, 10, "a's handler inside its transaction, having written")
    assert not Handled.objects.filter(message_id=victim.id).exists()
    a.kill9()
    b = runconsumer("b", "--group", GROUP, "--topic", TOPIC, env=ENV)
    wait_until(lambda: caught_up(GROUP, TOPIC), 40, "b redelivered and acked the victim")
    rows = list(Handled.objects.filter(message_id=victim.id).values_list("worker", "attempt"))
    assert rows == [("b", 2)]
    assert Handled.objects.filter(message_id=first.id).count() == 1
    assert not b.log().count("Traceback"), b.log()
