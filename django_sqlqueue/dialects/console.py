"""Vendor-specific reads of the operator console (``django_sqlqueue.ops``).

Kept apart from the engine's :class:`~django_sqlqueue.dialects.base.Dialect`: nothing
here runs on a worker's path.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper


def distinct_topics_sql(connection: BaseDatabaseWrapper) -> str:
    """A statement listing every topic present in ``queue_messages``, sorted, without a scan.

    - MySQL/MariaDB: ``SELECT DISTINCT topic`` over an index starting with ``topic``
      (``queue_msg_topic_seq``) is a loose index scan ("Using index for group-by"): one
      index dive per topic, whatever the number of messages.
    - PostgreSQL and SQLite have no loose index scan: a recursive CTE emulates it, each
      step one index probe for the smallest topic above the previous one.

    Takes no locks (a plain read).
    """
    if connection.vendor == "mysql":
        return "SELECT DISTINCT topic FROM queue_messages FORCE INDEX (queue_msg_topic_seq) ORDER BY topic"
    return (
        "WITH RECURSIVE t(topic) AS ("
        " SELECT MIN(topic) FROM queue_messages"
        " UNION ALL"
        " SELECT (SELECT MIN(m.topic) FROM queue_messages m WHERE m.topic > t.topic)"
        " FROM t WHERE t.topic IS NOT NULL"
        ") SELECT topic FROM t WHERE topic IS NOT NULL ORDER BY topic"
    )


def for_update(connection: BaseDatabaseWrapper) -> str:
    """``FOR UPDATE`` where the database has row locks; SQLite serializes writers instead."""
    return " FOR UPDATE" if connection.features.has_select_for_update else ""
