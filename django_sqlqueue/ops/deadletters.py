"""Dead letters: list, detail, replay to the failing group only, purge.

Replay, in one transaction per batch:

1. lock the dead-letter rows (``SELECT ... FOR UPDATE`` by ``seq``) and DELETE them --
   the once-only guard: a second click, or a second operator, waits for the first
   transaction and then finds no row, so it replays nothing;
2. append a copy of each to its *original* topic: a new message (id
   ``<original id>@replay<dead-letter seq>``, never seen before, so idempotency cannot
   swallow it; it needs nothing of the original, which may have been garbage-collected),
   same key (hence same partition), payload and metadata, plus
   ``metadata["sqlqueue_replay"] = {"consumer_group": <the failing group>, ...}``.

Every group's workers read the copy; those of other groups ack it without calling
their handler (``django_sqlqueue.dlq.is_for_other_group``, the engine hook), so it
is delivered again to the failing group only. Should the copy fail again, it is
dead-lettered again as a new dead letter (its id differs), which can be replayed in
turn; the replay metadata keeps the first original id and counts the replays.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet

from ..conf import get_settings
from ..dlq import REPLAY_KEY
from ..models import Message
from ..publisher import write_messages
from ..tasks.replay import is_task_payload, prepare_replayed_task
from ..validation import PreparedMessage, encode_json
from . import _db
from ._db import NotFound, OperationError
from .topics import log_topics

DEFAULT_BATCH = 500


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    dlq_topic: str
    original_topic: str
    group: str
    id: str
    original_id: str
    key: str
    partition: int
    original_offset: int | None
    failure_count: int
    failed_at: dt.datetime | None
    created_at: dt.datetime
    last_error: str
    payload: Any
    metadata: dict[str, Any]

    @property
    def error_class(self) -> str:
        """``module.Class`` of the last error (the text before the first ``:``)."""
        head = _db.first_line(self.last_error)
        return head.split(":", 1)[0] if ":" in head else head[:100]

    @property
    def error_message(self) -> str:
        head = _db.first_line(self.last_error)
        return head.split(":", 1)[1].strip() if ":" in head else ""

    @property
    def replays(self) -> int:
        marker = self.metadata.get(REPLAY_KEY)
        return int(marker.get("replays", 0)) if isinstance(marker, dict) else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "dlq_topic": self.dlq_topic,
            "original_topic": self.original_topic,
            "group": self.group,
            "id": self.id,
            "original_id": self.original_id,
            "key": self.key,
            "partition": self.partition,
            "original_offset": self.original_offset,
            "failure_count": self.failure_count,
            "failed_at": self.failed_at.isoformat() if self.failed_at else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "error_class": self.error_class,
            "last_error": self.last_error,
            "payload": self.payload,
            "metadata": self.metadata,
        }


def _from_row(m: Message) -> DeadLetter:
    meta = m.metadata if isinstance(m.metadata, dict) else {}
    info: dict[str, Any] = meta.get("dead_letter") or {} if isinstance(meta.get("dead_letter"), dict) else {}
    group, _, rest = m.id.partition(":")
    marker: dict[str, Any] = meta.get(REPLAY_KEY) or {} if isinstance(meta.get(REPLAY_KEY), dict) else {}
    return DeadLetter(
        seq=m.seq,
        dlq_topic=m.topic,
        original_topic=m.original_topic,
        group=str(info.get("consumer_group") or group),
        id=m.id,
        original_id=str(marker.get("original_id") or info.get("original_id") or rest),
        key=m.key,
        partition=m.partition,
        original_offset=info.get("original_offset"),
        failure_count=m.failure_count,
        failed_at=m.failed_at,
        created_at=m.created_at,
        last_error=m.last_error,
        payload=m.payload,
        metadata=meta,
    )


@dataclass(frozen=True)
class DeadLetterFilter:
    #: The original topic (the dead letters live in ``<topic><DLQ_SUFFIX>``).
    topic: str | None = None
    group: str | None = None
    #: Exception class, ``module.Class`` or just ``Class``.
    error: str | None = None
    failed_after: dt.datetime | None = None
    failed_before: dt.datetime | None = None

    def as_query(self) -> dict[str, str]:
        out = {}
        for name in ("topic", "group", "error", "failed_after", "failed_before"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value.isoformat() if isinstance(value, dt.datetime) else str(value)
        return out

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.as_query().items()]
        return ", ".join(parts) or "all dead letters"


def dlq_topics(topic: str | None = None, using: str | None = None) -> list[str]:
    """Dead-letter topics to read: ``<topic><suffix>``, or every topic in the log ending with the suffix."""
    suffix = get_settings().DLQ_SUFFIX
    if topic:
        return [f"{topic}{suffix}"]
    return [t for t in log_topics(using) if t.endswith(suffix) and len(t) > len(suffix)]


def matching(f: DeadLetterFilter, using: str | None = None) -> QuerySet[Message]:
    """The dead letters matching ``f`` (rows of DLQ topics with ``original_topic`` set)."""
    using = _db.alias(using)
    qs = Message.objects.using(using).filter(topic__in=dlq_topics(f.topic, using)).exclude(original_topic="")
    if f.group:
        # Dead-letter ids are "<group>:<original id>": a range of the (topic, id) index.
        qs = qs.filter(id__startswith=f"{f.group}:")
    if f.error:
        qs = qs.filter(Q(last_error__startswith=f"{f.error}:") | Q(last_error__contains=f".{f.error}:"))
    if f.failed_after:
        qs = qs.filter(failed_at__gte=f.failed_after)
    if f.failed_before:
        qs = qs.filter(failed_at__lte=f.failed_before)
    return qs


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[DeadLetter] = field(default_factory=list)
    next_cursor: int | None = None


def list_dead_letters(
    f: DeadLetterFilter | None = None, *, cursor: int | None = None, limit: int = 50, using: str | None = None
) -> DeadLetterPage:
    """Newest dead letters first, ``limit`` per page, keyset-paginated by ``seq``."""
    qs = matching(f or DeadLetterFilter(), using)
    if cursor is not None:
        qs = qs.filter(seq__lt=cursor)
    rows = list(qs.order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    items = [_from_row(m) for m in rows[:limit]]
    return DeadLetterPage(items, items[-1].seq if more and items else None)


def count_dead_letters(f: DeadLetterFilter | None = None, using: str | None = None) -> int:
    """How many dead letters match (a count over the DLQ topics only, never the whole log)."""
    return matching(f or DeadLetterFilter(), using).count()


def get_dead_letter(seq: int, using: str | None = None) -> DeadLetter:
    try:
        m = Message.objects.using(_db.alias(using)).exclude(original_topic="").get(seq=int(seq))
    except (Message.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"no dead letter with seq {seq!r} (replayed or purged already?).") from None
    return _from_row(m)


def _seqs(seqs: Iterable[Any]) -> list[int]:
    try:
        out = sorted({int(s) for s in seqs})
    except (TypeError, ValueError) as exc:
        raise OperationError(f"dead-letter seqs must be integers, got {seqs!r}.") from exc
    if not out:
        raise OperationError("no dead letter selected.")
    return out


def _batches(seqs: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(seqs), size):
        yield seqs[start : start + size]


@dataclass(frozen=True)
class BulkResult:
    action: str
    #: Rows replayed/purged.
    done: int
    #: Selected rows that were gone when we came to them (replayed or purged by someone else).
    missing: int = 0
    by_group: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def describe(self) -> str:
        verb = {"replay": "replayed", "purge": "purged"}[self.action]
        text = f"{'would be ' if self.dry_run else ''}{verb} {self.done} dead letter(s)"
        if self.by_group:
            text += " (" + ", ".join(f"{g}: {n}" for g, n in sorted(self.by_group.items())) + ")"
        if self.missing:
            text += f"; {self.missing} were gone already (replayed or purged by someone else)"
        return text


def _replay_copy(dead: DeadLetter, actor: str) -> PreparedMessage:
    meta = {k: v for k, v in dead.metadata.items() if k not in ("dead_letter", REPLAY_KEY)}
    previous: dict[str, Any] = (
        dead.metadata.get(REPLAY_KEY) or {} if isinstance(dead.metadata.get(REPLAY_KEY), dict) else {}
    )
    meta[REPLAY_KEY] = {
        "consumer_group": dead.group,
        "dead_letter_seq": dead.seq,
        "dead_letter_id": dead.id,
        "original_id": dead.original_id,
        "original_offset": previous.get("original_offset", dead.original_offset),
        "original_partition": previous.get("original_partition", dead.partition),
        "failure_count": dead.failure_count,
        "last_error": _db.first_line(dead.last_error)[:500],
        "replayed_by": actor,
        "replays": int(previous.get("replays", 0)) + 1,
    }
    return PreparedMessage(
        key=dead.key,
        id=f"{dead.original_id}@replay{dead.seq}",
        payload_json=encode_json(dead.payload, "payload"),
        metadata_json=encode_json(meta, "metadata"),
        delay=None,
        deliver_at=None,
        explicit_id=True,
        created_at=None,
    )


def _locked(batch: list[int], using: str) -> list[Message]:
    """Lock the batch's dead-letter rows that still exist, in seq order (the once-only guard, step 1)."""
    return list(
        Message.objects.using(using)
        .select_for_update()
        .filter(seq__in=batch)
        .exclude(original_topic="")
        .order_by("seq")
    )


def _run(action: str, seqs: list[int], actor: str, batch_size: int, dry_run: bool, using: str) -> BulkResult:
    done = missing = 0
    by_group: dict[str, int] = {}
    for batch in _batches(seqs, batch_size):
        with transaction.atomic(using=using):
            rows = _locked(batch, using)
            missing += len(batch) - len(rows)
            if not rows:
                continue
            dead = [_from_row(m) for m in rows]
            for d in dead:
                by_group[d.group] = by_group.get(d.group, 0) + 1
            if dry_run:
                done += len(rows)
                transaction.set_rollback(True, using=using)
                continue
            # Step 2 of the guard: the DELETE of exactly the rows we locked.
            deleted, _ = Message.objects.using(using).filter(seq__in=[m.seq for m in rows]).delete()
            if deleted != len(rows):  # cannot happen while we hold the row locks
                raise OperationError(f"{action}: expected to delete {len(rows)} dead letters, deleted {deleted}.")
            if action == "replay":
                by_topic: dict[str, list[PreparedMessage]] = {}
                for d in dead:
                    if is_task_payload(d.original_topic, d.payload):
                        # A failed django.tasks task: the retry reports on the original result.
                        d = replace(d, payload=prepare_replayed_task(d.payload, d.original_id, using=using))
                    by_topic.setdefault(d.original_topic, []).append(_replay_copy(d, actor))
                for topic, copies in sorted(by_topic.items()):
                    write_messages(topic, copies, using=using, compare=False)
            done += len(rows)
    return BulkResult(action, done, missing, by_group, dry_run)


def replay(
    seqs: Iterable[Any],
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
) -> BulkResult:
    """Replay the dead letters with these ``seq`` s to the groups that failed them (see the module docstring)."""
    return _run("replay", _seqs(seqs), actor, batch_size, dry_run, _db.alias(using))


def purge(
    seqs: Iterable[Any],
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
) -> BulkResult:
    """Delete the dead letters with these ``seq`` s (same locking as replay, without the copy)."""
    return _run("purge", _seqs(seqs), actor, batch_size, dry_run, _db.alias(using))


def _matching_seqs(f: DeadLetterFilter, batch_size: int, using: str) -> Iterator[list[int]]:
    """Seqs of the dead letters matching ``f``, newest first, a batch at a time (keyset by seq)."""
    cursor = None
    while True:
        qs = matching(f, using)
        if cursor is not None:
            qs = qs.filter(seq__lt=cursor)
        batch = list(qs.order_by("-seq").values_list("seq", flat=True)[:batch_size])
        if not batch:
            return
        yield batch
        cursor = batch[-1]


def _run_matching(
    action: str, f: DeadLetterFilter, actor: str, batch_size: int, dry_run: bool, using: str | None
) -> BulkResult:
    using = _db.alias(using)
    total = BulkResult(action, 0, dry_run=dry_run)
    for batch in _matching_seqs(f, batch_size, using):
        r = _run(action, batch, actor, batch_size, dry_run, using)
        merged = dict(total.by_group)
        for g, n in r.by_group.items():
            merged[g] = merged.get(g, 0) + n
        total = BulkResult(action, total.done + r.done, total.missing + r.missing, merged, dry_run)
    return total


def replay_matching(
    f: DeadLetterFilter,
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
) -> BulkResult:
    """Replay every dead letter matching ``f``, in batches of ``batch_size`` (one transaction each)."""
    return _run_matching("replay", f, actor, batch_size, dry_run, using)


def purge_matching(
    f: DeadLetterFilter,
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
) -> BulkResult:
    """Purge every dead letter matching ``f``, in batches of ``batch_size`` (one transaction each)."""
    return _run_matching("purge", f, actor, batch_size, dry_run, using)


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
