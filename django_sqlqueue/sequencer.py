"""The sequencer: numbers committed messages of each partition, after they committed.

Publishers only append rows with a NULL ``offset`` (see ``publisher.py``). The
sequencer gives each partition's newly visible messages the next offsets, in short
transactions of its own::

    BEGIN
    SELECT partition, head_offset FROM queue_partitions
        WHERE topic = ? AND partition IN (...) ORDER BY partition FOR UPDATE   -- (1)
    SELECT partition, seq FROM queue_messages
        WHERE topic = ? AND partition = ? AND offset IS NULL ORDER BY seq LIMIT n  -- (2), per partition
    UPDATE queue_messages SET offset = <head + rank> for the rows read in (2)          -- (3)
    UPDATE queue_partitions SET head_offset = CASE partition WHEN ... END ...       -- (4)
    INSERT INTO queue_topic_hours SELECT ... the rows numbered, per hour ... UPSERT   -- (5)
    COMMIT

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

Workers run the sequencer for the partitions they lease, inside their poll, when the
poll's state query reports unsequenced messages. :func:`sequence` runs it for any topic
from any process (a Spark stream, a test, an operator).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .conf import get_settings
from .dialects import Dialect
from .models import TOPIC_HOUR_SLOTS
from .store.base import StoreBase, in_list
from .store.topics import TopicStore

#: Messages numbered per partition per transaction.
SEQUENCE_BATCH = 2000
#: Partitions per sequencing transaction (two statements per chunk whatever the count).
SEQUENCE_CHUNK = 100


class Sequencer(StoreBase):
    def sequence(self, topic: str, partitions: Sequence[int], limit: int = SEQUENCE_BATCH) -> dict[int, int]:
        """Number committed unsequenced messages of ``partitions``; return their new heads.

        Only partitions that got new offsets are in the result. Partitions without a
        head row are skipped (workers create head rows when they register a topic).
        """
        heads: dict[int, int] = {}
        wanted = sorted(set(partitions))
        for start in range(0, len(wanted), SEQUENCE_CHUNK):
            heads.update(self._sequence_chunk(topic, wanted[start : start + SEQUENCE_CHUNK], limit))
        return heads

    def _sequence_chunk(self, topic: str, partitions: list[int], limit: int) -> dict[int, int]:
        d, P, OFF = self.dialect, self.P, self.OFF
        with self.transaction() as cursor:
            cursor.execute(
                f"SELECT {P}, head_offset FROM queue_partitions WHERE topic = %s AND {P} IN ({in_list(partitions)}) "
                f"ORDER BY {P} {d.for_update}",
                [topic, *partitions],
            )
            heads = {int(p): int(h) for p, h in cursor.fetchall()}
            if not heads:
                return {}
            branches: list[str] = []
            params: list[Any] = []
            for partition in sorted(heads):
                branches.append(
                    d.union_branch(
                        f"SELECT {P}, seq FROM queue_messages {d.use_index('queue_msg_offset')} "
                        f"WHERE topic = %s AND {P} = %s AND {OFF} IS NULL ORDER BY seq LIMIT {int(limit)}",
                        len(branches),
                    )
                )
                params += [topic, partition]
            cursor.execute(" UNION ALL ".join(branches), params)
            found: dict[int, list[int]] = {}
            for partition, seq in cursor.fetchall():
                found.setdefault(int(partition), []).append(int(seq))
            if not found:
                return {}
            assigned: list[tuple[int, int]] = []
            new_heads: dict[int, int] = {}
            for partition in sorted(found):
                offset = heads[partition]
                for seq in sorted(found[partition]):
                    offset += 1
                    assigned.append((seq, offset))
                new_heads[partition] = offset
            d.assign_offsets(cursor, assigned)
            head_cases = " ".join(["WHEN %s THEN %s"] * len(new_heads))
            head_params: list[Any] = []
            for partition, head in sorted(new_heads.items()):
                head_params += [partition, head]
            cursor.execute(
                f"UPDATE queue_partitions SET head_offset = CASE {P} {head_cases} END "
                f"WHERE topic = %s AND {P} IN ({in_list(sorted(new_heads))})",
                [*head_params, topic, *sorted(new_heads)],  # same order as the IN list
            )
            count_sequenced(d, cursor, topic, heads, new_heads)
        return new_heads

    def unsequenced_partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic`` with committed messages waiting for an offset."""
        rows = self._fetchall(
            f"SELECT DISTINCT {self.P} FROM queue_messages WHERE topic = %s AND {self.OFF} IS NULL", [topic]
        )
        return sorted(int(r[0]) for r in rows)


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
    concurrently with workers: see the module docstring.
    """
    alias = using or get_settings().DATABASE
    sequencer = Sequencer(alias)
    if partitions is None:
        partitions = sequencer.unsequenced_partitions(topic)
    TopicStore(alias).create_partitions(topic, list(partitions))
    heads: dict[int, int] = {}
    while True:
        advanced = sequencer.sequence(topic, partitions)
        if not advanced:
            return heads
        heads.update(advanced)
