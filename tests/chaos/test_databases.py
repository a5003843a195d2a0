"""Issue 32: a runconsumer serving two database *servers*, killed with ``kill -9`` and replaced
while the second server restarts; nothing is lost in either.

``first.events`` lives in the suite's database (the shared server), ``second.events`` on a
MariaDB server this test starts (tests/support/dbservers.py), the alias ``second`` of the
workers pointing at it (``SQLQUEUE_TEST_SECOND_URL``: tests/support/process_settings_databases.py).
The second server's database is migrated with ``manage.py migrate --database second``, as
docs/databases.md says; its rows are read with plain SQL (the test process's own ``second``
alias is the shared server's).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from django_sqlqueue.models import ConsumerOffset, Message, Partition
from tests.processes.test_databases import SETTINGS, handled_ids, order_violations, publish
from tests.support.consumerapp.models import Handled
from tests.support.dbservers import MariaDBServer, missing
from tests.support.processes import ROOT, database_url, wait_until
from tests.support.secondapp import FIRST, GROUP, SECOND

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

COUNT = 60


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py`` with the two-database settings; its output (fails the test on an error)."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": database_url(), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (
        f"manage.py {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    return result.stdout


def second_caught_up(server: MariaDBServer) -> bool:
    """Every message of SECOND on the second server is sequenced and acked by the group."""
    unsequenced = server.execute(
        "SELECT COUNT(*) FROM queue_messages WHERE topic = %s AND `offset` IS NULL", (SECOND,), database="second"
    )[0][0]
    heads = dict(
        server.execute(
            "SELECT `partition`, head_offset FROM queue_partitions WHERE topic = %s", (SECOND,), database="second"
        )
    )
    marks = dict(
        server.execute(
            "SELECT `partition`, offset_acked FROM queue_offsets WHERE consumer_group = %s AND topic = %s",
            (GROUP, SECOND),
            database="second",
        )
    )
    return unsequenced == 0 and bool(heads) and all(marks.get(p, 0) == head for p, head in heads.items())


def first_caught_up() -> bool:
    if Message.objects.filter(topic=FIRST, offset__isnull=True).exists():
        return False
    heads = dict(Partition.objects.filter(topic=FIRST).values_list("partition", "head_offset"))
    marks = dict(
        ConsumerOffset.objects.filter(consumer_group=GROUP, topic=FIRST).values_list("partition", "offset_acked")
    )
    return bool(heads) and all(marks.get(p, 0) == head for p, head in heads.items())


def test_a_worker_serving_two_servers_is_killed_and_replaced_nothing_lost(runconsumer) -> None:
    reason = missing().get("mariadb")
    if reason:
        pytest.skip(reason)
    with MariaDBServer() as server:
        server.create_database("second")
        env = {"SQLQUEUE_TEST_SECOND_URL": server.url("second")}
        manage(env, "migrate", "django_sqlqueue", "--database", "second", "-v", "0")
        # Published by a process whose alias "second" is the new server (routed by second.*).
        script = (
            f"from tests.processes.test_databases import publish; print(len(publish({SECOND!r}, {COUNT}, sleep=0.05)))"
        )
        assert manage(env, "shell", "-v", "0", "-c", script).strip().splitlines()[-1] == str(COUNT)
        assert server.execute("SELECT COUNT(*) FROM queue_messages", database="second")[0][0] == COUNT
        first = publish(FIRST, COUNT, sleep=0.05)
        second = {f"{SECOND}-{n}" for n in range(COUNT)}

        def start(name: str):
            return runconsumer(name, "--group", GROUP, settings=SETTINGS, env=env)

        w1 = start("w1")
        wait_until(
            lambda: len(handled_ids(FIRST)) >= 10 and len(handled_ids(SECOND)) >= 10, 60, "w1 handling on both servers"
        )
        w1.kill9()
        w2 = start("w2")
        wait_until(lambda: "serving databases=default,second" in w2.log(), 30, "w2 serving both servers")
        server.restart(down=2)  # w2's worker of the second server waits out the outage; the other goes on
        wait_until(
            lambda: handled_ids(FIRST) == first and handled_ids(SECOND) == second,
            120,
            "every message of both servers handled",
            show=lambda: (len(handled_ids(FIRST)), len(handled_ids(SECOND))),
        )
        wait_until(lambda: first_caught_up() and second_caught_up(server), 60, "the watermarks at the heads on both")
        assert {"w1", "w2"} <= set(Handled.objects.values_list("worker", flat=True))
        assert order_violations(FIRST) == order_violations(SECOND) == []
        assert w2.terminate() == 0
        leases = server.execute("SELECT COUNT(*) FROM queue_partition_leases WHERE leased_by = 'w2'", database="second")
        assert leases[0][0] == 0  # handed back on SIGTERM
