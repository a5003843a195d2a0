"""The sequencer: numbers committed messages of each partition, after they committed.

Publishers only append rows with a NULL ``offset`` (see ``publisher.py``). The
sequencer gives each partition's newly visible messages the next offsets, in short
transactions of its own::

    BEGIN
    SELECT partition, head_offset FROM queue_partitions
        WHERE topic = ? AND partition IN (...) ORDER BY partition FOR UPDATE   -- (1)
    SELECT partition, seq FROM queue_messages
        WHERE topic = ? AND partition = ? AND offset IS NULL ORDER BY seq LIMIT n  -- (2), per partition
    UPDATE queue_messages SET offset = <head + rank>
        WHERE seq = <a row read in (2)> AND offset IS NULL                           -- (3), one joined statement
    UPDATE queue_partitions SET head_offset = CASE partition WHEN ... END ...       -- (4)
    INSERT INTO queue_topic_hours SELECT ... the rows numbered, per hour ... UPSERT   -- (5)
    COMMIT

On PostgreSQL a worker's round is one call of ``sqlqueue_sequence_round`` (migration 0011):
the same statements in the same order, run by the server, with the same checks -- one round
trip instead of seven, on the path between a publish and its handler. The bulk
:func:`sequence` keeps the statements below (it reads ahead, see there).

Why this is sound:

- (1) locks the partitions' head rows (in sorted order, so two sequencers cannot
  deadlock on them): one sequencer at a time per partition, whichever worker of
  whichever group runs it. A second one waits a few milliseconds, then finds nothing
  left to number.
- (2) is a plain read (READ COMMITTED; PostgreSQL's default): it sees exactly the
  messages whose transactions have committed, and never waits for a publisher. A
  message whose transaction is still open is invisible; it gets an offset in a later
  round, after the ones numbered now. So offsets follow the order in which messages
  became visible, and ``seq`` (handed out at INSERT time) only breaks ties among
  messages that became visible together -- which keeps one transaction's messages,
  and one publisher's consecutive messages of a key, in publish order.
- (3) must write exactly the rows it was given: a purge or a replay may delete an
  unsequenced row (they do not take the head lock), and a row numbered twice would be a
  bug. If the UPDATE finds fewer rows than it was given, the round rolls back and the
  partition is read afresh (:class:`StaleReadAhead`), so offsets never have a gap.
- (3) and (4) commit together: a consumer that can see offset N can see every offset
  below it, because they were all assigned by this or an earlier committed round. A
  reader of ``offset > watermark`` therefore never skips a message, however late its
  publisher committed. No AUTO_INCREMENT visibility, no grace period, no clock.
- (5) counts the numbered messages per topic and hour of ``published_at`` (the
  report's "messages per hour", which must outlive garbage collection). In the same
  transaction, so each message is counted exactly once. Counter rows are striped by
  ``partition % TOPIC_HOUR_SLOTS`` and upserted in key order, after the head locks:
  sequencers of different partitions rarely share a row and cannot deadlock on one.
- A sequencer killed at any point (``kill -9``) leaves an open transaction that the
  database rolls back: no offset is assigned, the head does not move, the next round
  numbers the same messages. Nothing is lost, duplicated or reordered.

Read-ahead (the bulk :func:`sequence` only). Over a large backlog, (2) is the costly
read: MariaDB sorts the partition's whole unsequenced index range for every ``LIMIT``
(the NULL ``offset`` prefix is not used for ``ORDER BY seq``), and PostgreSQL, with
statistics from before the backfill, walks the primary key over every message already
sequenced; either way sequencing n messages in rounds of ``limit`` is quadratic. So
:func:`sequence` reads up to :data:`READ_AHEAD` rows per partition at once, numbers
them ``limit`` at a time in successive transactions, and reads again only when they
are used up. Each later transaction still locks the head rows first, and reuses the
rows read earlier only if the partition's head, read under that lock, is the one its
own previous transaction committed. That is sound because only a sequencer holding the
head lock assigns offsets, and every assignment moves the head up (heads never go
down): an unchanged head means nobody numbered the partition since, so every row read
earlier is still unsequenced; it was committed when it was read, and a commit is never
undone. A head that moved (a worker's sequencer numbered some of the rows) discards the
partition's read-ahead and reads afresh. A deleted row is caught by (3), which also
refuses any row already numbered. Order: a message that commits after the read-ahead
(even with a lower ``seq``) is numbered after the rows read ahead, since it became
visible after them; rows past :data:`READ_AHEAD` are read later and take their place by
``seq`` among what committed meanwhile, as past a ``LIMIT`` before. A publisher's next
message is inserted after its previous one committed, so no read sees the next without
the previous: per-key publish order holds. Workers' sequencers, inside their polls,
read ``limit`` rows per round as before: a poll numbers what arrived since the last
one, rarely a large backlog.

Workers run the sequencer for the partitions they lease, inside their poll, when the
poll's state query reports unsequenced messages. :func:`sequence` runs it for any topic
from any process (a Spark stream, a test, an operator).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, transaction

from ..conf import get_settings
from ..models import TOPIC_HOUR_SLOTS
from .dialects import Dialect
from .session import bound_engine_transaction
from .store.base import StoreBase, in_list
from .store.topics import TopicStore

#: Messages numbered per partition per transaction.
SEQUENCE_BATCH = 2000
#: Partitions per sequencing transaction (two statements per chunk whatever the count).
SEQUENCE_CHUNK = 100
#: Unsequenced messages the bulk :func:`sequence` reads per partition at once (see
#: "Read-ahead" in the module docstring) ...
READ_AHEAD = 25_000
#: ... and at most per read of a chunk of partitions (memory: ~40 bytes a row in Python).
READ_AHEAD_TOTAL = 200_000
#: Messages the bulk :func:`sequence` numbers per transaction, spread over the chunk's
#: partitions (at least :data:`SEQUENCE_BATCH` each).
BULK_ROUND = 40_000
#: Fresh attempts after a round found a row it read deleted (:class:`StaleReadAhead`).
STALE_RETRIES = 3


class StaleReadAhead(Exception):
    """The offset UPDATE found fewer unsequenced rows than it was given: roll back, read again.

    Raised out of :meth:`Sequencer.sequence` only if that keeps happening.
    """


@dataclass
class _Ahead:
    #: The partition's head when the remaining rows were last known to follow it.
    head: int
    #: Unsequenced seqs of the partition not numbered yet, in seq order, from ``next``.
    seqs: list[int]
    next: int = 0


@dataclass
class ReadAhead:
    """Rows of unsequenced messages read once and numbered over several transactions.

    Held by one bulk :func:`sequence` call (never shared between threads or calls).
    """

    #: Rows read per partition by one read.
    size: int = READ_AHEAD
    partitions: dict[int, _Ahead] = field(default_factory=dict)

    def pending(self, partition: int, head: int) -> bool:
        """Whether rows read earlier can be numbered after ``head`` (the locked head now)."""
        ahead = self.partitions.get(partition)
        return ahead is not None and ahead.head == head and ahead.next < len(ahead.seqs)


class Sequencer(StoreBase):
    def sequence(
        self,
        topic: str,
        partitions: Sequence[int],
        limit: int = SEQUENCE_BATCH,
        read_ahead: ReadAhead | None = None,
    ) -> dict[int, int]:
        """Number committed unsequenced messages of ``partitions``; return their new heads.

        Only partitions that got new offsets are in the result. Partitions without a
        head row are skipped (workers create head rows when they register a topic).
        ``read_ahead`` (the bulk :func:`sequence`'s) keeps rows read in one round for the
        next rounds; without it every round reads at most ``limit`` rows per partition.
        """
        heads: dict[int, int] = {}
        wanted = sorted(set(partitions))
        for start in range(0, len(wanted), SEQUENCE_CHUNK):
            chunk = wanted[start : start + SEQUENCE_CHUNK]
            for attempt in range(STALE_RETRIES + 1):
                try:
                    heads.update(self._sequence_chunk(topic, chunk, limit, read_ahead))
                    break
                except StaleReadAhead:
                    # A message read earlier was deleted (a purge, a replay) before its turn:
                    # the transaction rolled back, nothing moved. Read afresh.
                    if read_ahead is not None:
                        read_ahead.partitions.clear()
                    if attempt == STALE_RETRIES:
                        raise
        return heads

    def _sequence_chunk(
        self, topic: str, partitions: list[int], limit: int, read_ahead: ReadAhead | None
    ) -> dict[int, int]:
        d, P = self.dialect, self.P
        if read_ahead is None and d.sequence_round_sql is not None:
            return self._round_in_one_statement(d.sequence_round_sql, topic, partitions, limit)
        kept: dict[int, _Ahead] = {}
        with self.transaction() as cursor:
            # An inline worker's poll loop runs handlers too: this transaction's idle time is
            # bounded by the statement that takes the head locks (db/session.py; "" elsewhere).
            bound = bound_engine_transaction(self.connection, cursor)
            cursor.execute(
                f"SELECT {P}, head_offset FROM queue_partitions WHERE topic = %s AND {P} IN ({in_list(partitions)})"
                f"{bound} ORDER BY {P} {d.for_update}",
                [topic, *partitions],
            )
            heads = {int(p): int(h) for p, h in cursor.fetchall()}
            if not heads:
                return {}
            # Under the head locks: rows read ahead are reused only where the head is the one
            # our own last round left (nobody numbered this partition since), see (2').
            found: dict[int, list[int]] = {}
            to_read = []
            for partition in sorted(heads):
                if read_ahead is not None and read_ahead.pending(partition, heads[partition]):
                    kept[partition] = read_ahead.partitions[partition]
                else:
                    to_read.append(partition)
            if to_read:
                read = limit
                if read_ahead is not None:
                    read = max(limit, min(read_ahead.size, READ_AHEAD_TOTAL // len(to_read)))
                branches: list[str] = []
                params: list[Any] = []
                select = d.unsequenced_rows(read, read_ahead=read_ahead is not None)
                for partition in to_read:
                    branches.append(d.union_branch(select, len(branches)))
                    params += [topic, partition]
                cursor.execute(" UNION ALL ".join(branches), params)
                for partition, seq in cursor.fetchall():
                    found.setdefault(int(partition), []).append(int(seq))
                if read_ahead is not None:
                    for partition in to_read:
                        read_ahead.partitions.pop(partition, None)  # stale or used up
                for partition, seqs in found.items():
                    seqs.sort()
                    kept[partition] = _Ahead(heads[partition], seqs)
            assigned: list[tuple[int, int]] = []
            new_heads: dict[int, int] = {}
            taken: dict[int, int] = {}
            for partition in sorted(kept):
                ahead = kept[partition]
                batch = ahead.seqs[ahead.next : ahead.next + limit]
                if not batch:
                    continue
                offset = heads[partition]
                for seq in batch:
                    offset += 1
                    assigned.append((seq, offset))
                new_heads[partition] = offset
                taken[partition] = len(batch)
            if not assigned:
                return {}
            # (3): only rows still unsequenced are written; fewer than given means one of
            # them was deleted since it was read: roll back rather than leave a gap.
            if d.counts_on_assign:  # (3) and (5) in one statement
                written = d.assign_offsets_counted(cursor, topic, assigned, TOPIC_HOUR_SLOTS)
            else:
                written = d.assign_offsets(cursor, assigned)
            if written != len(assigned):
                raise StaleReadAhead(topic)
            head_cases = " ".join(["WHEN %s THEN %s"] * len(new_heads))
            head_params: list[Any] = []
            for partition, head in sorted(new_heads.items()):
                head_params += [partition, head]
            cursor.execute(
                f"UPDATE queue_partitions SET head_offset = CASE {P} {head_cases} END "
                f"WHERE topic = %s AND {P} IN ({in_list(sorted(new_heads))})",
                [*head_params, topic, *sorted(new_heads)],  # same order as the IN list
            )
            if not d.counts_on_assign:
                count_sequenced(d, cursor, topic, heads, new_heads)
        if read_ahead is not None:
            # Committed: the remaining rows follow the heads we just wrote. (Not before the
            # COMMIT: a rolled-back round must not advance the read-ahead.)
            for partition, ahead in kept.items():
                if partition in taken:
                    ahead.next += taken[partition]
                    ahead.head = new_heads[partition]
                if ahead.next < len(ahead.seqs):
                    read_ahead.partitions[partition] = ahead
                else:
                    read_ahead.partitions.pop(partition, None)
        return new_heads

    def _round_in_one_statement(self, sql: str, topic: str, partitions: list[int], limit: int) -> dict[int, int]:
        """Steps (1)-(5) as the database's one statement ``sql`` (``Dialect.sequence_round_sql``):
        the same locks, order and checks, one round trip. In autocommit it is its own
        transaction; inside a caller's transaction, a savepoint (a stale round rolls back
        alone)."""
        connection = self.connection
        with self.stale_read_ahead(topic):
            with transaction.atomic(using=self.using) if connection.in_atomic_block else nullcontext():
                rows = self._fetchall_hot(sql, [topic, list(partitions), limit, TOPIC_HOUR_SLOTS])
        return {int(p): int(head) for p, head in rows}

    def round_fragment(self, topic: str, partitions: str, limit: int = SEQUENCE_BATCH) -> tuple[str, list[Any]] | None:
        """The round as a set-returning function of a query -- to go in its FROM, rows
        ``(moved_partition, moved_head)`` -- numbering the partitions of the array
        expression ``partitions``, and its parameters. None where the database has no such
        function (``Dialect.sequence_round_from``) or inside a transaction (the round must be
        its own). Run it inside :meth:`stale_read_ahead`.

        Issue 33: a worker's poll state and round in one statement
        (``PollStore.poll_and_sequence``), one round trip fewer between a message's commit and
        its handler. The function takes its own head locks and snapshots, as when it is
        called alone.
        """
        d = self.dialect
        if d.sequence_round_from is None or self.connection.in_atomic_block:
            return None
        return d.sequence_round_from.format(partitions=partitions), [topic, limit, TOPIC_HOUR_SLOTS]

    @contextmanager
    def stale_read_ahead(self, topic: str) -> Iterator[None]:
        """Raise :class:`StaleReadAhead` for the round's error "a row it was to number is
        gone" (a purge between its read and its write: nothing was numbered)."""
        try:
            yield
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == self.dialect.sequence_round_stale:
                raise StaleReadAhead(topic) from exc
            raise

    def unsequenced_partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic`` with committed messages waiting for an offset."""
        P, OFF = self.P, self.OFF
        if not self.dialect.unsequenced_via_heads:
            # PostgreSQL and SQLite: their partial index holds only the unsequenced rows.
            rows = self._fetchall(
                f"SELECT DISTINCT {P} FROM queue_messages WHERE topic = %s AND {OFF} IS NULL", [topic]
            )
            return sorted(int(r[0]) for r in rows)
        # MySQL/MariaDB: ``DISTINCT`` read the topic's whole offset index (1,002,000 entries at
        # 1,000,000 messages, issue 32). Step from partition to partition instead, one dive
        # each, and probe each for a NULL offset (NULLs come first in its range). Plain reads.
        hint = self.dialect.use_index("queue_msg_offset")
        found: list[int] = []
        last = -1
        while rows := self._fetchall(
            f"SELECT {P} FROM queue_messages {hint} WHERE topic = %s AND {P} > %s ORDER BY {P} LIMIT 1", [topic, last]
        ):
            last = int(rows[0][0])
            if self._fetchall(
                f"SELECT 1 FROM queue_messages {hint} WHERE topic = %s AND {P} = %s AND {OFF} IS NULL LIMIT 1",
                [topic, last],
            ):
                found.append(last)
        return found


def count_sequenced(d: Dialect, cursor: Any, topic: str, heads: dict[int, int], new_heads: dict[int, int]) -> None:
    """Count the messages a round numbered (offsets ``heads[p] + 1 .. new_heads[p]``) per
    hour in ``queue_topic_hours``: one statement (5) in the round's transaction, after the
    head locks; it commits or rolls back with the offsets, so a message counts once."""
    ranges = {p: (heads[p] + 1, head) for p, head in new_heads.items()}
    d.count_sequenced(cursor, topic, ranges, TOPIC_HOUR_SLOTS)


def sequence(topic: str, partitions: Sequence[int] | None = None, *, using: str | None = None) -> dict[int, int]:
    """Number the committed, unsequenced messages of ``topic``; return the new heads.

    ``partitions`` None means every partition with unsequenced messages. Head rows are
    created for partitions that have none yet (e.g. of a topic no worker consumes).
    Runs until nothing committed is left unnumbered. Safe from any process at any time,
    concurrently with workers: see the module docstring. Reads ahead (see there).
    ``using``: default, the database that holds ``topic`` (``SQLQUEUE["TOPIC_DATABASES"]``).
    """
    alias = using or get_settings().database_for(topic)
    sequencer = Sequencer(alias)
    if partitions is None:
        partitions = sequencer.unsequenced_partitions(topic)
    TopicStore(alias).create_partitions(topic, list(partitions))
    heads: dict[int, int] = {}
    read_ahead = ReadAhead()
    limit = max(SEQUENCE_BATCH, BULK_ROUND // max(1, min(len(partitions), SEQUENCE_CHUNK)))
    while True:
        advanced = sequencer.sequence(topic, partitions, limit, read_ahead)
        if not advanced:
            return heads
        heads.update(advanced)
