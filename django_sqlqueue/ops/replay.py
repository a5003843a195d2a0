"""Replay and purge dead letters, in batches, each batch once only.

Replay, in one transaction per batch:

1. lock the dead-letter rows (``SELECT ... FOR UPDATE`` by ``seq``) and DELETE them --
   the once-only guard: a second click, or a second operator, waits for the first
   transaction and then finds no row, so it replays nothing;
2. append a copy of each to its *original* topic: a new message (id
   ``<original id>@replay<dead-letter seq>``, :func:`django_sqlqueue.rules.dlq.replay_id`,
   never seen before, so idempotency cannot swallow it; it needs nothing of the
   original, which may have been garbage-collected), same key (hence same partition),
   payload and metadata, plus ``metadata["sqlqueue_replay"] = {"consumer_group": <the
   failing group>, ...}`` (:func:`django_sqlqueue.rules.dlq.replay_metadata`).

Every group's workers read the copy; those of other groups ack it without calling
their handler (``django_sqlqueue.rules.dlq.is_for_other_group``, the engine hook), so it
is delivered again to the failing group only. Should the copy fail again, it is
dead-lettered again as a new dead letter (its id differs), which can be replayed in
turn; the replay metadata keeps the first original id and counts the replays.

An integration whose messages carry state outside the log (the tasks backend)
registers a replay hook (``dlq.register_replay_hook``); each copy's payload goes
through :func:`django_sqlqueue.rules.dlq.prepare_replay_payload`, inside the transaction.
Purge takes the same locks and deletes without copying.

**A copy that cannot be written undoes its batch.** The copy's id is reserved
(``publish()`` refuses ids holding ``@replay<digits>``), but a row written around
``publish()`` could still hold it, and the INSERT would then store nothing. The replay
checks that every copy was created; if one was not, it raises :class:`OperationError`
naming the dead letter and the id, and the batch's transaction rolls back: its dead
letters stay. (Batches committed before it stay replayed.)

**Sizes and audit.** ``batch_size`` is checked (1 to ``MAX_BATCH_SIZE``) before anything is
read or written. ``on_batch(result)``, if given, is called inside each batch's transaction
after its writes, with that batch's :class:`BulkResult` alone (never on a dry run and
never for a batch whose rows were all gone), so an audit row written there commits or
rolls back with the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import transaction

from ..db.store.messages import write_messages
from ..rules.dlq import prepare_replay_payload, replay_id, replay_metadata
from ..rules.limits import MAX_BATCH_SIZE, MAX_BIGINT
from ..rules.validation import PreparedMessage, encode_json
from .base import OperationError, alias, check_count, store, topic_alias
from .deadletters import DEFAULT_BATCH, DeadLetter, DeadLetterFilter, from_message, matching


def _seqs(seqs: Iterable[Any]) -> list[int]:
    try:
        out = sorted({int(s) for s in seqs})
    except (TypeError, ValueError) as exc:
        raise OperationError(f"dead-letter seqs must be integers, got {seqs!r}.") from exc
    if not out:
        raise OperationError("no dead letter selected.")
    if not -MAX_BIGINT <= out[0] <= out[-1] <= MAX_BIGINT:
        raise OperationError(f"dead-letter seqs must be at most {MAX_BIGINT}, got {out[-1]}.")
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
    """Return the copy that replays ``dead`` to the group that failed it (step 2 of the module docstring)."""
    meta = replay_metadata(
        dead.metadata,
        group=dead.group,
        dead_letter_seq=dead.seq,
        dead_letter_id=dead.id,
        original_id=dead.original_id,
        original_offset=dead.original_offset,
        original_partition=dead.partition,
        failure_count=dead.failure_count,
        last_error=dead.last_error,
        actor=actor,
    )
    return PreparedMessage(
        key=dead.key,
        id=replay_id(dead.original_id, dead.seq),
        payload_json=encode_json(dead.payload, "payload"),
        metadata_json=encode_json(meta, "metadata"),
        delay=None,
        deliver_at=None,
        explicit_id=True,
        created_at=None,
    )


#: ``on_batch(result of one batch)``: called inside each batch's transaction (see the module docstring).
OnBatch = Callable[[BulkResult], None]


def _run(
    action: str,
    seqs: list[int],
    actor: str,
    batch_size: int,
    dry_run: bool,
    using: str,
    on_batch: OnBatch | None = None,
    done_before: int = 0,
) -> BulkResult:
    dead_letters = store(using)
    done = missing = 0
    by_group: dict[str, int] = {}
    for batch in _batches(seqs, batch_size):
        with transaction.atomic(using=using):
            rows = dead_letters.lock_dead_letters(batch)
            missing += len(batch) - len(rows)
            if not rows:
                continue
            dead = [from_message(m) for m in rows]
            groups: dict[str, int] = {}
            for d in dead:
                groups[d.group] = groups.get(d.group, 0) + 1
            if dry_run:
                done += len(rows)
                _merge(by_group, groups)
                transaction.set_rollback(True, using=using)
                continue
            # Step 2 of the guard: the DELETE of exactly the rows we locked.
            deleted = dead_letters.delete_dead_letters(rows)
            if deleted != len(rows):  # cannot happen while we hold the row locks
                raise OperationError(f"{action}: expected to delete {len(rows)} dead letters, deleted {deleted}.")
            if action == "replay":
                _write_copies(dead, actor, using, replayed_before=done_before + done)
            if on_batch is not None:
                on_batch(BulkResult(action, len(rows), len(batch) - len(rows), groups))
            done += len(rows)
            _merge(by_group, groups)
    return BulkResult(action, done, missing, by_group, dry_run)


def _merge(into: dict[str, int], counts: dict[str, int]) -> None:
    for group, n in counts.items():
        into[group] = into.get(group, 0) + n


def _write_copies(dead: list[DeadLetter], actor: str, using: str, *, replayed_before: int) -> None:
    """Append the replay copies of ``dead`` (step 2); raise if one was not created (nothing of the batch commits)."""
    by_topic: dict[str, list[tuple[DeadLetter, PreparedMessage]]] = {}
    for d in dead:
        # Registered hooks (the tasks backend's) may rewrite the payload of their own messages.
        payload = prepare_replay_payload(d.original_topic, d.payload, d.metadata, d.original_id, using)
        by_topic.setdefault(d.original_topic, []).append((d, _replay_copy(replace(d, payload=payload), actor)))
    for topic, pairs in sorted(by_topic.items()):
        written = write_messages(topic, [copy for _, copy in pairs], using=using, compare=False)
        for (d, copy), result in zip(pairs, written, strict=True):
            if not result.created:
                # The id was taken (by a row written around publish(), which refuses it): the
                # copy was not stored, so deleting the dead letter would lose the message.
                earlier = f" ({replayed_before} replayed by earlier batches stay replayed)" if replayed_before else ""
                raise OperationError(
                    f"replay of dead letter seq {d.seq} (id {d.id!r}) refused: topic {topic!r} already has a "
                    f"message with the copy's id {copy.id!r}, so the copy would not be written; this batch was "
                    f"rolled back and its dead letters are kept{earlier}. Inspect or delete that message first."
                )


def replay(
    seqs: Iterable[Any],
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
    on_batch: OnBatch | None = None,
) -> BulkResult:
    """Replay the dead letters with these ``seq`` s to the groups that failed them (see the module docstring)."""
    size = check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
    return _run("replay", _seqs(seqs), actor, size, dry_run, alias(using), on_batch)


def purge(
    seqs: Iterable[Any],
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
    on_batch: OnBatch | None = None,
) -> BulkResult:
    """Delete the dead letters with these ``seq`` s (same locking as replay, without the copy)."""
    size = check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
    return _run("purge", _seqs(seqs), actor, size, dry_run, alias(using), on_batch)


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
    action: str,
    f: DeadLetterFilter,
    actor: str,
    batch_size: int,
    dry_run: bool,
    using: str | None,
    on_batch: OnBatch | None,
) -> BulkResult:
    size = check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
    using = topic_alias(f.topic, using)  # a topic's dead letters live in its database
    f = f.resolved()  # a payload search's window fixed once: every batch reads the same one
    total = BulkResult(action, 0, dry_run=dry_run)
    for batch in _matching_seqs(f, size, using):
        r = _run(action, batch, actor, size, dry_run, using, on_batch, done_before=total.done)
        merged = dict(total.by_group)
        _merge(merged, r.by_group)
        total = BulkResult(action, total.done + r.done, total.missing + r.missing, merged, dry_run)
    return total


def replay_matching(
    f: DeadLetterFilter,
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
    on_batch: OnBatch | None = None,
) -> BulkResult:
    """Replay every dead letter matching ``f``, in batches of ``batch_size`` (one transaction each)."""
    return _run_matching("replay", f, actor, batch_size, dry_run, using, on_batch)


def purge_matching(
    f: DeadLetterFilter,
    *,
    actor: str = "",
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    using: str | None = None,
    on_batch: OnBatch | None = None,
) -> BulkResult:
    """Purge every dead letter matching ``f``, in batches of ``batch_size`` (one transaction each)."""
    return _run_matching("purge", f, actor, batch_size, dry_run, using, on_batch)
