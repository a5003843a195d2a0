"""Fetching and recording deliveries (before any handler runs); the poll state that
precedes them is ``polling.py``'s."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ...rules.dlq import UNDECODABLE_KEY
from ..dialects import Dialect
from .base import IN_FLIGHT, RETRY, SCHEDULED, StoreBase

#: Partitions per fetch statement (two UNION ALL branches each).
FETCH_CHUNK = 100


@dataclass(frozen=True)
class FetchPlan:
    partition: int
    #: Fetch never-delivered messages above this offset (None: no fresh fetch).
    fresh_after: int | None
    #: Fetch unacked messages whose invisibility has ended.
    due: bool


@dataclass
class FetchedMessage:
    partition: int
    offset: int
    key: str
    id: str
    payload: Any
    metadata: dict[str, Any]
    created_at: dt.datetime
    deliver_at: dt.datetime
    #: None for a message never delivered to this group (no delivery-state row).
    retry_count: int | None
    status: int | None
    #: Why the row could not be decoded (None: it could). Such a row is dead-lettered
    #: without calling the handler; the column that failed holds
    #: ``{UNDECODABLE_KEY: <the column's text as stored>}`` (see :func:`decode_columns`).
    undecodable: str | None = None


def _column_text(value: Any) -> str:
    """The stored text of a JSON column, for a dead letter (bytes decoded leniently)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else json.dumps(value, default=str)


def decode_columns(d: Dialect, payload: Any, metadata: Any) -> tuple[Any, dict[str, Any], str | None]:
    """Decode one row's payload and metadata; return (payload, metadata, error or None).

    ``publish()`` only ever stores JSON it encoded itself, with an object as metadata, but
    another program (or a hand-written UPDATE) can store what Python cannot read: text
    that is not JSON where the database does not check it (a MariaDB or SQLite table
    whose CHECK was bypassed), an integer of more than ``sys.get_int_max_str_digits()``
    digits (valid JSON everywhere, refused by Python), JSON nested deeper than Python
    recurses, or metadata that is not an object. Such a row must not fail the whole
    fetch -- that would stall every partition of the poll forever -- so each column
    is decoded on its own: a column that fails is replaced by ``{UNDECODABLE_KEY: text}``
    (the stored text, kept for the dead letter) and the error names the column and why.
    """
    errors: list[str] = []
    try:
        payload_value = d.load_json(payload)
    except (ValueError, RecursionError, TypeError) as exc:
        errors.append(f"payload could not be decoded as JSON ({type(exc).__name__}: {_first_line(exc)})")
        payload_value = {UNDECODABLE_KEY: _column_text(payload)}
    try:
        metadata_value = d.load_json(metadata)
    except (ValueError, RecursionError, TypeError) as exc:
        errors.append(f"metadata could not be decoded as JSON ({type(exc).__name__}: {_first_line(exc)})")
        metadata_value = {UNDECODABLE_KEY: _column_text(metadata)}
    else:
        if not isinstance(metadata_value, dict):
            errors.append(f"metadata is not a JSON object (a JSON {_json_kind(metadata_value)})")
            metadata_value = {UNDECODABLE_KEY: _column_text(metadata)}
    if not errors:
        return payload_value, metadata_value, None
    return payload_value, metadata_value, "undecodable row: " + "; ".join(errors)


def _first_line(exc: BaseException) -> str:
    text = str(exc).split("\n", 1)[0]
    return text if len(text) <= 200 else text[:200] + "..."


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__


class DeliveryStore(StoreBase):
    def newest_seqs(self, topics: Sequence[str]) -> list[int | None]:
        """The probe: the newest committed insertion number (``seq``) of each topic, in one
        statement, one dive into the (topic, seq) index per topic.

        A worker looks with it between full polls (``cadence.py``): when it is unchanged,
        nothing was published to the topic since the last look, and the full poll, whose
        many subqueries cost a MySQL server about ten times as much to parse and plan, is
        skipped. A scalar subquery per topic, not ``GROUP BY topic``: PostgreSQL has no
        loose index scan and would read every index entry of the topics.
        """
        parts = ", ".join(["(SELECT MAX(seq) FROM queue_messages WHERE topic = %s)"] * len(topics))
        (row,) = self._fetchall(f"SELECT {parts}", list(topics))
        return [None if v is None else int(v) for v in row]

    def fetch(self, group: str, topic: str, plans: Sequence[FetchPlan], limit: int) -> list[FetchedMessage]:
        """Fetch up to ``limit`` candidates per partition, in one statement per chunk.

        Two branches per partition, so a nacked or in-flight message never hides the
        deliverable ones behind it (the RFC's ``offset > watermark LIMIT n`` does):

        - fresh: never-delivered messages above every delivered offset -- a range read
          of the (topic, partition, offset) index;
        - due: unacked delivery rows whose invisibility ended (nacked, expired, parked
          delayed messages), through the ``queue_delivery_due`` index.

        However many acked or in-flight rows lie between the watermark and them, neither
        branch reads them. Unsequenced messages (NULL offset) never match ``offset > n``.

        Each row is decoded on its own (:func:`decode_columns`): a row that cannot be
        decoded comes back with ``undecodable`` set instead of failing the fetch.
        """
        d, P, OFF = self.dialect, self.P, self.OFF
        cols = f"m.{P}, m.{OFF}, m.{d.qn('key')}, m.id, m.payload, m.metadata, m.created_at, m.deliver_at"
        result: list[FetchedMessage] = []
        for start in range(0, len(plans), FETCH_CHUNK):
            branches: list[str] = []
            params: list[Any] = []
            for plan in plans[start : start + FETCH_CHUNK]:
                if plan.fresh_after is not None:
                    branches.append(
                        d.union_branch(
                            f"SELECT {cols}, -1 AS retry_count, -1 AS status FROM queue_messages m "
                            f"WHERE m.topic = %s AND m.{P} = %s AND m.{OFF} > %s ORDER BY m.{OFF} LIMIT {int(limit)}",
                            len(branches),
                        )
                    )
                    params += [topic, plan.partition, plan.fresh_after]
                if plan.due:
                    branches.append(
                        d.union_branch(
                            f"SELECT {cols}, d.retry_count, d.status FROM queue_delivery_state d "
                            f"JOIN queue_messages m ON m.topic = d.topic AND m.{P} = d.{P} "
                            f"AND m.{OFF} = d.message_offset "
                            f"WHERE d.consumer_group = %s AND d.topic = %s AND d.{P} = %s AND d.acked = FALSE "
                            f"AND d.invisible_until <= {d.now_sql} ORDER BY d.message_offset LIMIT {int(limit)}",
                            len(branches),
                        )
                    )
                    params += [group, topic, plan.partition]
            if not branches:
                continue
            for r in self._fetchall_hot(" UNION ALL ".join(branches), params):
                payload, metadata, undecodable = decode_columns(d, r[4], r[5])
                result.append(
                    FetchedMessage(
                        partition=int(r[0]),
                        offset=int(r[1]),
                        key=r[2],
                        id=r[3],
                        payload=payload,
                        metadata=metadata,
                        created_at=d.to_datetime(r[6]),
                        deliver_at=d.to_datetime(r[7]),
                        # -1 marks the fresh branch (a typed NULL is not portable in UNION).
                        retry_count=None if r[8] == -1 else int(r[8]),
                        status=None if r[9] == -1 else int(r[9]),
                        undecodable=undecodable,
                    )
                )
        return result

    def mark_delivered(
        self,
        group: str,
        topic: str,
        name: str,
        fresh: Sequence[FetchedMessage],
        redelivered: Sequence[FetchedMessage],
        parked: Sequence[FetchedMessage],
        visibility_timeout: float,
    ) -> set[int]:
        """Record deliveries before the handlers run (one transaction); return the partitions recorded.

        ``fresh`` messages get a new row (in flight, retry_count 0); ``redelivered`` rows
        are set in flight again and count a retry unless they were only parked
        (SCHEDULED); ``parked`` are delayed messages the fresh fetch passed over: they get
        a SCHEDULED row that becomes due at their ``deliver_at``. Only partitions whose
        lease ``name`` still holds are written (see ``lock_held``): the caller must not
        deliver messages of the others.
        """
        d, P = self.dialect, self.P
        until, until_params = d.now_plus(visibility_timeout)
        # The same for every row: the microseconds (an int we computed) go in as a literal.
        until_literal = until.replace("%s", str(int(until_params[0])))
        conflict = d.on_conflict_ignore(["consumer_group", "topic", "partition", "message_offset"], "acked")
        partitions = {m.partition for m in (*fresh, *redelivered, *parked)}
        if fresh and not redelivered and not parked and d.writable_ctes and self.connection.get_autocommit():
            return self._mark_fresh(group, topic, name, fresh, sorted(partitions), until_literal, conflict)
        with self.transaction() as cursor:
            held = self.lock_held(cursor, group, topic, name, sorted(partitions))
            rows: list[str] = []
            params: list[Any] = []
            for m in sorted(fresh, key=lambda m: (m.partition, m.offset)):
                if m.partition in held:
                    rows.append(f"(%s, %s, %s, %s, FALSE, {until_literal}, 0, {IN_FLIGHT})")
                    params += [group, topic, m.partition, m.offset]
            for m in sorted(parked, key=lambda m: (m.partition, m.offset)):
                if m.partition in held:
                    rows.append(f"(%s, %s, %s, %s, FALSE, {d.datetime_placeholder}, 0, {SCHEDULED})")
                    params += [group, topic, m.partition, m.offset, d.adapt_datetime(m.deliver_at)]
            if rows:
                # A row that exists already (a racing former lease holder) is left alone:
                # at-least-once allows the duplicate delivery.
                cursor.execute(
                    f"INSERT INTO queue_delivery_state (consumer_group, topic, {P}, message_offset, acked, "
                    f"invisible_until, retry_count, status) VALUES {', '.join(rows)} {conflict}",
                    params,
                )
            again = [(m.partition, m.offset) for m in redelivered if m.partition in held]
            if again:
                match, match_params = self.match_offsets(again)
                # retry_count is assigned before status: MySQL evaluates SET left to right.
                cursor.execute(
                    "UPDATE queue_delivery_state SET "
                    f"retry_count = retry_count + CASE WHEN status = {SCHEDULED} THEN 0 ELSE 1 END, "
                    f"status = {IN_FLIGHT}, invisible_until = {until} "
                    f"WHERE consumer_group = %s AND topic = %s AND acked = FALSE AND {match}",
                    [*until_params, group, topic, *match_params],
                )
        return held

    def _mark_fresh(
        self,
        group: str,
        topic: str,
        name: str,
        fresh: Sequence[FetchedMessage],
        partitions: list[int],
        until: str,
        conflict: str,
    ) -> set[int]:
        """:meth:`mark_delivered` of fresh messages only, as one autocommitted statement
        (PostgreSQL's data-modifying WITH): the lease rows are share-locked (``held``, the
        fence of :meth:`lock_held`) and the rows of the partitions still held inserted, in
        the same transaction. One round trip instead of four (BEGIN, fence, INSERT, COMMIT)."""
        P = self.P
        held, held_params = self.held_leases(group, topic, name, partitions, as_array=True)
        ordered = sorted(fresh, key=lambda m: (m.partition, m.offset))
        # unnest() of two array parameters, not a VALUES list: one prepared statement for
        # every batch size.
        rows = self._fetchall_hot(
            f"WITH held AS ({held}), "
            f"recorded AS (INSERT INTO queue_delivery_state (consumer_group, topic, {P}, message_offset, acked, "
            f"invisible_until, retry_count, status) SELECT %s, %s, v.p, v.o, FALSE, {until}, 0, {IN_FLIGHT} "
            f"FROM unnest(%s::bigint[], %s::bigint[]) AS v(p, o) WHERE v.p IN (SELECT {P} FROM held) "
            f"ORDER BY v.p, v.o {conflict}) "
            f"SELECT {P}{self.relaxed_commit()} FROM held",
            [*held_params, group, topic, [m.partition for m in ordered], [m.offset for m in ordered]],
        )
        return {int(row[0]) for row in rows}

    def extend_visibility(self, group: str, topic: str, name: str, partition: int, offset: int, seconds: float) -> bool:
        """Push an unacked delivery's ``invisible_until`` to now + ``seconds``.

        Fenced by the lease like every delivery write (``lock_held``): a worker that lost
        the partition must not keep the new holder's redelivery away. Returns False
        (nothing written) when ``name`` no longer holds the partition.
        """
        d, P = self.dialect, self.P
        until, params = d.now_plus(seconds)
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            if not self.lock_held(cursor, group, topic, name, [partition]):
                return False
            cursor.execute(
                f"UPDATE queue_delivery_state SET invisible_until = {until} WHERE consumer_group = %s "
                f"AND topic = %s AND {P} = %s AND message_offset = %s AND acked = FALSE",
                [*params, group, topic, partition, offset],
            )
        return True

    def release_deliveries(self, group: str, topic: str, name: str, keys: Sequence[tuple[int, int]]) -> None:
        """Hand undelivered in-flight messages back (shutdown): due now, attempt not counted."""
        if not keys:
            return
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            held = self.lock_held(cursor, group, topic, name, sorted({p for p, _ in keys}))
            keys = [k for k in keys if k[0] in held]
            if not keys:
                return
            match, match_params = self.match_offsets(keys)
            cursor.execute(
                f"UPDATE queue_delivery_state SET status = CASE WHEN retry_count > 0 THEN {RETRY} "
                f"ELSE {SCHEDULED} END, retry_count = CASE WHEN retry_count > 0 THEN retry_count - 1 ELSE 0 END, "
                f"invisible_until = {self.dialect.now_sql} "
                f"WHERE consumer_group = %s AND topic = %s AND acked = FALSE AND status = {IN_FLIGHT} AND {match}",
                [group, topic, *match_params],
            )
