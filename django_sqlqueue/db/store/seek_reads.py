"""The plain reads a seek's plan takes, and a Spark source's start by time (no locks).

Where a partition starts (by offset or by the time its messages were published), and how
many messages and acked deliveries lie in a range of its offsets. The writes of a seek are
in ``positions.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from .base import StoreBase

#: A search by time probes for the messages published this long before the time asked for,
#: then reads forward in offset order: exact unless a publishing transaction stayed open
#: longer (see :meth:`SeekReads.first_offset`).
TIME_SLACK = dt.timedelta(hours=1)
#: Offsets left between two probes when the search stops and the forward read begins.
WALK = 256
#: The seq search's slack (see :meth:`SeekReads.first_offset`), and the seqs it may leave.
SEQ_SLACK = dt.timedelta(minutes=5)
SEQ_GAP = 4_096

#: Offsets a seek's preview counts one by one per partition; a longer range is not counted.
COUNT_CAP = 50_000

#: ``probe(at, last)``: one index entry's position and ``published_at`` (see ``_search``).
Probe = Callable[[int | None, bool], tuple[int, dt.datetime] | None]


class SeekReads(StoreBase):
    """The plain reads a seek's plan takes (no locks): where a partition starts, and how many
    messages and acked deliveries lie in a range of its offsets."""

    def first_offset(self, topic: str, partition: int, since: dt.datetime | None = None) -> int | None:
        """Return the smallest offset in the partition (published at or after ``since``), or None.

        By time, a search whose cost does not grow with the retained log (issue 32):
        ``published_at`` has no index, and a read in offset order up to ``since`` walked the
        partition's whole log (13-15 s a partition at 10,000,000 messages on MariaDB). Two
        orders almost agree with ``published_at``, the time the row was written (the
        database's clock, at the INSERT statement):

        - ``seq``, handed out as the row is inserted: rows written at least
          :data:`SEQ_SLACK` apart are in ``seq`` order unless one INSERT statement ran that
          long before writing its row;
        - the offsets, handed out after the row's transaction committed: rows written at least
          :data:`TIME_SLACK` apart are in offset order unless a publishing transaction stayed
          open that long.

        So: probes of the ``(topic, seq)`` index find a ``seq`` below every row written at or
        after ``since``; probes of the partition's offsets find an offset below every such row
        of the partition (fewer than :data:`WALK` offsets above the last message written before
        ``since - TIME_SLACK``); then one read in offset order from there. On MySQL/MariaDB and
        SQLite that read skips the rows below the ``seq`` within the index (its entries hold
        the primary key) and reads rows only near the answer: about 30 probes at 10,000,000
        messages in 8 partitions, plus about :data:`TIME_SLACK` of the partition's index
        entries. PostgreSQL's
        entries do not hold ``seq``: no seq search, and the read fetches each row of about
        :data:`TIME_SLACK` of the partition. Exact but for the two exceptions above (and a
        database clock stepped back), where a message written at or after ``since`` but
        numbered early lies below the offset returned.
        """
        if since is None:
            # The first entry of the partition's offset range, one index dive (pinned: ``MIN()``
            # with ``IS NOT NULL`` made MariaDB read the partition's whole range, 125,000 rows at
            # 1,000,000 messages; issue 32).
            first = self._probe_offset(topic, partition, None, False)
            return first[0] if first else None
        if since.tzinfo is None:  # naive = UTC, as Django's adapters took it before
            since = since.replace(tzinfo=dt.UTC)
        moment = _earlier(since, TIME_SLACK)
        found = self._search(lambda at, last: self._probe_offset(topic, partition, at, last), moment, WALK)
        if found is None:
            return None
        start, d = found[0], self.dialect
        sql = (
            f"SELECT {self.OFF} FROM queue_messages {d.use_index('queue_msg_offset')} "
            f"WHERE topic = %s AND {self.P} = %s AND {self.OFF} >= %s AND "
        )
        params: list[object] = [topic, partition, start]
        if d.index_entries_hold_seq:
            sql += "seq > %s AND "
            params.append(self._seq_bound(topic, since))
        # The read forward from ``start``: the offset index's range in order, each entry's row
        # read for its ``published_at`` (where the entries hold seq, only once it passed the bound).
        rows = self._pinned(f"{sql}published_at >= %s ORDER BY {self.OFF} LIMIT 1", [*params, d.adapt_datetime(since)])
        return int(rows[0][0]) if rows else None

    def _seq_bound(self, topic: str, since: dt.datetime) -> int:
        """A ``seq`` below every row of ``topic`` written at or after ``since`` (by probes).

        Searched once per store, topic and time: every partition of a seek asks the same. A
        bound found stays one, as rows written later get larger seqs and collected rows only
        leave; so the cache (a few entries) is never stale.
        """
        cache = self.__dict__.setdefault("_seq_bounds", {})
        if (topic, since) not in cache:
            moment = _earlier(since, SEQ_SLACK)
            found = self._search(lambda at, last: self._probe_seq(topic, at, last), moment, SEQ_GAP)
            # (None: the topic's rows were all collected meanwhile; no bound then.)
            seq, before = found or (0, True)
            if len(cache) >= 64:
                cache.clear()
            cache[(topic, since)] = seq if before else seq - 1
        return int(cache[(topic, since)])

    @staticmethod
    def _search(probe: Probe, moment: dt.datetime, gap: int) -> tuple[int, bool] | None:
        """Bisect positions (offsets of a partition, or seqs of a topic) by ``published_at``.

        Returns ``(position, True)``: a row at ``position`` was written before ``moment``, and
        fewer than ``gap`` positions above it the first probed row written at or after it; or
        ``(first position, False)`` when the first row was written at or after ``moment``; None
        when there is no row. ``probe(at, last)`` reads one index entry: the first at or after
        ``at`` (the first, or with ``last`` the last, when ``at`` is None).
        """
        first = probe(None, False)
        if first is None:
            return None
        low, written = first
        if written >= moment:
            return low, False
        last = probe(None, True)
        assert last is not None  # there is a first entry, so a last one
        high = last[0] + 1
        # Invariant: the row at ``low`` was written before ``moment``, and the first row at or
        # after ``high`` (if any) at or after it.
        while high - low > gap:
            middle = (low + high) // 2
            found = probe(middle, False)
            if found is None or found[0] >= high:
                high = middle
            elif found[1] < moment:
                low = found[0]
            else:
                high = found[0]
        return low, True

    def _probe_offset(self, topic: str, partition: int, at: int | None, last: bool) -> tuple[int, dt.datetime] | None:
        """The offset and ``published_at`` of one entry of the partition's offset index."""
        return self._probe("queue_msg_offset", self.OFF, f"topic = %s AND {self.P} = %s", [topic, partition], at, last)

    def _probe_seq(self, topic: str, at: int | None, last: bool) -> tuple[int, dt.datetime] | None:
        """The ``seq`` and ``published_at`` of one entry of the topic's ``(topic, seq)`` index."""
        return self._probe("queue_msg_topic_seq", "seq", "topic = %s", [topic], at, last)

    def _probe(
        self, index: str, column: str, where: str, params: list[object], at: int | None, last: bool
    ) -> tuple[int, dt.datetime] | None:
        """One index dive: ``column`` and ``published_at`` of the first entry at or after ``at``
        (the first, or with ``last`` the last, when None)."""
        d = self.dialect
        bound, more = (f"{column} IS NOT NULL", []) if at is None else (f"{column} >= %s", [at])
        rows = self._fetchall(
            f"SELECT {column}, published_at FROM queue_messages {d.use_index(index)} WHERE {where} AND {bound} "
            f"ORDER BY {column} {'DESC ' if last else ''}LIMIT 1",
            [*params, *more],
        )
        return (int(rows[0][0]), d.to_datetime(rows[0][1])) if rows else None

    def count_messages(self, topic: str, partition: int, low: int, high: int) -> tuple[int, bool]:
        """Count the partition's messages with ``low < offset <= high``: ``(count, exact)``.

        A range of more than :data:`COUNT_CAP` retained offsets is not counted (it took
        4.3 s for a seek's preview to the earliest of 10,000,000 messages on MariaDB, and a
        seek counts again in its fenced transaction, holding the lease rows): its offsets are
        returned, with ``exact`` False. The sequencer hands offsets out without gaps and
        garbage collection removes them from the bottom, so that is the count but where a
        purge or a collection by age removed messages out of offset order.

        The count is one range of the offset index, pinned: a range that spans a whole
        partition looks cheaper as a scan of the table to an optimizer with statistics
        (PostgreSQL read all 1,013,001 rows of a 1M log for 125,000 offsets).
        """
        if high - low > COUNT_CAP:
            first = self._probe_offset(topic, partition, None, False)
            last = self._probe_offset(topic, partition, None, True)
            if first is None or last is None:
                return 0, True
            low, high = max(low, first[0] - 1), min(high, last[0])
            if high <= low:
                return 0, True
            if high - low > COUNT_CAP:
                return high - low, False
        d = self.dialect
        sql = (
            f"SELECT COUNT(*) FROM queue_messages {d.use_index('queue_msg_offset')} WHERE topic = %s "
            f"AND {self.P} = %s AND {self.OFF} > %s AND {self.OFF} <= %s"
        )
        ((n,),) = self._pinned(sql, [topic, partition, low, high])
        return int(n), True

    def _pinned(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run a read of the offset index kept off a scan of the table where no index hint
        exists (``Dialect.no_table_scan_sql``)."""
        d = self.dialect
        if d.no_table_scan_sql is None:
            return self._fetchall(sql, params)
        off, back = d.no_table_scan_sql
        with transaction.atomic(using=self.using):  # SET LOCAL lasts until the transaction ends
            self._execute(off)
            rows = self._fetchall(sql, params)
            self._execute(back)
        return rows

    def count_acked(self, group: str, topic: str, partition: int, low: int, high: int | None) -> int:
        """Count ``group``'s acked delivery rows of the partition with ``low < offset [<= high]``."""
        sql = (
            f"SELECT COUNT(*) FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s AND {self.P} = %s "
            "AND acked = %s AND message_offset > %s"
        )
        params: list[object] = [group, topic, partition, True, low]
        if high is not None:
            sql += " AND message_offset <= %s"
            params.append(high)
        ((n,),) = self._fetchall(sql, params)
        return int(n)


def _earlier(moment: dt.datetime, slack: dt.timedelta) -> dt.datetime:
    """``moment - slack``, or ``moment`` itself where that falls before year 1 (every row is
    written after either)."""
    try:
        return moment - slack
    except OverflowError:
        return moment
