"""The console's per-minute history (``queue_history``): its owner, and the running totals it samples.

**Counted where the work commits.** Each group's watermark row of a partition
(``queue_offsets``) carries running totals of its outcomes, added by the transactions that
commit them: the ack's watermark move (``acks.move_watermark``: no statement of its own on
the happy path), a flagging ack, a nack, a dead letter (:func:`add_totals`, after the lease
and on the watermark row, so the lock order stays lease, watermark, deliveries). Only the
lease holder writes a partition's row: writers never share a counter.

**Sampled per minute.** :meth:`HistoryStore.sample` reads every (group, topic)'s totals, the
heads of its partitions (``published``: what the sequencer numbered) and its lag, and stores
them under the current minute (``db/dialects/history.py``). The workers' collector calls it
every few seconds; a minute keeps its last sample. The console turns consecutive samples
into per-minute figures (``ops/history.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...conf import get_settings
from .base import StoreBase
from .reports import ReportStore, lag

#: Seconds in a minute, the history's resolution.
MINUTE = 60
#: The running totals of ``queue_offsets`` (``<name>_total``), as :func:`add_totals` takes them.
OUTCOMES = ("handled", "failed", "retried", "dead_lettered")


def enabled() -> bool:
    """Whether the history is kept (``SQLQUEUE["HISTORY_RETENTION"]`` > 0)."""
    return get_settings().HISTORY_RETENTION > 0


def add_totals(store: StoreBase, cursor: Any, group: str, topic: str, partition: int, **counts: int) -> None:
    """Add ``counts`` (``handled=``, ``failed=``, ``retried=``, ``dead_lettered=``; negative to
    take back) to the running totals of the group's watermark row, on ``cursor``.

    Exclusively locks that row until the caller's transaction ends: call it where the lock
    order allows (after the lease, before the deliveries), or on a row the transaction has
    locked already. Nothing when the history is off or nothing is counted.
    """
    sets = [f"{name}_total = {name}_total + %s" for name in OUTCOMES if counts.get(name)]
    if not sets or not enabled():
        return
    cursor.execute(
        f"UPDATE queue_offsets SET {', '.join(sets)} WHERE consumer_group = %s AND topic = %s AND {store.P} = %s",
        [*(counts[name] for name in OUTCOMES if counts.get(name)), group, topic, partition],
    )


@dataclass(frozen=True)
class Sample:
    """A (group, topic)'s running totals and lag at a minute's last sample."""

    minute: int
    published: int
    handled: int
    failed: int
    retried: int
    dead_lettered: int
    lag: int


class HistoryStore(StoreBase):
    """Samples, pruning and reads of ``queue_history``."""

    def now_minute(self) -> int:
        """The database clock's minute (minutes since the epoch)."""
        d = self.dialect
        ((minute,),) = self._fetchall(f"SELECT {d.minute_sql(d.now_sql)}", [])
        return int(minute)

    def sample(self) -> int:
        """Store every (group, topic)'s totals and lag under the current minute; return the
        pairs stored. Two plain reads (the totals with the heads; the unsequenced messages
        per partition, as ``reports.lags`` reads them) and one upsert, autocommit."""
        P = self.P
        rows = self._fetchall(
            f"SELECT o.consumer_group, o.topic, o.{P}, o.offset_acked, p.head_offset, o.handled_total, "
            "o.failed_total, o.retried_total, o.dead_lettered_total FROM queue_offsets o "
            f"JOIN queue_partitions p ON p.topic = o.topic AND p.{P} = o.{P}",
            [],
        )
        if not rows:
            return 0
        unsequenced = ReportStore.unsequenced(self, sorted({r[1] for r in rows}))  # type: ignore[arg-type]
        totals: dict[tuple[str, str], list[int]] = {}
        for group, topic, partition, acked, head, *outcomes in rows:
            t = totals.setdefault((group, topic), [0] * 6)
            t[0] += int(head)
            for i, value in enumerate(outcomes, start=1):
                t[i] += int(value)
            t[5] += lag(int(head), int(acked), unsequenced.get((topic, int(partition)), 0))
        with self.connection.cursor() as cursor:
            self.dialect.store_sample(cursor, [(g, tp, t[:5], t[5]) for (g, tp), t in totals.items()])
        return len(totals)

    def prune_history(self, retention: float) -> int:
        """Delete the minutes older than ``retention`` seconds (the database clock); return
        the rows deleted. A range of the ``minute`` index, below every row a sample writes."""
        cutoff = self.now_minute() - int(retention // MINUTE)
        return self._execute("DELETE FROM queue_history WHERE minute < %s", [cutoff])

    def samples(
        self, pairs: Sequence[tuple[str, str]], since: int, until: int, step: int = 1
    ) -> dict[tuple[str, str], list[Sample]]:
        """The samples of each (group, topic) of ``pairs`` with ``since <= minute < until``, in
        minute order; with ``step`` > 1 only the last sample of each bucket of ``step``
        minutes (what a coarser chart needs: the totals there, and the lag).

        One range of the primary key per pair. Buckets are found by the database (a grouped
        read of the range, joined back to each bucket's last row on the primary key), so a
        7-day read returns 168 rows, not 10,080.
        """
        if not pairs:
            return {}
        wanted = sorted(set(pairs))
        where = " OR ".join(["(consumer_group = %s AND topic = %s)"] * len(wanted))
        params = [*(x for pair in wanted for x in pair), since, until]
        columns = f"minute, {self.dialect.qn('published')}, handled, failed, retried, dead_lettered, lag"
        if step <= 1:
            sql = (
                f"SELECT consumer_group, topic, {columns} FROM queue_history WHERE ({where}) "
                "AND minute >= %s AND minute < %s ORDER BY consumer_group, topic, minute"
            )
        else:
            last = (
                "SELECT consumer_group AS g, topic AS t, MAX(minute) AS m FROM queue_history "
                f"WHERE ({where}) AND minute >= %s AND minute < %s "
                f"GROUP BY consumer_group, topic, minute - minute %% {int(step)}"
            )
            sql = (
                f"SELECT h.consumer_group, h.topic, {', '.join('h.' + c for c in columns.split(', '))} "
                f"FROM queue_history h JOIN ({last}) b ON h.consumer_group = b.g AND h.topic = b.t "
                "AND h.minute = b.m ORDER BY h.consumer_group, h.topic, h.minute"
            )
        out: dict[tuple[str, str], list[Sample]] = {pair: [] for pair in wanted}
        for group, topic, *values in self._fetchall(sql, params):
            out[(group, topic)].append(Sample(*(int(v) for v in values)))
        return out


__all__ = ["MINUTE", "OUTCOMES", "HistoryStore", "Sample", "add_totals", "enabled"]
