"""Seek: rewind or fast-forward a consumer group's watermarks, with a preview.

Interplay with live workers. Kafka refuses to reset the offsets of a group with live
members; here an operator may act while workers run, because every write of a worker
to a partition's delivery state or watermark is fenced by its lease (see
``StoreBase.lock_held`` and ``store/positions.py``). An action that changes a group's
positions in a partition deletes that partition's ``queue_partition_leases`` row
*first*, in the same transaction as the change:

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

from ..db.store import QueueStore
from ..rules.validation import validate_group, validate_topic
from .base import NotFound, OperationError, store, topic_alias

POSITIONS = ("earliest", "latest")
#: Unknown partitions an error names; it counts the rest ("and 299990 more"): a preview of
#: any number of partitions gets an error of a few lines, not one of megabytes.
NAMED_PARTITIONS = 10


@dataclass(frozen=True)
class SeekPartition:
    partition: int
    head: int
    watermark: int
    target: int
    #: Messages that will be delivered again (rewind), or skipped (fast-forward).
    redeliver: int
    skip: int
    #: False when the range moved was too long to count (``SeekReads.count_messages``): the
    #: figures are then its offsets, an upper bound (a purge may have removed some).
    exact: bool = True

    def shown(self) -> tuple[str, str]:
        """``redeliver`` and ``skip`` as an operator reads them ("up to N" when not exact)."""
        return _upto(self.redeliver, self.exact), _upto(self.skip, self.exact)


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
    #: The group had no watermark on the topic: the seek creates it.
    created: bool = False

    @property
    def redeliver(self) -> int:
        return sum(p.redeliver for p in self.partitions)

    @property
    def skip(self) -> int:
        return sum(p.skip for p in self.partitions)

    @property
    def exact(self) -> bool:
        return all(p.exact for p in self.partitions)

    def shown(self) -> tuple[str, str]:
        """``redeliver`` and ``skip`` as an operator reads them ("up to N" when not exact)."""
        return _upto(self.redeliver, self.exact), _upto(self.skip, self.exact)

    def describe(self) -> str:
        redeliver, skip = self.shown()
        text = (
            f"seek {self.group} on {self.topic} to {self.mode} {self.value}".rstrip()
            + f": {len(self.partitions)} partition(s), {redeliver} message(s) redelivered, {skip} skipped"
        )
        if self.created:
            verb = "is created" if self.applied else "will be created"
            text += (
                f"; group {self.group!r} had no watermarks on {self.topic!r} and {verb} at these positions "
                "(garbage collection keeps its messages from now on)"
            )
        return text


def _upto(n: int, exact: bool) -> str:
    return str(n) if exact or not n else f"up to {n}"


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
    s: QueueStore, topic: str, part: int, head: int, mode: str, offset: int | None, time: dt.datetime | None
) -> int:
    if mode == "latest":
        return head
    if mode == "offset":
        assert offset is not None
        if offset > head:
            raise OperationError(
                f"offset {offset} is beyond the head of {topic}[{part}] ({head}); nothing was changed."
            )
        return offset
    first = s.first_offset(topic, part, time if mode == "time" else None)
    return head if first is None else max(0, first - 1)


def _plan(
    s: QueueStore,
    group: str,
    topic: str,
    *,
    offset: int | None,
    time: dt.datetime | None,
    position: str | None,
    partitions: Iterable[int] | None,
    watermarks: dict[int, int] | None = None,
) -> SeekPlan:
    """Plan a seek from the current heads and ``watermarks`` (read here when not given)."""
    validate_group(group)
    validate_topic(topic, max_length=10_000)
    mode, value = _seek_args(offset, time, position)
    topic_heads = {part: head for (_, part), head in s.heads([topic]).items()}
    wm = s.group_watermarks(group, topic) if watermarks is None else watermarks
    known = sorted(set(topic_heads) | set(wm))
    if not known:
        raise NotFound(
            f"topic {topic!r} has no partitions yet (no message was sequenced and {group!r} has no offsets)."
        )
    chosen = known if partitions is None else sorted(set(partitions))
    known_set = set(known)
    missing = [x for x in chosen if x not in known_set]
    if missing:
        named = ", ".join(map(str, missing[:NAMED_PARTITIONS]))
        if len(missing) > NAMED_PARTITIONS:
            named += f" and {len(missing) - NAMED_PARTITIONS} more"
        raise NotFound(f"topic {topic!r} has no partition {named} (known: {known[0]}..{known[-1]}).")
    rows = []
    for part in chosen:
        head, mark = topic_heads.get(part, 0), wm.get(part, 0)
        target = _target(s, topic, part, max(head, mark), mode, offset, time)
        exact = True
        if target < mark:
            moved, exact = s.count_messages(topic, part, target, mark)
            redeliver, skip = moved + s.count_acked(group, topic, part, mark, None), 0
        elif target > mark:
            moved, exact = s.count_messages(topic, part, mark, target)
            redeliver, skip = 0, moved - s.count_acked(group, topic, part, mark, target)
        else:
            redeliver = skip = 0
        rows.append(SeekPartition(part, head, mark, target, redeliver, max(0, skip), exact))
    return SeekPlan(group, topic, mode, value, rows, created=not wm)


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
        store(topic_alias(topic, using)),
        group,
        topic,
        offset=offset,
        time=time,
        position=position,
        partitions=partitions,
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

    One transaction (:meth:`~django_sqlqueue.db.store.positions.PositionStore.seek_to`): (1)
    delete the partitions' leases -- the fence, see the module docstring; (2) lock the
    group's offset rows and compute the plan again from them; (3) rewind: delete the
    partition's delivery state, so every message above the new watermark is delivered
    again, acked or not; fast-forward: delete the delivery state at or below the new
    watermark and keep it above (acked stays acked, a retry keeps its count); (4) write
    the watermark. Returns the plan as applied.
    """
    s = store(topic_alias(topic, using))
    # A first plan, unlocked, validates the request and picks the partitions; the plan
    # applied is computed again from the locked watermark rows.
    preview = _plan(s, group, topic, offset=offset, time=time, position=position, partitions=partitions)
    chosen = [x.partition for x in preview.partitions]
    released, plan = s.seek_to(
        group,
        topic,
        chosen,
        lambda marks: _plan(
            s, group, topic, offset=offset, time=time, position=position, partitions=chosen, watermarks=marks
        ),
    )
    return SeekPlan(
        plan.group,
        plan.topic,
        plan.mode,
        plan.value,
        plan.partitions,
        applied=True,
        leases_released=released,
        created=plan.created,
    )
