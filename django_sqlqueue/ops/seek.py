"""Seek: rewind or fast-forward a consumer group's watermarks, with a preview.

Interplay with live workers. Kafka refuses to reset the offsets of a group with live
members; here an operator may act while workers run, because every write of a worker
to a partition's delivery state or watermark is fenced by its lease (see the engine,
``ENGINE-API.md``). An action that changes a group's positions in a partition deletes
that partition's ``queue_partition_leases`` row *first*, in the same transaction as the
change:

- a worker's fenced ack/nack/advance that runs concurrently waits for the row lock and
  then finds no lease: its late write is a no-op, so it cannot move a rewound watermark
  forward again (nothing the operator asked to redeliver is skipped) nor ack a message
  the operator just made deliverable again (no acked work resurrected);
- the former holder notices the lost lease at its next lease round (about a second)
  and drops the partition; a worker of the group takes it again and starts from the new
  watermark.

A handler still running when the lease goes finishes its message; that message is
then delivered again (at-least-once), which the preview counts among the redeliveries
when it lies above the new watermark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import transaction

from ..dialects.console import for_update
from ..validation import validate_group, validate_topic
from . import _db
from ._db import NotFound, OperationError
from .groups import heads

POSITIONS = ("earliest", "latest")


@dataclass(frozen=True)
class SeekPartition:
    partition: int
    head: int
    watermark: int
    target: int
    #: Messages that will be delivered again (rewind), or skipped (fast-forward).
    redeliver: int
    skip: int


@dataclass(frozen=True)
class SeekPlan:
    group: str
    topic: str
    #: "offset", "time", "earliest" or "latest".
    mode: str
    value: str
    partitions: list[SeekPartition] = field(default_factory=list)
    applied: bool = False
    leases_released: int = 0

    @property
    def redeliver(self) -> int:
        return sum(p.redeliver for p in self.partitions)

    @property
    def skip(self) -> int:
        return sum(p.skip for p in self.partitions)

    def describe(self) -> str:
        return (
            f"seek {self.group} on {self.topic} to {self.mode} {self.value}".rstrip()
            + f": {len(self.partitions)} partition(s), {self.redeliver} message(s) redelivered, {self.skip} skipped"
        )


def _seek_args(offset: int | None, time: dt.datetime | None, position: str | None) -> tuple[str, str]:
    given = [x is not None for x in (offset, time, position)]
    if sum(given) != 1:
        raise OperationError("seek needs exactly one of: an offset, a time, or a position (earliest/latest).")
    if offset is not None:
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OperationError(f"offset must be an integer >= 0, got {offset!r}.")
        return "offset", str(offset)
    if time is not None:
        if not isinstance(time, dt.datetime) or time.tzinfo is None:
            raise OperationError(f"time must be an aware datetime, got {time!r}.")
        return "time", time.astimezone(dt.UTC).isoformat()
    if position not in POSITIONS:
        raise OperationError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}.")
    return str(position), ""


def _target(
    topic: str, part: int, head: int, mode: str, offset: int | None, time: dt.datetime | None, using: str
) -> int:
    p, o = _db.qn("partition", using), _db.qn("offset", using)
    if mode == "latest":
        return head
    if mode == "offset":
        assert offset is not None
        if offset > head:
            raise OperationError(
                f"offset {offset} is beyond the head of {topic}[{part}] ({head}); nothing was changed."
            )
        return offset
    sql = f"SELECT MIN({o}) FROM queue_messages WHERE topic = %s AND {p} = %s AND {o} IS NOT NULL"
    params: list[object] = [topic, part]
    if mode == "time":
        # No index on published_at: this reads the partition's rows (an operator action, not a hot path).
        sql += " AND published_at >= %s"
        params.append(_db.dialect(using).adapt_datetime(time))
    ((first,),) = _db.fetchall(sql, params, using)
    return head if first is None else max(0, int(first) - 1)


def _count_messages(topic: str, part: int, low: int, high: int, using: str) -> int:
    p, o = _db.qn("partition", using), _db.qn("offset", using)
    ((n,),) = _db.fetchall(
        f"SELECT COUNT(*) FROM queue_messages WHERE topic = %s AND {p} = %s AND {o} > %s AND {o} <= %s",
        [topic, part, low, high],
        using,
    )
    return int(n)


def _count_acked(group: str, topic: str, part: int, low: int, high: int | None, using: str) -> int:
    p = _db.qn("partition", using)
    sql = (
        f"SELECT COUNT(*) FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s AND {p} = %s "
        "AND acked = %s AND message_offset > %s"
    )
    params: list[object] = [group, topic, part, True, low]
    if high is not None:
        sql += " AND message_offset <= %s"
        params.append(high)
    ((n,),) = _db.fetchall(sql, params, using)
    return int(n)


def _plan(
    group: str,
    topic: str,
    *,
    offset: int | None,
    time: dt.datetime | None,
    position: str | None,
    partitions: Iterable[int] | None,
    using: str,
    lock: bool = False,
) -> SeekPlan:
    validate_group(group)
    validate_topic(topic, max_length=10_000)
    mode, value = _seek_args(offset, time, position)
    p = _db.qn("partition", using)
    topic_heads = {part: head for (_, part), head in heads(topic, using).items()}
    wm = {
        int(part): int(acked)
        for part, acked in _db.fetchall(
            f"SELECT {p}, offset_acked FROM queue_offsets WHERE consumer_group = %s AND topic = %s ORDER BY {p}"
            + (for_update(_db.connection(using)) if lock else ""),
            [group, topic],
            using,
        )
    }
    known = sorted(set(topic_heads) | set(wm))
    if not known:
        raise NotFound(
            f"topic {topic!r} has no partitions yet (no message was sequenced and {group!r} has no offsets)."
        )
    chosen = known if partitions is None else sorted(set(partitions))
    missing = [x for x in chosen if x not in known]
    if missing:
        raise NotFound(
            f"topic {topic!r} has no partition {', '.join(map(str, missing))} (known: {known[0]}..{known[-1]})."
        )
    rows = []
    for part in chosen:
        head, mark = topic_heads.get(part, 0), wm.get(part, 0)
        target = _target(topic, part, max(head, mark), mode, offset, time, using)
        if target < mark:
            redeliver = _count_messages(topic, part, target, mark, using) + _count_acked(
                group, topic, part, mark, None, using
            )
            skip = 0
        elif target > mark:
            redeliver = 0
            skip = _count_messages(topic, part, mark, target, using) - _count_acked(
                group, topic, part, mark, target, using
            )
        else:
            redeliver = skip = 0
        rows.append(SeekPartition(part, head, mark, target, redeliver, max(0, skip)))
    return SeekPlan(group, topic, mode, value, rows)


def plan_seek(
    group: str,
    topic: str,
    *,
    offset: int | None = None,
    time: dt.datetime | None = None,
    position: str | None = None,
    partitions: Iterable[int] | None = None,
    using: str | None = None,
) -> SeekPlan:
    """Preview a seek: per partition the new watermark and how many messages it redelivers or skips.

    Exactly one of ``offset`` (the new watermark: the next delivered message is
    ``offset + 1``), ``time`` (the first message published at or after it is delivered
    next) or ``position`` (``"earliest"``: everything still in the log again;
    ``"latest"``: skip to the head). Writes nothing.
    """
    return _plan(
        group, topic, offset=offset, time=time, position=position, partitions=partitions, using=_db.alias(using)
    )


def seek(
    group: str,
    topic: str,
    *,
    offset: int | None = None,
    time: dt.datetime | None = None,
    position: str | None = None,
    partitions: Iterable[int] | None = None,
    using: str | None = None,
) -> SeekPlan:
    """Move ``group``'s watermarks on ``topic`` (see :func:`plan_seek`), safely with live workers.

    One transaction: (1) delete the partitions' leases -- the fence, see the module
    docstring; (2) lock the group's offset rows and compute the plan again from them;
    (3) rewind: delete the partition's delivery state, so every message above the new
    watermark is delivered again, acked or not; fast-forward: delete the delivery
    state at or below the new watermark and keep it above (acked stays acked, a retry
    keeps its count); (4) write the watermark. Returns the plan as applied.
    """
    using = _db.alias(using)
    p = _db.qn("partition", using)
    d = _db.dialect(using)
    with transaction.atomic(using=using):
        preview = _plan(group, topic, offset=offset, time=time, position=position, partitions=partitions, using=using)
        chosen = [x.partition for x in preview.partitions]
        released = _db.execute(
            "DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            f"AND {p} IN ({_db.in_list(chosen)})",
            [group, topic, *chosen],
            using,
        )
        plan = _plan(
            group, topic, offset=offset, time=time, position=position, partitions=chosen, using=using, lock=True
        )
        for row in plan.partitions:
            if row.target == row.watermark:
                continue
            sql = f"DELETE FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s AND {p} = %s"
            params: list[object] = [group, topic, row.partition]
            if row.target > row.watermark:
                sql += " AND message_offset <= %s"
                params.append(row.target)
            _db.execute(sql, params, using)
            changed = _db.execute(
                f"UPDATE queue_offsets SET offset_acked = %s, updated_at = {d.now_sql} "
                f"WHERE consumer_group = %s AND topic = %s AND {p} = %s",
                [row.target, group, topic, row.partition],
                using,
            )
            if not changed:
                _db.execute(
                    f"INSERT INTO queue_offsets (consumer_group, topic, {p}, offset_acked, updated_at) "
                    f"VALUES (%s, %s, %s, %s, {d.now_sql})",
                    [group, topic, row.partition, row.target],
                    using,
                )
    return SeekPlan(
        plan.group, plan.topic, plan.mode, plan.value, plan.partitions, applied=True, leases_released=released
    )
