"""Partition leases and subscriber heartbeats; releasing a lease."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from . import _db
from ._db import NotFound
from .groups import live_cutoff_sql


@dataclass(frozen=True)
class Lease:
    group: str
    topic: str
    partition: int
    leased_by: str
    leased_at: dt.datetime | None
    renewed_at: dt.datetime | None
    #: Not renewed within LEASE_DURATION: its holder is gone or stuck.
    stale: bool


@dataclass(frozen=True)
class Subscriber:
    group: str
    topic: str
    name: str
    heartbeat_at: dt.datetime | None
    deregistered_at: dt.datetime | None
    live: bool

    @property
    def silent(self) -> bool:
        """Registered (not deregistered) but without a heartbeat within LEASE_DURATION."""
        return self.deregistered_at is None and not self.live


def list_leases(
    group: str | None = None, topic: str | None = None, *, stale_only: bool = False, using: str | None = None
) -> list[Lease]:
    p = _db.qn("partition", using)
    d = _db.dialect(using)
    cutoff, cparams = live_cutoff_sql(using)
    conds: list[str] = []
    params: list[Any] = []
    for column, value in (("consumer_group", group), ("topic", topic)):
        if value is not None:
            conds.append(f"{column} = %s")
            params.append(value)
    if stale_only:
        conds.append(f"lease_renewed_at < {cutoff}")
        params += cparams
    where = " WHERE " + " AND ".join(conds) if conds else ""
    return [
        Lease(g, t, int(part), by, d.to_datetime(at), d.to_datetime(renewed), bool(stale))
        for g, t, part, by, at, renewed, stale in _db.fetchall(
            f"SELECT consumer_group, topic, {p}, leased_by, leased_at, lease_renewed_at, "
            f"CASE WHEN lease_renewed_at < {cutoff} THEN 1 ELSE 0 END FROM queue_partition_leases{where} "
            f"ORDER BY consumer_group, topic, {p}",
            [*cparams, *params],
            using,
        )
    ]


def list_subscribers(group: str | None = None, topic: str | None = None, using: str | None = None) -> list[Subscriber]:
    d = _db.dialect(using)
    cutoff, cparams = live_cutoff_sql(using)
    conds, params = [], []
    for column, value in (("consumer_group", group), ("topic", topic)):
        if value is not None:
            conds.append(f"{column} = %s")
            params.append(value)
    where = " WHERE " + " AND ".join(conds) if conds else ""
    return [
        Subscriber(g, t, name, d.to_datetime(hb), d.to_datetime(gone), bool(live))
        for g, t, name, hb, gone, live in _db.fetchall(
            "SELECT consumer_group, topic, subscriber_name, heartbeat_at, deregistered_at, "
            f"CASE WHEN deregistered_at IS NULL AND heartbeat_at > {cutoff} THEN 1 ELSE 0 END "
            f"FROM queue_subscriber_heartbeats{where} ORDER BY consumer_group, topic, subscriber_name",
            [*cparams, *params],
            using,
        )
    ]


def release_lease(
    group: str, topic: str, partition: int, *, holder: str | None = None, using: str | None = None
) -> int:
    """Delete a partition's lease; return 1, or raise :class:`NotFound`.

    With ``holder`` only that subscriber's lease is deleted (the console passes the
    holder it showed, so a lease another subscriber took meanwhile is left alone). The
    holder's fenced writes to the partition become no-ops at once and it drops the
    partition at its next lease round; a subscriber of the group then takes it.
    """
    p = _db.qn("partition", using)
    sql = f"DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s AND {p} = %s"
    params: list[object] = [group, topic, int(partition)]
    if holder is not None:
        sql += " AND leased_by = %s"
        params.append(holder)
    deleted = _db.execute(sql, params, using)
    if not deleted:
        raise NotFound(
            f"no lease of {group}:{topic}[{partition}]"
            + (f" held by {holder!r}" if holder else "")
            + " (released already?)."
        )
    return deleted


@dataclass(frozen=True)
class Delivery:
    """A message a group is working on or will retry."""

    group: str
    topic: str
    partition: int
    offset: int
    status: str
    #: Deliveries so far minus one (the engine's ``retry_count``).
    retry_count: int
    #: In flight: when the visibility timeout ends; retrying: when it is due again.
    visible_at: dt.datetime | None
    message_id: str | None
    key: str | None
    #: The last failed attempt's error (type: message, then traceback), or None.
    last_error: str | None = None

    @property
    def error_summary(self) -> str:
        """The first line of ``last_error`` ("module.Class: message"), or ""."""
        return _db.first_line(self.last_error)


STATUS = {0: "scheduled", 1: "in flight", 2: "retrying"}


def list_deliveries(
    group: str | None = None,
    topic: str | None = None,
    *,
    status: str | None = None,
    limit: int = 200,
    using: str | None = None,
) -> list[Delivery]:
    """Unacked delivery state (in flight, retrying, scheduled), soonest visible first, with message ids.

    ``limit`` bounds the read; the join to the message uses its unique (topic,
    partition, offset) index.
    """
    p, o, k = _db.qn("partition", using), _db.qn("offset", using), _db.qn("key", using)
    d = _db.dialect(using)
    conds: list[str] = ["s.acked = %s"]
    params: list[Any] = [False]
    for column, value in (("s.consumer_group", group), ("s.topic", topic)):
        if value is not None:
            conds.append(f"{column} = %s")
            params.append(value)
    if status is not None:
        codes = [code for code, name in STATUS.items() if name == status]
        if not codes:
            raise NotFound(f"status must be one of {', '.join(STATUS.values())}, got {status!r}.")
        conds.append("s.status = %s")
        params.append(codes[0])
    rows = _db.fetchall(
        f"SELECT s.consumer_group, s.topic, s.{p}, s.message_offset, s.status, s.retry_count, s.invisible_until, "
        f"m.id, m.{k}, s.last_error FROM queue_delivery_state s LEFT JOIN queue_messages m ON m.topic = s.topic "
        f"AND m.{p} = s.{p} AND m.{o} = s.message_offset WHERE {' AND '.join(conds)} "
        f"ORDER BY s.invisible_until LIMIT {int(limit)}",
        params,
        using,
    )
    return [
        Delivery(g, t, int(part), int(off), STATUS.get(int(st), str(st)), int(rc), d.to_datetime(vis), mid, key, err)
        for g, t, part, off, st, rc, vis, mid, key, err in rows
    ]
