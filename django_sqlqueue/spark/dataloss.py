"""``failOnDataLoss``: a read that needs offsets the log no longer has fails, naming them.

Offsets are dense: the sequencer numbers each partition 1, 2, 3, ... with no gap, and
every offset up to a partition's head is a committed message. A read of offsets
``first..last`` of a partition must therefore see every one of them; one that is
missing was deleted after it was numbered:

- by garbage collection (``queue_gc``, and every worker on its partitions), which
  deletes what every consuming group has acked -- a Spark stream without option
  ``group`` is not a consuming group, so GC does not wait for it;
- by a purge of the topic (``queue_topic purge``);
- in a dead-letter topic (``<topic><DLQ_SUFFIX>``), by replaying or purging single
  dead letters: those holes are left on purpose and never count as loss (they are
  logged at INFO).

The check costs nothing extra: a split's rows come in offset order, and each must be
the one after the previous. ``failOnDataLoss=true`` (the default, as in Spark's Kafka
source) raises :class:`DataLoss` naming the topic, partition and missing range;
``false`` logs the range as a warning and goes on. A read filtered by time
(``startTime``/``endTime``) selects rows by ``published_at``, so gaps are expected
there: such reads do not check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ..exceptions import SQLQueueError

logger = logging.getLogger(__name__)

#: Index of the offset in a row of ``LogStore.read_range``.
OFFSET_COLUMN = 2


class DataLoss(SQLQueueError):
    """A read needs offsets that were deleted from the log (``failOnDataLoss=true``)."""


def missing(topic: str, partition: int, low: int, high: int, *, fail: bool, on_purpose: bool) -> None:
    """Report offsets ``low..high`` of a partition as gone: raise, or log."""
    span = f"offset {low}" if low == high else f"offsets {low}..{high}"
    if on_purpose:
        logger.info(
            "dead letters gone (replayed or purged) topic=%s partition=%s offsets=%s..%s", topic, partition, low, high
        )
        return
    if fail:
        raise DataLoss(
            f"topic {topic!r} partition {partition}: {span} ({high - low + 1} message(s)) are no longer in the log "
            "(deleted by garbage collection or a purge before this read got them). Set option group=<name> on a "
            "stream so that GC keeps its messages, or failOnDataLoss=false to log such ranges and go on."
        )
    logger.warning(
        "data loss: messages gone from the log topic=%s partition=%s offsets=%s..%s count=%s (failOnDataLoss=false)",
        topic,
        partition,
        low,
        high,
        high - low + 1,
    )


def checked(
    rows: Iterator[tuple[Any, ...]], topic: str, partition: int, first: int, last: int, *, fail: bool, on_purpose: bool
) -> Iterator[tuple[Any, ...]]:
    """Yield ``rows`` (offsets ``first..last`` of one partition, in order), reporting every gap."""
    expected = first
    for row in rows:
        offset = int(row[OFFSET_COLUMN])
        if offset > expected:
            missing(topic, partition, expected, offset - 1, fail=fail, on_purpose=on_purpose)
        expected = offset + 1
        yield row
    if expected <= last:
        missing(topic, partition, expected, last, fail=fail, on_purpose=on_purpose)
