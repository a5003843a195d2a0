"""Database outages: a few log lines, not a traceback per retry; recovery; SIGTERM honoured.

The process tests run a real ``runconsumer`` whose DATABASE_URL points at a TCP proxy
(tests/support/tcpproxy.py) in front of the real server; the test cuts the proxy (every
connection closed, new ones refused) and restores it. The test itself talks to the
server directly, so it keeps publishing during the outage.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import DatabaseError, OperationalError, connection, connections
from django.db.utils import ProgrammingError

from django_sqlqueue import publish_many
from django_sqlqueue.db.retry import is_transient
from django_sqlqueue.worker.outage import OutageReporter, is_unreachable
from tests.support.consumerapp.models import Handled
from tests.support.processes import database_url
from tests.support.tcpproxy import TcpProxy

from ..support.engine_helpers import caught_up, not_on_sqlite, requires_vendor, wait_until
from ..support.ports import free_port

pytestmark = not_on_sqlite("an outage is a database server going away; SQLite is a file in the process")

TOPIC = "proc.events"
KEYS = ["p0", "p1", "p2", "p3"]


# -- classifying errors (real drivers, real refused connections) --------------------------


@pytest.mark.django_db
def test_a_refused_connection_is_unreachable_a_bad_query_is_not():
    settings = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(free_port())}
    wrapper = type(connections["default"])(settings, alias="unreachable")
    with pytest.raises(DatabaseError) as refused:
        wrapper.ensure_connection()
    assert is_unreachable(refused.value)
    with pytest.raises(ProgrammingError) as bad, connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM queue_message")
    assert not is_unreachable(bad.value)


# -- a real worker behind a proxy ---------------------------------------------------------


@pytest.fixture
def proxy(transactional_db) -> Iterator[TcpProxy]:
    s = connection.settings_dict
    default_port = {"mysql": 3306, "postgresql": 5432}[connection.vendor]
    tcp = TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or default_port))
    yield tcp
    tcp.close()


def proxied_url(proxy: TcpProxy) -> str:
    url = database_url()
    return re.sub(r"@[^/@]+/", f"@127.0.0.1:{proxy.port}/", url)


def start_worker(runconsumer, proxy: TcpProxy, name: str):
    return runconsumer(
        name,
        "--group",
        "g1",
        "--topic",
        TOPIC,
        settings="tests.support.process_settings_outage",
        verbosity="1",
        env={"DATABASE_URL": proxied_url(proxy)},
    )


def publish_round(tag: str) -> list[str]:
    messages = publish_many(TOPIC, [{"payload": {"tag": tag}, "key": key} for key in KEYS])
    return [m.id for m in messages]


@pytest.mark.slow
def test_outage_is_reported_in_a_few_lines_and_everything_is_handled_after_recovery(runconsumer, proxy):
    before = publish_round("before")
    process = start_worker(runconsumer, proxy, "outage")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="the first messages handled")

    proxy.cut()
    during = publish_round("during")  # straight to the server, not through the proxy
    wait_until(lambda: "database unreachable" in process.log(), timeout=10, what="the outage line")
    wait_until(lambda: process.log().count("database still unreachable") >= 3, timeout=15, what="three summary lines")
    proxy.restore()
    wait_until(lambda: "database reachable again" in process.log(), timeout=15, what="the recovery line")
    after = publish_round("after")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="everything handled after the outage")
    assert process.terminate() == 0

    log = process.log()
    assert "Traceback" not in log, log
    lines = log.splitlines()
    starts = [line for line in lines if "database unreachable" in line]
    summaries = [line for line in lines if "database still unreachable" in line]
    recoveries = [line for line in lines if "database reachable again" in line]
    assert len(starts) == 1 and len(recoveries) == 1, log
    expected = (
        "WARNING django_sqlqueue.worker.outage database unreachable, retrying until it is back alias=default error="
    )
    assert expected in starts[0]
    counts = [int(re.search(r"failed_attempts=(\d+)", line).group(1)) for line in summaries]
    assert counts == sorted(counts) and counts[0] >= 2, summaries
    seconds = [int(re.search(r"unreachable after (\d+)s", line).group(1)) for line in summaries]
    assert seconds == sorted(seconds) and seconds[-1] >= 3, summaries
    assert re.search(r"database reachable again after \d+\.\ds failed_attempts=\d+ alias=default", recoveries[0])
    # Only a handful of lines over the whole outage (start, ~1 a second, recovery, lease churn).
    outage_lines = lines[lines.index(starts[0]) : lines.index(recoveries[0]) + 1]
    assert len(outage_lines) <= len(summaries) + 12, "\n".join(outage_lines)

    handled = Counter(Handled.objects.filter(topic=TOPIC, group="g1").values_list("message_id", flat=True))
    assert handled == Counter(dict.fromkeys([*before, *during, *after], 1))


@pytest.mark.slow
def test_a_worker_started_during_an_outage_waits_for_the_database_instead_of_exiting(runconsumer, proxy):
    before = publish_round("before")
    proxy.cut()
    process = start_worker(runconsumer, proxy, "late")
    wait_until(lambda: process.log().count("database still unreachable") >= 2, timeout=20, what="two summaries")
    assert process.alive(), process.log()
    proxy.restore()
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="everything handled once the database is back")
    assert process.terminate() == 0

    log = process.log()
    assert "Traceback" not in log, log
    lines = log.splitlines()
    assert len([line for line in lines if "database unreachable" in line]) == 1, log
    assert len([line for line in lines if "database reachable again" in line]) == 1, log
    handled = Counter(Handled.objects.filter(topic=TOPIC, group="g1").values_list("message_id", flat=True))
    assert handled == Counter(dict.fromkeys(before, 1))


@pytest.mark.slow
def test_sigterm_during_an_outage_exits_within_two_seconds(runconsumer, proxy):
    publish_round("before")
    process = start_worker(runconsumer, proxy, "sigterm")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="the first messages handled")

    proxy.cut()
    wait_until(lambda: "database unreachable" in process.log(), timeout=10, what="the outage line")
    time.sleep(1.5)  # in the middle of the retries
    started = time.monotonic()
    assert process.terminate(timeout=10) == 0
    elapsed = time.monotonic() - started
    log = process.log()
    assert elapsed < 2.0, f"took {elapsed:.1f}s to exit:\n{log}"
    assert "Traceback" not in log, log
    assert "could not release leases, database unreachable; they expire in 3s group=g1" in log
    assert "worker stopped subscriber=sigterm" in log


# -- too many connections ---------------------------------------------------------------------


def too_many_connections_error() -> DatabaseError:
    """The driver's "too many connections" error, raised through Django's error wrapper
    exactly as a refused connect raises it (same class, args and ``__cause__``).

    MySQL's 1040 comes from the server-wide ``max_connections``, which a test cannot lower
    on the server the other suites share: the error is built with mysqlclient's args here
    (the per-account limits, 1226, are refused for real in tests/worker/test_budget.py).
    PostgreSQL's 53300 with its SQLSTATE, as psycopg raises it on a running session's
    server; the connect-time form without one is refused for real below and in
    tests/worker/test_budget.py.
    """
    if connection.vendor == "mysql":
        import MySQLdb

        driver_error: Exception = MySQLdb.OperationalError(1040, "Too many connections")
    else:
        import psycopg

        driver_error = psycopg.errors.TooManyConnections("FATAL:  sorry, too many clients already")
    try:
        with connection.wrap_database_errors:
            raise driver_error
    except DatabaseError as exc:
        return exc
    raise AssertionError("not wrapped")  # pragma: no cover


@pytest.mark.django_db
def test_too_many_connections_is_an_outage_retried_like_a_lost_connection():
    error = too_many_connections_error()
    assert isinstance(error, OperationalError)
    assert is_transient(error) == (True, True)
    assert is_unreachable(error)


def test_an_outage_ends_when_every_thread_that_failed_succeeds_again(caplog):
    """The lease keeper cannot open a connection while the poll loop keeps its own: the poll
    loop's successes do not end the outage (nor the keeper's next failure start another)."""
    caplog.set_level(logging.WARNING, logger="django_sqlqueue.worker.outage")
    clock = [0.0]
    reporter = OutageReporter(alias="default", report_interval=10, clock=lambda: clock[0])
    refused = DatabaseError('too many connections for role "x"')
    # One long-lived thread plays the lease keeper; this thread is the poll loop.
    with ThreadPoolExecutor(max_workers=1) as keeper, ThreadPoolExecutor(max_workers=1) as other:
        for second in range(25):
            clock[0] = float(second)
            keeper.submit(reporter.unreachable, refused).result()
            reporter.reachable()  # the poll loop polls fine
        assert reporter.in_outage
        other.submit(reporter.reachable).result()  # a thread that never failed changes nothing
        assert reporter.in_outage
        clock[0] = 30.0
        keeper.submit(reporter.reachable).result()
        assert not reporter.in_outage

    lines = [r.getMessage() for r in caplog.records if r.name == "django_sqlqueue.worker.outage"]
    assert len(lines) == 4, lines  # the start, two summaries (at 10 s and 20 s), the end
    assert lines[0].startswith("database unreachable, retrying until it is back alias=default")
    assert lines[1].startswith("database still unreachable after 10s failed_attempts=11")
    assert lines[2].startswith("database still unreachable after 20s failed_attempts=21")
    assert lines[3] == "database reachable again after 30.0s failed_attempts=25 alias=default"


@pytest.fixture
def limited_role(transactional_db) -> Iterator[str]:
    """A PostgreSQL role that may open one connection and use the test database's tables;
    yields its name. Not a superuser: connection limits do not bind superusers. Named after
    this process, since roles are server-wide and the server is shared."""
    role = f"sqlqueue_limited_{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{role}' CONNECTION LIMIT 1")
        cursor.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    try:
        yield role
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = %s", [role])
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


@pytest.mark.slow
@requires_vendor("postgresql")  # MySQL: see too_many_connections_error(); per-account limits in test_budget.py
def test_a_worker_its_role_limit_refuses_reports_one_outage_and_carries_on_once_the_limit_is_lifted(
    runconsumer, limited_role
):
    before = publish_round("before")
    url = re.sub(r"//[^@/]+@", f"//{limited_role}:{limited_role}@", database_url())
    process = runconsumer(
        "limited",
        "--group",
        "g1",
        "--topic",
        TOPIC,
        settings="tests.support.process_settings_outage",
        verbosity="1",
        env={"DATABASE_URL": url},
    )
    # Its poll loop got the role's one connection; its lease keeper cannot open another.
    wait_until(lambda: process.log().count("database still unreachable") >= 3, timeout=20, what="three summaries")
    assert not Handled.objects.filter(topic=TOPIC, group="g1").exists()  # no lease, nothing handled
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {limited_role} CONNECTION LIMIT -1")
    wait_until(lambda: "database reachable again" in process.log(), timeout=15, what="the recovery line")
    wait_until(lambda: caught_up("g1", TOPIC), timeout=30, what="everything handled once the limit is lifted")
    assert process.terminate() == 0

    log = process.log()
    assert "Traceback" not in log, log
    assert not re.search(r"\bERROR\b", log), log
    lines = log.splitlines()
    room = [line for line in lines if "room for" in line]
    assert len(room) == 1, log
    assert (
        # Its lease keeper and its notification listener (PostgreSQL, where role limits are).
        "room for 0 more connection(s) under the role's CONNECTION LIMIT (1, 1 in use) but this worker needs 3 more"
        in room[0]
    )
    starts = [line for line in lines if "database unreachable" in line]
    recoveries = [line for line in lines if "database reachable again" in line]
    assert len(starts) == 1 and len(recoveries) == 1, log
    assert f'too many connections for role "{limited_role}"' in starts[0]
    handled = Counter(Handled.objects.filter(topic=TOPIC, group="g1").values_list("message_id", flat=True))
    assert handled == Counter(dict.fromkeys(before, 1))
