"""failOnDataLoss and the stream as a consumer group: what GC deleted is never skipped silently.

The case of issue 18: a streaming query reads 2,000 of 5,000 messages and stops; a
consumer group acks the topic; ``queue_gc`` runs; the query restarts from its checkpoint.
By default it fails naming the missing range; with ``failOnDataLoss=false`` it logs and goes
on; with ``group`` set GC keeps what the stream has not committed, and it sees all 5,000.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_sqlqueue import ops
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import ConsumerOffset, Message, Partition
from django_sqlqueue.ops.gc import collect_garbage

from .helpers import publish_sequenced, reader, run_to_parquet, stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOPIC = "gcd"


def _heads() -> dict[str, int]:
    return {str(p.partition): p.head_offset for p in Partition.objects.filter(topic=TOPIC)}


def _read_2000_then_gc(spark, options, out, checkpoint, **extra) -> None:
    """Read 2,000 messages, stop; publish 3,000 more; another group acks all; GC."""
    publish_sequenced(TOPIC, 2000, keys=8)
    run_to_parquet(stream(spark, options, TOPIC, **extra), out, checkpoint)
    assert spark.read.parquet(str(out)).count() == 2000
    publish_sequenced(TOPIC, 3000, keys=8, start=2000)
    ops.seek("billing", TOPIC, position="latest")  # billing has acked everything
    collect_garbage(topics=[TOPIC])


def test_restart_after_gc_fails_naming_the_missing_range(spark, queue_options, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _read_2000_then_gc(spark, queue_options, out, checkpoint)
    assert Message.objects.filter(topic=TOPIC).count() == 0  # nobody held them
    with pytest.raises(Exception) as info:
        run_to_parquet(stream(spark, queue_options, TOPIC), out, checkpoint)
    text = str(info.value)
    assert "DataLoss" in text
    assert f"topic '{TOPIC}' partition" in text and "are no longer in the log" in text
    assert "failOnDataLoss=false" in text and "group=" in text


def test_restart_after_gc_with_fail_on_data_loss_false_goes_on(spark, queue_options, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _read_2000_then_gc(spark, queue_options, out, checkpoint, failOnDataLoss="false")
    progress = run_to_parquet(stream(spark, queue_options, TOPIC, failOnDataLoss="false"), out, checkpoint)
    assert sum(p["numInputRows"] for p in progress) == 0  # the 3,000 are gone: logged, not read
    assert json.loads(progress[-1]["sources"][0]["endOffset"]) == _heads()
    assert spark.read.parquet(str(out)).count() == 2000
    connections.close_all()


def test_stream_with_group_holds_gc_and_sees_everything(spark, queue_options, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _read_2000_then_gc(spark, queue_options, out, checkpoint, group="spark-gcd")
    # The stream is a consumer group: its watermarks are what it committed (2,000 in all),
    # and GC deleted exactly those, keeping the 3,000 it has not read.
    marks = ConsumerOffset.objects.filter(consumer_group="spark-gcd", topic=TOPIC)
    assert sum(m.offset_acked for m in marks) == 2000
    assert Message.objects.filter(topic=TOPIC).count() == 3000
    listed = [g for g in ops.list_groups(topic=TOPIC) if g.group == "spark-gcd"]
    assert listed and listed[0].lag == 3000  # in the console's groups, with its lag
    status = StringIO()
    call_command("queue_status", "--group", "spark-gcd", stdout=status)
    assert "spark-gcd" in status.getvalue() and TOPIC in status.getvalue()
    from django_sqlqueue.metrics.gauges import read_snapshot, render

    metrics = render(read_snapshot())[0].decode()
    lags = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("sqlqueue_consumergroup_lag{") and 'group="spark-gcd"' in line
    ]
    assert sum(lags) == 3000  # in the metrics, per partition

    run_to_parquet(stream(spark, queue_options, TOPIC, group="spark-gcd"), out, checkpoint)
    ids = [r.id for r in spark.read.parquet(str(out)).select("id").collect()]
    assert len(ids) == len(set(ids)) == 5000
    assert sum(m.offset_acked for m in marks.all()) == 5000  # committed past everything
    collect_garbage(topics=[TOPIC])
    assert Message.objects.filter(topic=TOPIC).count() == 0
    connections.close_all()


def test_new_query_in_a_group_starts_at_its_watermarks(spark, queue_options, tmp_path):
    publish_sequenced("grouped", 10, keys=1)
    ops.seek("resumer", "grouped", offset=6)  # the group exists: 6 read
    df = stream(spark, queue_options, "grouped", group="resumer", startingOffsets="earliest")
    run_to_parquet(df, tmp_path / "out", tmp_path / "checkpoint")
    assert sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect()) == [7, 8, 9, 10]
    assert list(ConsumerOffset.objects.filter(consumer_group="resumer").values_list("offset_acked", flat=True)) == [10]
    connections.close_all()


def test_batch_read_fails_on_deleted_offsets_unless_told(spark, queue_options):
    publish_sequenced("holes", 30, keys=1)
    # offsets 11..15 deleted (as a purge or GC would): a hole inside the retained range
    Message.objects.filter(topic="holes", offset__gte=11, offset__lte=15).delete()
    with pytest.raises(Exception, match=r"topic 'holes' partition \d+: offsets 11\.\.15 \(5 message\(s\)\)"):
        reader(spark, queue_options, "holes").collect()
    assert reader(spark, queue_options, "holes", failOnDataLoss="false").count() == 25
    # Asking for offsets below the oldest retained one is data loss too; "earliest" is not.
    Message.objects.filter(topic="holes", offset__lte=15).delete()
    assert reader(spark, queue_options, "holes").count() == 15
    with pytest.raises(Exception, match=r"offsets 5\.\.15 \(11 message\(s\)\)"):
        reader(spark, queue_options, "holes", startingOffset="5").collect()
    partition = str(Message.objects.filter(topic="holes").first().partition)
    with pytest.raises(Exception, match=r"offsets 10\.\.15"):
        reader(spark, queue_options, "holes", startingOffsets=json.dumps({partition: 9})).collect()
    ending = json.dumps({partition: 20})
    assert sorted(r.offset for r in reader(spark, queue_options, "holes", endingOffsets=ending).collect()) == list(
        range(16, 21)
    )


def test_holes_in_a_dead_letter_topic_are_not_data_loss(spark, queue_options):
    """Replaying or purging a dead letter deletes its row: such holes are left on purpose."""
    # Written as the engine writes dead letters (publish() refuses dead-letter topics).
    for i in range(6):
        write_dead_letter(
            "orders_dlq",
            key="k0",
            id=f"g:m{i}",
            payload={"n": i},
            metadata={},
            created_at=timezone.now(),
            failure_count=3,
            last_error="ValueError: boom",
            original_topic="orders",
            using="default",
        )
    sequence("orders_dlq")
    Message.objects.filter(topic="orders_dlq", offset=3).delete()
    assert reader(spark, queue_options, "orders_dlq").count() == 5


def test_fail_on_data_loss_false_logs_the_range(caplog):
    """What an executor logs with failOnDataLoss=false (read here in this process)."""
    from django_sqlqueue.spark.reader import Range, ReadSpec, Split, read_split

    publish_sequenced("logged", 10, keys=1)
    partition = Message.objects.filter(topic="logged").first().partition
    Message.objects.filter(topic="logged", offset__in=[3, 4, 9]).delete()
    with caplog.at_level("WARNING", logger="django_sqlqueue.spark.dataloss"):
        rows = list(
            read_split("default", Split("logged", partition, 1, 12), Range(), ReadSpec(fail_on_data_loss=False))
        )
    assert [r[2] for r in rows] == [1, 2, 5, 6, 7, 8, 10]
    assert [r.getMessage().split("offsets=")[1].split(" ")[0] for r in caplog.records] == ["3..4", "9..9", "11..12"]
    assert all(f"topic=logged partition={partition}" in r.getMessage() for r in caplog.records)


def test_a_group_with_live_workers_is_refused(spark, queue_options, tmp_path):
    from django.utils import timezone

    from django_sqlqueue.models import SubscriberHeartbeat

    publish_sequenced("shared", 5, keys=1)
    ops.seek("workers", "shared", position="earliest")
    SubscriberHeartbeat.objects.create(
        consumer_group="workers", topic="shared", subscriber_name="host:123", heartbeat_at=timezone.now()
    )
    with pytest.raises(Exception, match=r"group='workers': the group has live workers on topic 'shared' \(host:123\)"):
        run_to_parquet(stream(spark, queue_options, "shared", group="workers"), tmp_path / "out", tmp_path / "cp")
    connections.close_all()


def test_every_gap_in_a_splits_offsets_is_reported_and_holes_left_on_purpose_are_not_loss(caplog):
    """dataloss.checked over rows (offset in column 2): a gap before, between and after them."""
    from django_sqlqueue.spark.dataloss import DataLoss, checked

    rows = [("t", 0, offset) for offset in (3, 4, 7)]
    with pytest.raises(DataLoss, match=r"topic 't' partition 0: offsets 1\.\.2 \(2 message\(s\)\)"):
        list(checked(iter(rows), "t", 0, 1, 9, fail=True, on_purpose=False))
    with caplog.at_level("INFO", logger="django_sqlqueue.spark.dataloss"):
        assert list(checked(iter(rows), "t", 0, 1, 9, fail=False, on_purpose=False)) == rows
        logged = [(r.levelname, r.getMessage().split("offsets=")[1].split()[0]) for r in caplog.records]
        assert logged == [("WARNING", "1..2"), ("WARNING", "5..6"), ("WARNING", "8..9")]
        caplog.clear()
        assert list(checked(iter(rows), "t_dlq", 0, 3, 7, fail=True, on_purpose=True)) == rows
        assert [r.levelname for r in caplog.records] == ["INFO"]  # replayed or purged dead letters
    assert list(checked(iter(rows[:2]), "t", 0, 3, 4, fail=True, on_purpose=False)) == rows[:2]  # no gap
