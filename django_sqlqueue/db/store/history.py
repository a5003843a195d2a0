"""The console's per-minute history (``queue_history``): its owner.

Counts are written by the transactions that already happen, through :func:`count` on their
cursor (the acks, nacks and dead letters of ``acks.py`` and ``atomic_acks.py``; the
sequencer's round counts what it published through the dialect's ``count_published``).
:class:`HistoryStore` writes the workers' lag samples, prunes old minutes and reads the
series the console draws. The statements and their locks are ``db/dialects/history.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...conf import get_settings
from ...models import HISTORY_SLOTS
from .base import StoreBase
from .reports import PartitionLag

#: Seconds in a minute, the history's resolution.
MINUTE = 60


def enabled() -> bool:
    """Whether the history is kept (``SQLQUEUE["HISTORY_RETENTION"]`` > 0)."""
    return get_settings().HISTORY_RETENTION > 0


@dataclass
class Tally:
    """What one write settles, per partition: the history's counters (``COUNTERS``)."""

    handled: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0


def count(store: StoreBase, cursor: Any, group: str, topic: str, tallies: Mapping[int, Tally]) -> None:
    """Add ``tallies`` (per partition) to this minute's rows of (group, topic), on ``cursor``.

    Call it last in the write's transaction, just before COMMIT (the counter rows are then
    locked for one statement and the commit; see ``db/dialects/history.py``). Nothing when
    the history is off or nothing was counted.
    """
    if not tallies or not enabled():
        return
    rows: dict[tuple[str, str, int], list[int]] = {}
    for partition, t in tallies.items():
        if not (t.handled or t.failed or t.retried or t.dead_lettered):
            continue
        row = rows.setdefault((group, topic, partition % HISTORY_SLOTS), [0, 0, 0, 0])
        row[0] += t.handled
        row[1] += t.failed
        row[2] += t.retried
        row[3] += t.dead_lettered
    store.dialect.count_history(cursor, rows)


def handled(keys: Iterable[tuple[int, Any]]) -> dict[int, Tally]:
    """Tallies of acked (partition, offset) keys: one handled message each."""
    out: dict[int, Tally] = {}
    for partition, _ in keys:
        out.setdefault(partition, Tally()).handled += 1
    return out


@dataclass(frozen=True)
class MinuteRow:
    """One minute (or bucket of minutes) of a (group, topic): the counters and the lag."""

    minute: int
    published: int
    handled: int
    failed: int
    retried: int
    dead_lettered: int
    #: The last sample of the bucket (None: no worker sampled it).
    lag: int | None


class HistoryStore(StoreBase):
    """Lag samples, pruning and reads of ``queue_history``."""

    def now_minute(self) -> int:
        """The database clock's minute (minutes since the epoch)."""
        d = self.dialect
        ((minute,),) = self._fetchall(f"SELECT {d.minute_sql(d.now_sql)}", [])
        return int(minute)

    def record_lags(self, lags: Iterable[PartitionLag]) -> int:
        """Store this minute's lag of every (group, topic) in ``lags`` (summed over its
        partitions); return the pairs written. Autocommit, one upsert."""
        totals: dict[tuple[str, str], int] = {}
        for p in lags:
            totals[(p.group, p.topic)] = totals.get((p.group, p.topic), 0) + p.lag
        with self.connection.cursor() as cursor:
            self.dialect.sample_lag(cursor, [(g, t, n) for (g, t), n in totals.items()])
        return len(totals)

    def prune_history(self, retention: float) -> int:
        """Delete the minutes older than ``retention`` seconds (the database clock); return
        the rows deleted. A range of the ``minute`` index below every row the counters touch."""
        cutoff = self.now_minute() - int(retention // MINUTE)
        return self._execute("DELETE FROM queue_history WHERE minute < %s", [cutoff])

    def history_rows(
        self, pairs: Sequence[tuple[str, str]], since: int, step: int, until: int | None = None
    ) -> dict[tuple[str, str], list[MinuteRow]]:
        """The buckets of ``step`` minutes from minute ``since`` on, per (group, topic) of
        ``pairs``: each group's counters, its topic's ``published``, its last lag sample.

        Two grouped reads of the primary key's ranges (one per group and topic, and one of
        the topics' own rows), then the buckets are joined here. Minutes without a row have
        no bucket (the caller fills them).
        """
        if not pairs:
            return {}
        d = self.dialect
        top = until if until is not None else 2**62
        keys = sorted(set(pairs)) + sorted({("", t) for _, t in pairs})
        where = " OR ".join(["(consumer_group = %s AND topic = %s)"] * len(keys))
        params: list[Any] = [x for k in keys for x in k]
        bucket = f"(minute - (minute %% {int(step)}))"
        sums = ", ".join(f"SUM({d.qn(c)})" for c in ("published", "handled", "failed", "retried", "dead_lettered"))
        rows = self._fetchall(
            f"SELECT consumer_group, topic, {bucket} AS b, {sums} FROM queue_history "
            f"WHERE ({where}) AND minute >= %s AND minute < %s GROUP BY consumer_group, topic, b",
            [*params, since, top],
        )
        # The bucket's lag is its last sampled minute's: slot 0 rows with a lag, newest last.
        lag_rows = self._fetchall(
            f"SELECT consumer_group, topic, minute, lag FROM queue_history WHERE ({where}) "
            "AND minute >= %s AND minute < %s AND slot = 0 AND lag IS NOT NULL ORDER BY minute",
            [*params, since, top],
        )
        lags: dict[tuple[str, str, int], int] = {}
        for g, t, minute, value in lag_rows:
            lags[(g, t, int(minute) - int(minute) % step)] = int(value)
        counts: dict[tuple[str, str, int], tuple[int, ...]] = {
            (g, t, int(b)): tuple(int(v or 0) for v in vals) for g, t, b, *vals in rows
        }
        out: dict[tuple[str, str], list[MinuteRow]] = {}
        for g, t in sorted(set(pairs)):
            counted = {b for (gg, tt, b) in counts if (gg, tt) in ((g, t), ("", t))}
            buckets = sorted(counted | {b for (gg, tt, b) in lags if (gg, tt) == (g, t)})
            series = []
            for b in buckets:
                mine = counts.get((g, t, b), (0, 0, 0, 0, 0))
                topic_row = counts.get(("", t, b), (0, 0, 0, 0, 0))
                done, failed, retried, dead = mine[1:5]
                series.append(MinuteRow(b, topic_row[0], done, failed, retried, dead, lags.get((g, t, b))))
            out[(g, t)] = series
        return out


__all__ = ["MINUTE", "HistoryStore", "MinuteRow", "Tally", "count", "enabled", "handled"]
