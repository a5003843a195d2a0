"""Every database operation of the consumer side, in one place.

The worker (``worker.py``), the lease keeper (``leasing.py``), garbage collection and
``queue_status`` call these methods; none of them writes SQL of its own. Vendor
differences come from the dialect (``dialects/``).

Locking, in short (READ COMMITTED on MySQL):

- Only the subscriber holding a partition's lease writes that partition's delivery state
  and watermark for its group; the lease is checked by the fetch itself.
- Statements touch one (group, topic) and primary-key ranges of it; multi-row writes list
  keys in sorted order. Deadlocks (1213) and lost connections are retried by the caller
  (``retry.py``), so every method here is safe to run again.
- Times compared across processes -- leases, heartbeats, visibility -- are computed in
  SQL from the database clock, never from a worker's clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from .dialects import Dialect, get_dialect
from .models import DeliveryState

IN_FLIGHT = DeliveryState.Status.IN_FLIGHT.value
RETRY = DeliveryState.Status.RETRY.value
SCHEDULED = DeliveryState.Status.SCHEDULED.value
#: Partitions per fetch statement (two UNION ALL branches each).
FETCH_CHUNK = 100
#: Delivery-state rows read per watermark step.
ADVANCE_SCAN = 1000


@dataclass(frozen=True)
class PartitionState:
    """What one poll needs to know about a held partition, from one query."""

    partition_key: str
    head: int
    watermark: int
    has_offsets_row: bool
    #: Highest offset with a delivery-state row (delivered, parked or acked), if any.
    delivered_max: int | None
    #: Earliest invisible_until of the partition's unacked rows, if any.
    next_due: dt.datetime | None
    #: Unacked rows being worked on right now (status IN_FLIGHT, still invisible).
    in_flight: int
    #: The row right after the watermark is acked, or that offset was garbage-collected:
    #: the watermark can move.
    advanceable: bool
    now: dt.datetime


@dataclass(frozen=True)
class FetchPlan:
    partition_key: str
    #: Fetch never-delivered messages above this offset (None: no fresh fetch).
    fresh_after: int | None
    #: Fetch unacked messages whose invisibility has ended.
    due: bool


@dataclass
class FetchedMessage:
    partition_key: str
    offset: int
    id: str
    payload: Any
    metadata: dict[str, Any]
    created_at: dt.datetime
    deliver_at: dt.datetime
    #: None for a message never delivered to this group (no delivery-state row).
    retry_count: int | None
    status: int | None


def _match_offsets(keys: Sequence[tuple[str, int]]) -> tuple[str, list[Any]]:
    """``(partition_key = ? AND message_offset IN (...)) OR ...`` for (key, offset) pairs.

    Not a row-constructor ``(partition_key, message_offset) IN ((..), ..)``: MariaDB
    plans that one quadratically (1,000 pairs took 1.2 s); this form is index ranges.
    """
    by_key: dict[str, list[int]] = {}
    for key, offset in sorted(keys):
        by_key.setdefault(key, []).append(offset)
    parts, params = [], []
    for key, offsets in by_key.items():
        parts.append(f"(partition_key = %s AND message_offset IN ({', '.join(['%s'] * len(offsets))}))")
        params += [key, *offsets]
    return f"({' OR '.join(parts)})", params


class QueueStore:
    """Consumer-side SQL on one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using

    # -- plumbing ------------------------------------------------------------------

    @property
    def connection(self) -> Any:
        return connections[self.using]

    @property
    def dialect(self) -> Dialect:
        return get_dialect(self.connection)

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def now(self) -> dt.datetime:
        """Return the database's current time."""
        d = self.dialect
        (row,) = self._fetchall(f"SELECT {d.now_sql}")
        return d.to_datetime(row[0])  # type: ignore[return-value]

    # -- heartbeats ------------------------------------------------------------------

    def heartbeat(self, group: str, topic: str, name: str) -> None:
        """Record that subscriber ``name`` is alive (and no longer deregistered)."""
        d = self.dialect
        self._execute(
            "INSERT INTO queue_subscriber_heartbeats (consumer_group, topic, subscriber_name, heartbeat_at, "
            f"deregistered_at) VALUES (%s, %s, %s, {d.now_sql}, NULL) "
            f"{d.on_conflict_update(['consumer_group', 'topic', 'subscriber_name'])} "
            f"heartbeat_at = {d.excluded('heartbeat_at')}, deregistered_at = NULL",
            [group, topic, name],
        )

    def deregister(self, group: str, topic: str, name: str) -> None:
        """Mark subscriber ``name`` as gone (graceful shutdown)."""
        self._execute(
            f"UPDATE queue_subscriber_heartbeats SET deregistered_at = {self.dialect.now_sql} "
            "WHERE consumer_group = %s AND topic = %s AND subscriber_name = %s",
            [group, topic, name],
        )

    def active_subscribers(self, group: str, topic: str, lease_duration: float) -> int:
        """Count subscribers of (group, topic) with a heartbeat within ``lease_duration``."""
        cutoff, params = self.dialect.now_minus(lease_duration)
        ((count,),) = self._fetchall(
            "SELECT COUNT(*) FROM queue_subscriber_heartbeats WHERE consumer_group = %s AND topic = %s "
            f"AND deregistered_at IS NULL AND heartbeat_at > {cutoff}",
            [group, topic, *params],
        )
        return int(count)

    def forget_subscribers(self, topic: str, older_than: float) -> int:
        """Delete heartbeat rows not renewed for ``older_than`` seconds."""
        cutoff, params = self.dialect.now_minus(older_than)
        return self._execute(
            f"DELETE FROM queue_subscriber_heartbeats WHERE topic = %s AND heartbeat_at < {cutoff}",
            [topic, *params],
        )

    # -- partitions and leases -------------------------------------------------------

    def partitions(self, topic: str) -> list[str]:
        """Return every partition key of ``topic``, sorted."""
        rows = self._fetchall(
            "SELECT partition_key FROM queue_partitions WHERE topic = %s ORDER BY partition_key", [topic]
        )
        return [r[0] for r in rows]

    def renew_leases(self, group: str, topic: str, name: str) -> list[str]:
        """Renew every lease ``name`` still holds; return those partitions, sorted.

        A lease stolen after it expired has another ``leased_by`` and is neither renewed
        nor returned: that is how a paused subscriber learns it lost a partition.
        """
        d = self.dialect
        self._execute(
            f"UPDATE queue_partition_leases SET lease_renewed_at = {d.now_sql} "
            "WHERE consumer_group = %s AND topic = %s AND leased_by = %s",
            [group, topic, name],
        )
        return self.held_partitions(group, topic, name)

    def held_partitions(self, group: str, topic: str, name: str) -> list[str]:
        rows = self._fetchall(
            "SELECT partition_key FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            "AND leased_by = %s ORDER BY partition_key",
            [group, topic, name],
        )
        return [r[0] for r in rows]

    def release_leases(self, group: str, topic: str, name: str, keys: Sequence[str] | None = None) -> int:
        """Give up leases (all of ``name``'s, or ``keys``) so others can take them at once."""
        sql = "DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s AND leased_by = %s"
        params: list[Any] = [group, topic, name]
        if keys is not None:
            if not keys:
                return 0
            sql += f" AND partition_key IN ({', '.join(['%s'] * len(keys))})"
            params += list(keys)
        return self._execute(sql, params)

    def free_partitions(self, group: str, topic: str, lease_duration: float) -> list[str]:
        """Partitions of ``topic`` with no lease in ``group``, or an expired one."""
        cutoff, params = self.dialect.now_minus(lease_duration)
        rows = self._fetchall(
            "SELECT p.partition_key FROM queue_partitions p LEFT JOIN queue_partition_leases l "
            "ON l.consumer_group = %s AND l.topic = p.topic AND l.partition_key = p.partition_key "
            f"WHERE p.topic = %s AND (l.partition_key IS NULL OR l.lease_renewed_at <= {cutoff}) "
            "ORDER BY p.partition_key",
            [group, topic, *params],
        )
        return [r[0] for r in rows]

    def acquire_lease(self, group: str, topic: str, key: str, name: str, lease_duration: float) -> bool:
        """Take the partition if its lease is missing or expired; return whether we got it.

        Stealing is a conditional UPDATE: the row lock makes it atomic against the
        holder's renewal, and the expiry condition is evaluated on the latest version.
        A missing lease is a plain INSERT; losing that race raises a duplicate key.
        """
        d = self.dialect
        cutoff, params = d.now_minus(lease_duration)
        stolen = self._execute(
            f"UPDATE queue_partition_leases SET leased_by = %s, leased_at = {d.now_sql}, "
            f"lease_renewed_at = {d.now_sql} WHERE consumer_group = %s AND topic = %s AND partition_key = %s "
            f"AND lease_renewed_at <= {cutoff}",
            [name, group, topic, key, *params],
        )
        if stolen:
            return True
        inserted = self._execute(
            "INSERT INTO queue_partition_leases (consumer_group, topic, partition_key, leased_by, leased_at, "
            f"lease_renewed_at) VALUES (%s, %s, %s, %s, {d.now_sql}, {d.now_sql}) "
            f"{d.on_conflict_ignore(['consumer_group', 'topic', 'partition_key'], 'leased_by')}",
            [group, topic, key, name],
        )
        if not inserted:
            return False
        # MySQL reports 1 for "found, unchanged" too (CLIENT_FOUND_ROWS): check the holder.
        rows = self._fetchall(
            "SELECT leased_by FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            "AND partition_key = %s",
            [group, topic, key],
        )
        return bool(rows) and rows[0][0] == name

    def ensure_offsets(self, group: str, topic: str, keys: Iterable[str]) -> None:
        """Create the group's watermark rows for partitions it starts consuming.

        A new group starts at the oldest retained message: the watermark is set just
        below it (or at the head when nothing is retained), so a partition whose start
        was garbage-collected does not wait forever for offsets that no longer exist.
        """
        d = self.dialect
        o = d.qn("offset")
        for key in sorted(set(keys)):
            self._execute(
                "INSERT INTO queue_offsets (consumer_group, topic, partition_key, offset_acked, updated_at) "
                f"SELECT %s, p.topic, p.partition_key, COALESCE((SELECT m.{o} FROM queue_messages m "
                f"WHERE m.topic = p.topic AND m.partition_key = p.partition_key ORDER BY m.{o} LIMIT 1) - 1, "
                "p.head_offset), "
                f"{d.now_sql} FROM queue_partitions p WHERE p.topic = %s AND p.partition_key = %s "
                f"{d.on_conflict_ignore(['consumer_group', 'topic', 'partition_key'], 'offset_acked')}",
                [group, topic, key],
            )

    # -- polling -----------------------------------------------------------------------

    def poll_state(self, group: str, topic: str, name: str, lease_duration: float) -> list[PartitionState]:
        """One query: the partitions ``name`` validly leases that may have work.

        Partitions whose head equals the watermark are filtered out by the join before
        any per-partition subquery runs, so idle partitions cost almost nothing; the
        subqueries are primary-key or ``queue_delivery_due`` index dives.
        """
        d = self.dialect
        o = d.qn("offset")
        cutoff, cutoff_params = d.now_minus(lease_duration)
        same = "d.consumer_group = l.consumer_group AND d.topic = l.topic AND d.partition_key = l.partition_key"
        rows = self._fetchall(
            "SELECT l.partition_key, p.head_offset, COALESCE(o.offset_acked, 0), o.offset_acked IS NOT NULL, "
            f"(SELECT MAX(d.message_offset) FROM queue_delivery_state d WHERE {same}), "
            f"(SELECT MIN(d.invisible_until) FROM queue_delivery_state d WHERE {same} AND d.acked = FALSE), "
            f"(SELECT COUNT(*) FROM queue_delivery_state d WHERE {same} AND d.acked = FALSE "
            f"AND d.status = {IN_FLIGHT} AND d.invisible_until > {d.now_sql}), "
            f"(SELECT d.acked FROM queue_delivery_state d WHERE {same} "
            "AND d.message_offset = COALESCE(o.offset_acked, 0) + 1), "
            # Below the oldest retained message: GC removed offsets the watermark must skip.
            # (ORDER BY ... LIMIT 1, not MIN(): MariaDB scans the partition for a correlated MIN.)
            f"COALESCE((SELECT m.{o} FROM queue_messages m WHERE m.topic = l.topic "
            f"AND m.partition_key = l.partition_key ORDER BY m.{o} LIMIT 1), p.head_offset + 1) "
            "> COALESCE(o.offset_acked, 0) + 1, "
            f"{d.now_sql} "
            "FROM queue_partition_leases l "
            "JOIN queue_partitions p ON p.topic = l.topic AND p.partition_key = l.partition_key "
            "LEFT JOIN queue_offsets o ON o.consumer_group = l.consumer_group AND o.topic = l.topic "
            "AND o.partition_key = l.partition_key "
            f"WHERE l.consumer_group = %s AND l.topic = %s AND l.leased_by = %s AND l.lease_renewed_at > {cutoff} "
            "AND p.head_offset > COALESCE(o.offset_acked, 0) ORDER BY l.partition_key",
            [group, topic, name, *cutoff_params],
        )
        return [
            PartitionState(
                partition_key=r[0],
                head=int(r[1]),
                watermark=int(r[2]),
                has_offsets_row=bool(r[3]),
                delivered_max=None if r[4] is None else int(r[4]),
                next_due=d.to_datetime(r[5]),
                in_flight=int(r[6] or 0),
                advanceable=bool(r[7]) or bool(r[8]),
                now=d.to_datetime(r[9]),  # type: ignore[arg-type]
            )
            for r in rows
        ]

    def fetch(self, group: str, topic: str, plans: Sequence[FetchPlan], limit: int) -> list[FetchedMessage]:
        """Fetch up to ``limit`` candidates per partition, in one statement per chunk.

        Two branches per partition, so a nacked or in-flight message never hides the
        deliverable ones behind it (the RFC's ``offset > watermark LIMIT n`` does):

        - fresh: never-delivered messages above every delivered offset -- a range read
          of the clustered primary key;
        - due: unacked delivery rows whose invisibility ended (nacked, expired, parked
          delayed messages), through the ``queue_delivery_due`` index.

        However many acked or in-flight rows lie between the watermark and them, neither
        branch reads them.
        """
        d = self.dialect
        o = d.qn("offset")
        cols = "m.partition_key, m.{o}, m.id, m.payload, m.metadata, m.created_at, m.deliver_at".format(o=o)
        result: list[FetchedMessage] = []
        for start in range(0, len(plans), FETCH_CHUNK):
            branches: list[str] = []
            params: list[Any] = []
            for plan in plans[start : start + FETCH_CHUNK]:
                if plan.fresh_after is not None:
                    branches.append(
                        d.union_branch(
                            f"SELECT {cols}, -1 AS retry_count, -1 AS status FROM queue_messages m "
                            f"WHERE m.topic = %s AND m.partition_key = %s AND m.{o} > %s "
                            f"ORDER BY m.{o} LIMIT {int(limit)}",
                            len(branches),
                        )
                    )
                    params += [topic, plan.partition_key, plan.fresh_after]
                if plan.due:
                    branches.append(
                        d.union_branch(
                            f"SELECT {cols}, d.retry_count, d.status FROM queue_delivery_state d "
                            f"JOIN queue_messages m ON m.topic = d.topic AND m.partition_key = d.partition_key "
                            f"AND m.{o} = d.message_offset WHERE d.consumer_group = %s AND d.topic = %s "
                            f"AND d.partition_key = %s AND d.acked = FALSE AND d.invisible_until <= {d.now_sql} "
                            f"ORDER BY d.message_offset LIMIT {int(limit)}",
                            len(branches),
                        )
                    )
                    params += [group, topic, plan.partition_key]
            if not branches:
                continue
            for r in self._fetchall(" UNION ALL ".join(branches), params):
                result.append(
                    FetchedMessage(
                        partition_key=r[0],
                        offset=int(r[1]),
                        id=r[2],
                        payload=d.load_json(r[3]),
                        metadata=d.load_json(r[4]),
                        created_at=d.to_datetime(r[5]),  # type: ignore[arg-type]
                        deliver_at=d.to_datetime(r[6]),  # type: ignore[arg-type]
                        # -1 marks the fresh branch (a typed NULL is not portable in UNION).
                        retry_count=None if r[7] == -1 else int(r[7]),
                        status=None if r[8] == -1 else int(r[8]),
                    )
                )
        return result

    def mark_delivered(
        self,
        group: str,
        topic: str,
        fresh: Sequence[FetchedMessage],
        redelivered: Sequence[FetchedMessage],
        parked: Sequence[FetchedMessage],
        visibility_timeout: float,
    ) -> None:
        """Record deliveries before the handlers run (at most two statements, one commit).

        ``fresh`` messages get a new row (in flight, retry_count 0); ``redelivered`` rows
        are set in flight again and count a retry unless they were only parked
        (SCHEDULED); ``parked`` are delayed messages the fresh fetch passed over: they get
        a SCHEDULED row that becomes due at their ``deliver_at``.
        """
        d = self.dialect
        until, until_params = d.now_plus(visibility_timeout)
        # The same for every row: the microseconds (an int we computed) go in as a literal.
        until_literal = until.replace("%s", str(int(until_params[0])))
        conflict = d.on_conflict_ignore(["consumer_group", "topic", "partition_key", "message_offset"], "acked")
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            rows: list[str] = []
            params: list[Any] = []
            for m in sorted(fresh, key=lambda m: (m.partition_key, m.offset)):
                rows.append(f"(%s, %s, %s, %s, FALSE, {until_literal}, 0, {IN_FLIGHT})")
                params += [group, topic, m.partition_key, m.offset]
            for m in sorted(parked, key=lambda m: (m.partition_key, m.offset)):
                rows.append(f"(%s, %s, %s, %s, FALSE, {d.datetime_placeholder}, 0, {SCHEDULED})")
                params += [group, topic, m.partition_key, m.offset, d.adapt_datetime(m.deliver_at)]
            if rows:
                # A row that exists already (a racing former lease holder) is left alone:
                # at-least-once allows the duplicate delivery.
                cursor.execute(
                    "INSERT INTO queue_delivery_state (consumer_group, topic, partition_key, message_offset, acked, "
                    f"invisible_until, retry_count, status) VALUES {', '.join(rows)} {conflict}",
                    params,
                )
            if redelivered:
                match, match_params = _match_offsets([(m.partition_key, m.offset) for m in redelivered])
                # retry_count is assigned before status: MySQL evaluates SET left to right.
                cursor.execute(
                    "UPDATE queue_delivery_state SET "
                    f"retry_count = retry_count + CASE WHEN status = {SCHEDULED} THEN 0 ELSE 1 END, "
                    f"status = {IN_FLIGHT}, invisible_until = {until} "
                    f"WHERE consumer_group = %s AND topic = %s AND acked = FALSE AND {match}",
                    [*until_params, group, topic, *match_params],
                )

    def extend_visibility(self, group: str, topic: str, key: str, offset: int, seconds: float) -> None:
        d = self.dialect
        until, params = d.now_plus(seconds)
        self._execute(
            f"UPDATE queue_delivery_state SET invisible_until = {until} WHERE consumer_group = %s AND topic = %s "
            "AND partition_key = %s AND message_offset = %s AND acked = FALSE",
            [*params, group, topic, key, offset],
        )

    def release_deliveries(self, group: str, topic: str, keys: Sequence[tuple[str, int]]) -> None:
        """Hand undelivered in-flight messages back (shutdown): due now, attempt not counted."""
        if not keys:
            return
        match, match_params = _match_offsets(keys)
        self._execute(
            f"UPDATE queue_delivery_state SET status = CASE WHEN retry_count > 0 THEN {RETRY} ELSE {SCHEDULED} END, "
            "retry_count = CASE WHEN retry_count > 0 THEN retry_count - 1 ELSE 0 END, "
            f"invisible_until = {self.dialect.now_sql} "
            f"WHERE consumer_group = %s AND topic = %s AND acked = FALSE AND status = {IN_FLIGHT} AND {match}",
            [group, topic, *match_params],
        )

    # -- outcomes ------------------------------------------------------------------------

    def nack(self, group: str, topic: str, delays: Sequence[tuple[str, int, float]]) -> None:
        """Make messages invisible for their retry delay (status RETRY)."""
        d = self.dialect
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            for key, offset, delay in sorted(delays):
                until, params = d.now_plus(delay)
                cursor.execute(
                    f"UPDATE queue_delivery_state SET status = {RETRY}, invisible_until = {until} "
                    "WHERE consumer_group = %s AND topic = %s AND partition_key = %s AND message_offset = %s "
                    "AND acked = FALSE",
                    [*params, group, topic, key, offset],
                )

    def ack(self, group: str, topic: str, keys: Sequence[tuple[str, int]]) -> None:
        """Mark messages acked for ``group`` (one statement)."""
        if not keys:
            return
        match, match_params = _match_offsets(keys)
        self._execute(
            f"UPDATE queue_delivery_state SET acked = TRUE WHERE consumer_group = %s AND topic = %s AND {match}",
            [group, topic, *match_params],
        )

    def ack_contiguous(self, group: str, topic: str, advances: Sequence[tuple[str, int, int]]) -> list[str]:
        """The happy path: for each (key, watermark, new_watermark) whose acks are exactly
        watermark+1..new_watermark, move the watermark and drop the rows behind it in one
        transaction, instead of flagging each row acked and advancing later.

        The watermark update is a compare-and-set on the old value; a partition whose
        watermark moved meanwhile is returned, and its acks must go through :meth:`ack`.
        """
        d = self.dialect
        failed: list[str] = []
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            for key, old, new in sorted(advances):
                cursor.execute(
                    f"UPDATE queue_offsets SET offset_acked = %s, updated_at = {d.now_sql} "
                    "WHERE consumer_group = %s AND topic = %s AND partition_key = %s AND offset_acked = %s",
                    [new, group, topic, key, old],
                )
                if cursor.rowcount != 1:
                    failed.append(key)
                    continue
                cursor.execute(
                    "DELETE FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
                    "AND partition_key = %s AND message_offset <= %s",
                    [group, topic, key, new],
                )
        return failed

    def advance_watermark(self, group: str, topic: str, key: str, watermark: int) -> int:
        """Move the watermark over contiguous acked rows; return the new watermark.

        Offsets above the oldest retained message are dense (GC deletes only from the
        bottom), so the walk needs only delivery-state rows: it stops at the first
        unacked row or the first offset without a row (not delivered yet). It starts no
        lower than just below the oldest retained message: offsets garbage-collected
        meanwhile are gone for every group (a group that started while GC ran may sit
        below them). Rows behind the new watermark are deleted in the same transaction.
        Bounded per call; converges over polls.
        """
        o = self.dialect.qn("offset")
        ((oldest, head),) = self._fetchall(
            f"SELECT (SELECT m.{o} FROM queue_messages m WHERE m.topic = p.topic "
            f"AND m.partition_key = p.partition_key ORDER BY m.{o} LIMIT 1), p.head_offset FROM queue_partitions p "
            "WHERE p.topic = %s AND p.partition_key = %s",
            [topic, key],
        )
        start = max(watermark, (int(head) if oldest is None else int(oldest) - 1))
        rows = self._fetchall(
            "SELECT message_offset, acked FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
            f"AND partition_key = %s AND message_offset > %s ORDER BY message_offset LIMIT {ADVANCE_SCAN}",
            [group, topic, key, start],
        )
        new = start
        for offset, acked in rows:
            if offset != new + 1 or not acked:
                break
            new = offset
        if new == watermark:
            return watermark
        if self.ack_contiguous(group, topic, [(key, watermark, new)]):
            return watermark
        return new

    def dead_letter(
        self,
        group: str,
        topic: str,
        message: FetchedMessage,
        *,
        dlq_topic: str,
        attempts: int,
        error: str,
    ) -> None:
        """Copy the message to the dead-letter topic and ack it for ``group``, atomically.

        The copy is published first and both writes commit together, so the message is
        never in zero places. The original stays in the log: other consumer groups still
        get it, and GC removes it once every group is past it. The copy's id is
        ``<group>:<original id>``, so two groups' dead letters of one message do not
        collide; its metadata names the group and the original position.
        """
        from .publisher import write_dead_letter

        with transaction.atomic(using=self.using):
            write_dead_letter(
                dlq_topic,
                partition_key=message.partition_key,
                id=f"{group}:{message.id}",
                payload=message.payload,
                metadata={
                    **(message.metadata or {}),
                    "dead_letter": {
                        "consumer_group": group,
                        "original_offset": message.offset,
                        "original_id": message.id,
                    },
                },
                created_at=message.created_at,
                failure_count=attempts,
                last_error=error,
                original_topic=topic,
                using=self.using,
            )
            self._execute(
                "UPDATE queue_delivery_state SET acked = TRUE WHERE consumer_group = %s AND topic = %s "
                "AND partition_key = %s AND message_offset = %s",
                [group, topic, message.partition_key, message.offset],
            )

    # -- garbage collection ---------------------------------------------------------------

    def consuming_groups(self, topic: str) -> set[str]:
        """Groups that consume ``topic``: with a watermark row or a subscriber heartbeat."""
        rows = self._fetchall(
            "SELECT consumer_group FROM queue_offsets WHERE topic = %s UNION "
            "SELECT consumer_group FROM queue_subscriber_heartbeats WHERE topic = %s",
            [topic, topic],
        )
        return {r[0] for r in rows}

    def collect_garbage(self, topic: str, keys: Sequence[str] | None, retention: float) -> int:
        """Delete messages every consuming group has acked (and older than ``retention``).

        For each partition the floor is the minimum ``offset_acked`` over every group
        that consumes the topic, a group without a watermark row counting as 0. Nothing
        above any group's watermark is ever deleted; a topic nobody consumes keeps all.
        """
        groups = self.consuming_groups(topic)
        if not groups:
            return 0
        params: list[Any] = [topic]
        sql = "SELECT partition_key, consumer_group, offset_acked FROM queue_offsets WHERE topic = %s"
        if keys is not None:
            if not keys:
                return 0
            sql += f" AND partition_key IN ({', '.join(['%s'] * len(keys))})"
            params += list(keys)
        marks: dict[str, dict[str, int]] = {}
        for key, group, acked in self._fetchall(sql, params):
            marks.setdefault(key, {})[group] = int(acked)
        d = self.dialect
        o = d.qn("offset")
        deleted = 0
        for key in sorted(marks):
            floor = min(marks[key].get(group, 0) for group in groups)
            if floor <= 0:
                continue
            sql = f"DELETE FROM queue_messages WHERE topic = %s AND partition_key = %s AND {o} <= %s"
            params = [topic, key, floor]
            if retention > 0:
                cutoff, cutoff_params = d.now_minus(retention)
                sql += f" AND published_at <= {cutoff}"
                params += cutoff_params
            deleted += self._execute(sql, params)
        return deleted
