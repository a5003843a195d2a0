"""The connection budget: what a worker holds, the room check at start, and the server's
numbers it is made from (read from the real server, and from a real account whose limit
is lowered for the test)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection, connections

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.retry import is_transient
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.schedules import parse_schedule
from django_sqlqueue.worker.budget import ConnectionBudget, connection_budget, room_warning
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.outage import is_unreachable

from ..support.engine_helpers import fast_conf, requires_vendor, running, spec, wait_until

# -- what a worker holds -----------------------------------------------------------------


def noop(message: object) -> None:
    pass


async def anoop(message: object) -> None:
    pass


class AsyncCallable:
    async def __call__(self, message: object) -> None:
        pass


def test_a_plain_worker_holds_a_connection_for_its_poll_loop_lease_keeper_and_handler_thread():
    # Handlers have a timeout by default (their visibility timeout): they run on a handler
    # thread the poll loop watches (watchdog.py), which has its own connection.
    worker = Worker([spec("budget.t", "g", noop)], name="w", conf=fast_conf(NOTIFY=False))
    assert worker.connections_needed() == ConnectionBudget(poll_loop=1, lease_keeper=1, handler_threads=1)
    assert worker.connections_needed().describe() == "poll loop 1 + lease keeper 1 + handler threads 1 = 3"


def test_without_handler_timeouts_handlers_run_on_the_poll_loop_so_it_is_two():
    worker = Worker([spec("budget.t", "g", noop, timeout=None)], name="w", conf=fast_conf(NOTIFY=False))
    assert worker.connections_needed() == ConnectionBudget(poll_loop=1, lease_keeper=1)
    assert worker.connections_needed().describe() == "poll loop 1 + lease keeper 1 = 2"


def test_on_postgresql_the_notification_listener_adds_one():
    from django.db import connection

    listens = connection.vendor == "postgresql"
    worker = Worker([spec("budget.t", "g", noop)], name="w", conf=fast_conf())
    budget = worker.connections_needed()
    assert budget == ConnectionBudget(poll_loop=1, lease_keeper=1, handler_threads=1, listener=int(listens))
    if listens:
        assert budget.describe() == "poll loop 1 + lease keeper 1 + handler threads 1 + notification listener 1 = 4"
    assert Worker([spec("budget.t", "g", noop)], name="w", conf=fast_conf(NOTIFY=False)).listener is None


def test_handler_threads_a_scheduler_and_async_handlers_each_add_their_connections():
    schedule = parse_schedule("budget-tick", {"cron": "* * * * *", "topic": "budget.ticks"})
    worker = Worker(
        [spec("budget.t", "g", noop), spec("budget.a", "g", anoop)],
        name="w",
        conf=fast_conf(NOTIFY=False),
        concurrency=4,
        schedules=[schedule],
    )
    budget = worker.connections_needed()
    assert budget == ConnectionBudget(handler_threads=4, scheduler=1, async_thread=1)
    assert budget.total == 8
    assert budget.describe() == (
        "poll loop 1 + lease keeper 1 + handler threads 4 + scheduler 1 + async handlers' thread 1 = 8"
    )


def test_concurrency_one_adds_one_handler_thread_only_when_handlers_have_a_timeout():
    assert connection_budget(concurrency=1, scheduler=False, async_handlers=False, handler_threads=False).total == 2
    assert connection_budget(concurrency=1, scheduler=False, async_handlers=False, handler_threads=True).total == 3
    assert connection_budget(concurrency=2, scheduler=False, async_handlers=False).total == 4
    assert connection_budget(concurrency=4, scheduler=True, async_handlers=False).total == 7  # production.md's


def test_an_object_with_an_async_call_counts_as_an_async_handler():
    worker = Worker([spec("budget.t", "g", AsyncCallable())], name="w", conf=fast_conf())
    assert worker.connections_needed().async_thread == 1


# -- the room check ------------------------------------------------------------------------


def test_no_warning_while_the_server_has_room_for_the_connections_still_to_open():
    # The poll loop's connection is open (and counted in use): 2 more are needed, 2 are free.
    assert room_warning([("max_connections", 151, 149)], needed=3) is None


def test_a_warning_names_the_tightest_limit_the_room_left_and_what_to_set():
    warning = room_warning([("max_connections", 151, 150), ("max_user_connections", 40, 10)], needed=3)
    assert warning is not None
    assert "room for 1 more connection(s) under max_connections (151, 150 in use)" in warning
    assert "this worker needs 2 more" in warning
    assert "Set max_connections to at least 152 for this worker alone" in warning
    assert "Running in production, Connections" in warning

    tighter = room_warning([("max_connections", 151, 10), ("the role's CONNECTION LIMIT", 1, 1)], needed=2)
    assert tighter is not None and "room for 0 more connection(s) under the role's CONNECTION LIMIT (1, 1 in use)" in (
        tighter
    )


def test_a_server_over_its_limit_has_no_room_not_negative_room():
    # MySQL lets an account with SUPER open one more than max_connections.
    warning = room_warning([("max_connections", 151, 152)], needed=2)
    assert warning is not None and "room for 0 more" in warning


def test_a_server_without_limits_never_warns():
    assert room_warning([], needed=8) is None


# -- the server's numbers ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_server_reports_its_connection_limit_and_at_least_this_connection_in_use():
    limits = QueueStore("default").connection_limits()
    if connection.vendor == "sqlite":
        assert limits == []  # a file: no server, no limit
        return
    what, limit, in_use = limits[0]
    assert what == "max_connections"
    assert limit >= 10  # MariaDB's default is 151, PostgreSQL's 100
    assert 1 <= in_use <= limit + 1  # MySQL: SUPER may use one more
    # The test user is unlimited (no max_user_connections; a PostgreSQL superuser).
    assert [name for name, _, _ in limits] == ["max_connections"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_checks_the_room_once_at_start(caplog):
    caplog.set_level(logging.DEBUG, logger="django_sqlqueue.worker")

    def checked() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "django_sqlqueue.worker.startup"]
        return [line for line in lines if "connection limit" in line or "room for" in line]

    with running([spec("budget.start", "g", noop)], name="budget-start"):
        wait_until(checked, what="the connection check")
        time.sleep(0.3)  # polls go on; the check is not repeated
    if connection.vendor == "sqlite":
        assert checked() == ["no connection limit to check (sqlite) alias=default"]
    else:
        # A warning if the shared test server happens to be nearly full, else the DEBUG line.
        assert len(checked()) == 1, checked()
        assert "leave room for this worker's poll loop 1 + lease keeper 1 = 2" in checked()[0] or (
            "room for" in checked()[0]
        )


# -- a real account with a connection limit of 1 --------------------------------------------------

ACCOUNT = f"sqlqueue_budget_{os.getpid()}"
PASSWORD = "sqlqueue_budget"


@pytest.fixture
def limited_account(transactional_db) -> Iterator[dict]:
    """A database account that may open one connection; yields Django settings for it.

    MySQL/MariaDB: a user ``WITH MAX_USER_CONNECTIONS 1`` and no privileges (the test only
    connects). PostgreSQL: a role (not a superuser, whom limits do not bind) with
    ``CONNECTION LIMIT 1``. Both are named after this process: the server is shared.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                f"CREATE USER '{ACCOUNT}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}' WITH MAX_USER_CONNECTIONS 1"
            )
            settings = {**connection.settings_dict, "USER": ACCOUNT, "PASSWORD": PASSWORD, "NAME": ""}
        else:
            cursor.execute(f"CREATE ROLE {ACCOUNT} LOGIN PASSWORD '{PASSWORD}' CONNECTION LIMIT 1")
            settings = {**connection.settings_dict, "USER": ACCOUNT, "PASSWORD": PASSWORD}
    try:
        yield settings
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute(f"DROP USER '{ACCOUNT}'@'127.0.0.1'")
            else:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = %s", [ACCOUNT]
                )
                cursor.execute(f"DROP ROLE {ACCOUNT}")


def account_connection(settings: dict, alias: str):
    return type(connections["default"])(settings, alias=alias)


@requires_vendor("mysql", "postgresql")
def test_a_connection_refused_over_an_account_limit_is_an_outage_and_the_check_sees_the_limit(limited_account):
    first = account_connection(limited_account, "budget-first")
    second = account_connection(limited_account, "budget-second")
    try:
        first.ensure_connection()
        # The dialect on this connection (a QueueStore reads a `connections` alias).
        with first.cursor() as cursor:
            limits = get_dialect(first).connection_limits(cursor)
        name = {"mysql": "max_user_connections", "postgresql": "the role's CONNECTION LIMIT"}[connection.vendor]
        assert (name, 1, 1) in limits, limits
        assert room_warning(limits, needed=2) is not None

        with pytest.raises(OperationalError) as refused:
            second.ensure_connection()
        # MariaDB: 1226 (the account's MAX_USER_CONNECTIONS); PostgreSQL: 53300, which psycopg
        # raises at connect time without a SQLSTATE (matched on the server's message).
        assert is_transient(refused.value) == (True, True), repr(refused.value)
        assert is_unreachable(refused.value), repr(refused.value)
    finally:
        first.close()
        second.close()
