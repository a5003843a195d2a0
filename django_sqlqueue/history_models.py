"""The console's per-minute history table (``queue_history``), re-exported by ``models``."""

from __future__ import annotations

from django.db import models

from .rules.limits import CONSUMER_GROUP_LENGTH, TOPIC_COLUMN_LENGTH


class HistoryMinute(models.Model):
    """A consumer group's running totals on a topic at a minute's last sample (the console's charts).

    The totals are counted where the work commits, in columns of the group's watermark rows
    (``queue_offsets.handled_total`` and the like: added by the ack's watermark move, the
    nack and the dead letter, so they are exact), and ``published`` is the sum of the
    partitions' heads (the messages the sequencer numbered). The workers' collector sums
    them per (group, topic) with the lag every ``LAG_SAMPLE_INTERVAL`` seconds and stores
    them here under the current minute (the minute keeps its last sample); a minute's
    figures are the difference between its totals and the previous sample's
    (``ops/history.py``). ``minute`` counts minutes since the Unix epoch (UTC) on the
    database clock. Garbage collection deletes minutes older than
    ``SQLQUEUE["HISTORY_RETENTION"]`` (``db/store/history.py``, the table's owner).
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "minute")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    #: Minutes since 1970-01-01 00:00 UTC.
    minute = models.BigIntegerField()
    #: Messages numbered in the partitions the group consumes (the sum of their heads).
    published = models.BigIntegerField(default=0)
    handled = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    #: Messages published and not yet acked by the group (``reports.lag``, summed over partitions).
    lag = models.BigIntegerField(default=0)

    class Meta:
        db_table = "queue_history"
        indexes = [
            # The pruning of old minutes.
            models.Index(fields=["minute"], name="queue_history_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group} {self.topic} @{self.minute}"
