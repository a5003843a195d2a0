"""What a vendor's connections can do beside the queue's statements (``db/dialects/sessions.py``)."""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.sessions import Sessions

pytestmark = pytest.mark.django_db(transaction=True)


def test_connection_limits_report_the_servers_limit_and_current_use():
    d = get_dialect(connection)
    assert isinstance(d, Sessions)
    with connection.cursor() as cursor:
        limits = d.connection_limits(cursor)
    if connection.vendor == "sqlite":
        assert limits == []
        return
    assert limits, "a server database reports at least max_connections"
    for what, limit, in_use in limits:
        assert what and limit > 0
        assert 1 <= in_use <= limit  # this test's own connection is in use


def test_the_idle_transaction_timeout_statement_runs_where_there_is_one():
    d = get_dialect(connection)
    sql = d.idle_transaction_timeout_sql(30)
    if connection.vendor == "sqlite":
        assert sql is None
        return
    assert sql is not None
    with connection.cursor() as cursor:
        cursor.execute(sql)  # accepted by the server as it is
        cursor.execute(d.idle_transaction_timeout_sql(None) or "SELECT 1")
