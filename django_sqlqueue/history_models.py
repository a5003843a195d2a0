"""The console's per-minute history table (``queue_history``), re-exported by ``models``."""

from __future__ import annotations

from django.db import models

from .rules.limits import CONSUMER_GROUP_LENGTH, TOPIC_COLUMN_LENGTH

#: Counter rows per (group, topic, minute) of ``queue_history``: a write adds to slot
#: ``partition % HISTORY_SLOTS``, so workers holding different partitions of a group's topic
#: seldom update the same row (the hot row of the current minute is striped, not shared).
HISTORY_SLOTS = 4


class HistoryMinute(models.Model):
    """One minute of a consumer group's work on a topic (the console's charts).

    Counted in the transactions that already happen, so each count is exact: ``handled`` by
    the ack's transaction, ``failed``/``retried`` by the nack's, ``dead_lettered`` (and a
    ``failed``) by the dead letter's; ``published`` by the sequencer's round, in rows whose
    ``consumer_group`` is ``""`` (a topic's, shared by its groups), per minute of
    ``published_at``. ``lag`` (the group's messages numbered but not acked, summed over
    partitions) is sampled by the workers' collector and kept in slot 0: the minute's last
    sample. A (group, topic, minute) total is the sum of its ``slot`` rows. ``minute`` counts
    minutes since the Unix epoch (UTC) on the database clock. Garbage collection deletes
    minutes older than ``SQLQUEUE["HISTORY_RETENTION"]`` (``db/store/history.py``, the table's
    owner).
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "minute", "slot")
    #: ``""``: the topic's own row (``published``).
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    #: Minutes since 1970-01-01 00:00 UTC.
    minute = models.BigIntegerField()
    #: ``partition % HISTORY_SLOTS`` of the counted messages.
    slot = models.PositiveSmallIntegerField()
    published = models.BigIntegerField(default=0)
    handled = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    #: Messages numbered and not yet acked by the group at the minute's last sample (slot 0 only).
    lag = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "queue_history"
        indexes = [
            # The overview's last hour of every group, and the pruning of old minutes.
            models.Index(fields=["minute"], name="queue_history_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group or '(published)'} {self.topic} @{self.minute} [{self.slot}]"
