"""Grouped reads about messages, for operators: deliveries by status, dead letters, the log's counters.

The other half of the operators' reads (``reports.py`` has groups and partitions, and
the definitions of lag, in flight and retrying). Plain reads, no locks, like those: a
report is a snapshot and may be a moment old. Every read of ``queue_messages`` here is an
index range, bounded or capped -- a group's dead-letter id prefix in the (topic, id)
unique index, at most ``cap + 1`` unsequenced rows per partition, a delivery's message
by its unique (topic, partition, offset) -- never a scan of the log; per-topic counts
over time come from the sequencer's hourly counters (``queue_topic_hours``), which
outlive the log's garbage collection.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

from ...models import Message
from ...rules.dlq import dead_letter_id_prefix
from .base import IN_FLIGHT, RETRY, SCHEDULED, StoreBase
from .reports import DeliveryCounts, where_filters


class DeliveryRow(NamedTuple):
    group: str
    topic: str
    partition: int
    offset: int
    status: int
    retry_count: int
    visible_at: dt.datetime | None
    message_id: str | None
    key: str | None
    last_error: str | None


class MessageReportStore(StoreBase):
    """Reads about messages: delivery state by status, dead-letter counts, the log's topics and counters."""

    # -- deliveries ----------------------------------------------------------------------

    def delivery_counts(
        self, group: str | None = None, topic: str | None = None
    ) -> dict[tuple[str, str, int], DeliveryCounts]:
        """Return unacked delivery state per (group, topic, partition), by status."""
        d = self.dialect
        where, params = where_filters(group, topic)
        where = (where + " AND" if where else " WHERE") + " acked = %s"
        return {
            (g, t, int(part)): DeliveryCounts(int(a or 0), int(b or 0), int(c or 0), int(e or 0))
            for g, t, part, a, b, c, e in self._fetchall(
                f"SELECT consumer_group, topic, {self.P}, "
                f"SUM(CASE WHEN status = {IN_FLIGHT} AND invisible_until > {d.now_sql} THEN 1 ELSE 0 END), "
                f"SUM(CASE WHEN status = {IN_FLIGHT} AND invisible_until <= {d.now_sql} THEN 1 ELSE 0 END), "
                f"SUM(CASE WHEN status = {RETRY} THEN 1 ELSE 0 END), "
                f"SUM(CASE WHEN status = {SCHEDULED} THEN 1 ELSE 0 END) "
                f"FROM queue_delivery_state{where} GROUP BY consumer_group, topic, {self.P}",
                [*params, False],
            )
        }

    def deliveries(self, group: str | None, topic: str | None, status: int | None, limit: int) -> list[DeliveryRow]:
        """Return unacked delivery state, soonest visible first, joined to the message's id and key.

        ``limit`` bounds the read; the join uses the message's unique (topic, partition,
        offset) index.
        """
        P, OFF, d = self.P, self.OFF, self.dialect
        where, params = where_filters(group, topic, "s.")
        where = (where + " AND" if where else " WHERE") + " s.acked = %s"
        params.append(False)
        if status is not None:
            where += " AND s.status = %s"
            params.append(status)
        rows = self._fetchall(
            f"SELECT s.consumer_group, s.topic, s.{P}, s.message_offset, s.status, s.retry_count, s.invisible_until, "
            f"m.id, m.{d.qn('key')}, s.last_error FROM queue_delivery_state s LEFT JOIN queue_messages m "
            f"ON m.topic = s.topic AND m.{P} = s.{P} AND m.{OFF} = s.message_offset{where} "
            f"ORDER BY s.invisible_until LIMIT {int(limit)}",
            params,
        )
        return [
            DeliveryRow(g, t, int(part), int(off), int(st), int(rc), d.to_datetime(vis), mid, key, err)
            for g, t, part, off, st, rc, vis, mid, key, err in rows
        ]

    # -- topics and dead letters --------------------------------------------------------------

    def messages_per_hour(self, since: dt.datetime) -> dict[str, list[tuple[dt.datetime, int]]]:
        """Messages numbered per topic per hour (of ``published_at``, UTC) from ``since`` on,
        hours in order: the sequencer's counters (``queue_topic_hours``), which outlive the
        log's garbage collection. Hours without messages are left out."""
        d = self.dialect
        hour = d.qn("hour")
        rows = self._fetchall(
            f"SELECT topic, {hour}, SUM({d.qn('messages')}) FROM queue_topic_hours WHERE {hour} >= %s "
            f"GROUP BY topic, {hour} ORDER BY topic, {hour}",
            [d.adapt_datetime(since)],
        )
        counts: dict[str, list[tuple[dt.datetime, int]]] = {}
        for topic, start, n in rows:
            counts.setdefault(topic, []).append((d.to_datetime(start), int(n)))
        return counts

    def log_topics(self) -> list[str]:
        """Return every topic that has messages, sorted (a loose index scan, see ``Dialect.distinct_topics_sql``)."""
        if self.dialect.distinct_topics_sql is not None:
            return [row[0] for row in self._fetchall(self.dialect.distinct_topics_sql)]
        topics: list[str] = []
        while rows := self._fetchall(self.dialect.next_topic_sql, [topics[-1] if topics else ""]):
            topics.append(rows[0][0])
        return topics

    # -- the message browser (``ops/messages.py``) -----------------------------------------

    def seq_extent(self, topic: str | None) -> tuple[int, int] | None:
        """The lowest and highest seq of ``topic``'s messages (None: of the log), or None if there are none.

        Two ends of one index: ``(topic, seq)``, or the primary key without a topic.
        """
        where, params = (" WHERE topic = %s", [topic]) if topic is not None else ("", [])
        ((low, high),) = self._fetchall(f"SELECT MIN(seq), MAX(seq) FROM queue_messages{where}", params)
        return None if low is None else (int(low), int(high))

    def page_seqs(
        self,
        topic: str | None,
        partition: int | None,
        key: str | None,
        seqs: tuple[int, int],
        published: tuple[dt.datetime | None, dt.datetime | None],
        limit: int,
    ) -> list[int]:
        """The seqs ``low <= seq < high`` of the messages of ``topic`` (None: any), ``partition``
        and ``key`` (None: any) published within ``published`` (from, to; None: open), newest
        first, at most ``limit``.

        Reads the ``(topic, seq)`` index backwards from ``high`` (the primary key without a
        topic), at most ``high - low`` entries, and nothing else. ``partition + 0`` keeps the
        ``(topic, partition, offset)`` index out of the plan: it would read the partition's every
        row and sort them. MySQL/MariaDB are told the index too: right after a bulk load their
        statistics chose a backward walk of the primary key for a partition's page, 2.2 s at
        1,000,000 messages (issue 32).
        """
        d = self.dialect
        low, high = seqs
        where = ["seq >= %s", "seq < %s"]
        params: list[Any] = [low, high]
        if topic is not None:
            where.insert(0, "topic = %s")
            params.insert(0, topic)
        if partition is not None:
            where.append(f"{self.P} + 0 = %s")
            params.append(partition)
        if key is not None:
            where.append(f"{d.qn('key')} = %s")
            params.append(key)
        for op, when in zip((">=", "<="), published, strict=True):
            if when is not None:
                where.append(f"published_at {op} %s")
                params.append(d.adapt_datetime(when))
        hint = d.use_index("queue_msg_topic_seq" if topic is not None else "PRIMARY")
        sql = f"SELECT seq FROM queue_messages {hint} WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT %s"
        return [int(row[0]) for row in self._fetchall(sql, [*params, limit])]

    def dead_letter_count(self, dlq_topic: str, group: str | None = None, cap: int | None = None) -> int:
        """Count the dead letters in ``dlq_topic`` (of ``group`` only), reading at most ``cap + 1``.

        A group's dead-letter ids share a prefix (``dlq.dead_letter_id_prefix``): a range of
        the (topic, id) unique index; the ORM escapes the prefix for LIKE.
        """
        qs = Message.objects.using(self.using).filter(topic=dlq_topic)
        if group is not None:
            qs = qs.filter(id__startswith=dead_letter_id_prefix(group))
        return (qs[: cap + 1] if cap is not None else qs).count()

    def dead_letter_counts(self, wanted: Sequence[tuple[str, str]], cap: int) -> dict[tuple[str, str], int]:
        """Return ``{(dlq_topic, group): dead letters}`` for each pair of ``wanted``, each capped at ``cap + 1``.

        The same capped index ranges as :meth:`dead_letter_count`, in **one** statement
        (``UNION ALL`` of the counts), so a report over many groups costs one round trip.
        """
        wanted = sorted(set(wanted))
        if not wanted:
            return {}
        parts, params = [], []
        for i, (topic, group) in enumerate(wanted):
            qs = Message.objects.using(self.using).filter(topic=topic, id__startswith=dead_letter_id_prefix(group))
            sql, qparams = qs.values("seq")[: cap + 1].query.get_compiler(self.using).as_sql()
            parts.append(f"SELECT {i} AS n, COUNT(*) AS c FROM ({sql}) capped{i}")
            params.extend(qparams)
        return {wanted[int(n)]: int(c) for n, c in self._fetchall(" UNION ALL ".join(parts), params)}

    def unsequenced_capped(self, cap: int) -> dict[str, int]:
        """Return per topic the messages waiting for an offset over the partitions with a head row, capped.

        Each count is a range of the index that serves the sequencer's own read, at most
        ``cap + 1`` rows, so it stays bounded whatever the backlog.
        """
        out: dict[str, int] = {}
        for topic, part in self._fetchall(f"SELECT topic, {self.P} FROM queue_partitions"):
            n = self.capped_count(
                f"SELECT 1 FROM queue_messages WHERE topic = %s AND {self.P} = %s AND {self.OFF} IS NULL",
                [topic, part],
                cap,
            )
            out[topic] = min(cap + 1, out.get(topic, 0) + n)
        return out

    def capped_count(self, sql: str, params: Sequence[Any], cap: int) -> int:
        """``COUNT(*)`` of a SELECT, reading at most ``cap + 1`` rows (so it stays bounded)."""
        ((count,),) = self._fetchall(f"SELECT COUNT(*) FROM ({sql} LIMIT {int(cap) + 1}) capped", params)
        return int(count)
