"""Consumer groups: what they consume, their watermarks per partition, and dropping a retired one.

Seeking (rewind / fast-forward) is in ``ops/seek.py``, pausing in ``ops/pausing.py``.
Dropping a group deletes its leases first, in the same transaction, which is the same
fence a seek uses against live workers (see ``ops/seek.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from ..conf import get_settings
from ..validation import validate_group, validate_topic
from . import _db
from ._db import NotFound, OperationError

# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupTopic:
    """One group's consumption of one topic."""

    group: str
    topic: str
    partitions: int
    lag: int
    live_subscribers: int
    paused: bool
    last_ack_at: dt.datetime | None


def heads(topic: str | None = None, using: str | None = None) -> dict[tuple[str, int], int]:
    """``{(topic, partition): head_offset}`` from ``queue_partitions`` (the sequencer's head rows)."""
    p = _db.qn("partition", using)
    sql = f"SELECT topic, {p}, head_offset FROM queue_partitions"
    params: list[str] = []
    if topic is not None:
        sql += " WHERE topic = %s"
        params.append(topic)
    return {(t, int(part)): int(head) for t, part, head in _db.fetchall(sql, params, using)}


def live_cutoff_sql(using: str | None = None) -> tuple[str, list[int]]:
    """SQL for "now minus LEASE_DURATION": a heartbeat older than this is not live."""
    return _db.dialect(using).now_minus(get_settings().LEASE_DURATION)


def list_groups(group: str | None = None, topic: str | None = None, using: str | None = None) -> list[GroupTopic]:
    """Every (group, topic) with a watermark row, a subscriber or a pause, sorted."""
    p = _db.qn("partition", using)
    where, params = _filters(group, topic)
    marks: dict[tuple[str, str], dict[int, int]] = {}
    last_ack: dict[tuple[str, str], dt.datetime] = {}
    d = _db.dialect(using)
    for g, t, part, acked, updated in _db.fetchall(
        f"SELECT consumer_group, topic, {p}, offset_acked, updated_at FROM queue_offsets{where}", params, using
    ):
        marks.setdefault((g, t), {})[int(part)] = int(acked)
        updated = d.to_datetime(updated)
        if updated and (last_ack.get((g, t)) is None or updated > last_ack[(g, t)]):
            last_ack[(g, t)] = updated
    cutoff, cparams = live_cutoff_sql(using)
    live: dict[tuple[str, str], int] = {}
    for g, t, alive in _db.fetchall(
        "SELECT consumer_group, topic, SUM(CASE WHEN deregistered_at IS NULL AND heartbeat_at > "
        f"{cutoff} THEN 1 ELSE 0 END) FROM queue_subscriber_heartbeats{where} GROUP BY consumer_group, topic",
        [*cparams, *params],
        using,
    ):
        live[(g, t)] = int(alive or 0)
    paused = {
        (g, t) for g, t in _db.fetchall(f"SELECT consumer_group, topic FROM queue_paused_topics{where}", params, using)
    }
    all_heads = heads(topic, using)
    result = []
    for g, t in sorted(set(marks) | set(live) | paused):
        topic_heads = {part: head for (tt, part), head in all_heads.items() if tt == t}
        wm = marks.get((g, t), {})
        lag = sum(max(0, head - wm.get(part, 0)) for part, head in topic_heads.items())
        result.append(
            GroupTopic(
                g, t, len(set(topic_heads) | set(wm)), lag, live.get((g, t), 0), (g, t) in paused, last_ack.get((g, t))
            )
        )
    return result


def _filters(group: str | None, topic: str | None) -> tuple[str, list[str]]:
    conds, params = [], []
    if group is not None:
        conds.append("consumer_group = %s")
        params.append(group)
    if topic is not None:
        conds.append("topic = %s")
        params.append(topic)
    return (" WHERE " + " AND ".join(conds) if conds else ""), params


@dataclass(frozen=True)
class PartitionOffset:
    """A group's position in one partition."""

    partition: int
    head: int
    watermark: int
    in_flight: int
    retrying: int
    leased_by: str | None
    lease_renewed_at: dt.datetime | None
    lease_stale: bool

    @property
    def lag(self) -> int:
        return max(0, self.head - self.watermark)


def group_offsets(group: str, topic: str, using: str | None = None) -> list[PartitionOffset]:
    """Head, watermark, lag, deliveries and lease of each partition of ``topic`` for ``group``."""
    p = _db.qn("partition", using)
    d = _db.dialect(using)
    topic_heads = {part: head for (_, part), head in heads(topic, using).items()}
    wm = {
        int(part): int(acked)
        for part, acked in _db.fetchall(
            f"SELECT {p}, offset_acked FROM queue_offsets WHERE consumer_group = %s AND topic = %s",
            [group, topic],
            using,
        )
    }
    if not wm and not list_groups(group, topic, using):
        raise NotFound(f"consumer group {group!r} does not consume topic {topic!r}.")
    counts: dict[int, dict[int, int]] = {}
    for part, status, n in _db.fetchall(
        f"SELECT {p}, status, COUNT(*) FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
        f"AND acked = %s GROUP BY {p}, status",
        [group, topic, False],
        using,
    ):
        counts.setdefault(int(part), {})[int(status)] = int(n)
    cutoff, cparams = live_cutoff_sql(using)
    leases = {
        int(part): (holder, d.to_datetime(renewed), bool(stale))
        for part, holder, renewed, stale in _db.fetchall(
            f"SELECT {p}, leased_by, lease_renewed_at, CASE WHEN lease_renewed_at < {cutoff} THEN 1 ELSE 0 END "
            "FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s",
            [*cparams, group, topic],
            using,
        )
    }
    rows = []
    for part in sorted(set(topic_heads) | set(wm)):
        holder, renewed, stale = leases.get(part, (None, None, False))
        c = counts.get(part, {})
        rows.append(
            PartitionOffset(
                part, topic_heads.get(part, 0), wm.get(part, 0), c.get(1, 0), c.get(2, 0), holder, renewed, stale
            )
        )
    return rows


# -- drop ------------------------------------------------------------------------------

#: Tables a group's rows are deleted from, leases first (the fence).
GROUP_TABLES = (
    "queue_partition_leases",
    "queue_delivery_state",
    "queue_offsets",
    "queue_subscriber_heartbeats",
    "queue_paused_topics",
)


@dataclass(frozen=True)
class GroupDrop:
    group: str
    topic: str | None
    rows: dict[str, int]
    live_subscribers: int
    dry_run: bool = False

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def drop_group(
    group: str, *, topic: str | None = None, force: bool = False, dry_run: bool = False, using: str | None = None
) -> GroupDrop:
    """Forget a retired consumer group (or its consumption of one ``topic``) so GC can proceed.

    Deletes its leases, delivery state, watermarks, heartbeats and pause rows in one
    transaction. A group with a live subscriber (heartbeat within LEASE_DURATION) is
    refused unless ``force``: its workers would recreate the rows and start over from
    the oldest message still in the log. ``dry_run`` counts the rows only.
    """
    validate_group(group)
    if topic is not None:
        validate_topic(topic, max_length=10_000)
    using = _db.alias(using)
    where, params = _filters(group, topic)
    cutoff, cparams = live_cutoff_sql(using)
    ((live,),) = _db.fetchall(
        f"SELECT COUNT(*) FROM queue_subscriber_heartbeats{where} "
        f"AND deregistered_at IS NULL AND heartbeat_at > {cutoff}",
        [*params, *cparams],
        using,
    )
    live = int(live)
    counts = {
        table: int(_db.fetchall(f"SELECT COUNT(*) FROM {table}{where}", params, using)[0][0]) for table in GROUP_TABLES
    }
    if not any(counts.values()):
        raise NotFound(f"consumer group {group!r} has no rows" + (f" for topic {topic!r}." if topic else "."))
    if live and not force:
        raise OperationError(
            f"consumer group {group!r} has {live} live subscriber(s); stop its workers first "
            "(or force it: they would start over from the oldest message in the log). Nothing was deleted."
        )
    if dry_run:
        return GroupDrop(group, topic, counts, live, dry_run=True)
    with transaction.atomic(using=using):
        deleted = {table: _db.execute(f"DELETE FROM {table}{where}", params, using) for table in GROUP_TABLES}
    return GroupDrop(group, topic, deleted, live)


def parse_partitions(values: Sequence[str] | str | None) -> list[int] | None:
    """Parse "0,3,5" / ["0", "3"] into partition numbers; None/empty means all."""
    if values is None or values == "" or values == []:
        return None
    items = values.split(",") if isinstance(values, str) else [v for x in values for v in str(x).split(",")]
    try:
        return sorted({int(x) for x in items if x.strip() != ""}) or None
    except ValueError as exc:
        raise OperationError(f"partitions must be integers, got {values!r}.") from exc
