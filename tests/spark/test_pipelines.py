"""``manage.py queue_pipeline``: backfill, export (both engines), replay, report."""

from __future__ import annotations

import datetime as dt
import io
import re

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import ConsumerOffset, Message

from .helpers import publish_sequenced, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queue_pipeline", *args, stdout=out)
    return out.getvalue()


def test_backfill_from_parquet_twice_publishes_once(spark, tmp_path):
    source = str(tmp_path / "orders.parquet")
    rows = [(f"o{i}", f"c{i % 9}", i * 1.5, f"item {i}") for i in range(400)]
    spark.createDataFrame(rows, "order_id string, customer string, amount double, item string").repartition(
        3
    ).write.parquet(source)

    out = run("backfill", source, "--topic", "orders", "--id-column", "order_id", "--key-column", "customer")
    assert "400 source row(s), 400 new message(s)" in out
    out = run("backfill", source, "--topic", "orders", "--id-column", "order_id", "--key-column", "customer")
    assert "400 source row(s), 0 new message(s)" in out
    messages = {m["id"]: m for m in stored("orders")}
    assert len(messages) == 400
    assert messages["o7"]["payload"] == {"amount": 10.5, "item": "item 7"}
    assert messages["o7"]["key"] == "c7"


def test_backfill_refuses_a_dead_letter_topic_and_writes_nothing(spark, tmp_path):
    """Issue 28: only the engine writes dead letters; the Spark writer refuses them as publish() does."""
    source = str(tmp_path / "forged.parquet")
    spark.createDataFrame([("g:o1", "c1", 1.0)], "order_id string, customer string, amount double").write.parquet(
        source
    )
    with pytest.raises(Exception, match="dead-letter topic"):
        run("backfill", source, "--topic", "orders_dlq", "--id-column", "order_id", "--key-column", "customer")
    assert not Message.objects.filter(topic="orders_dlq").exists()


def test_backfill_json_without_ids_uses_content_ids(spark, tmp_path):
    source = tmp_path / "events.json"
    source.write_text('{"kind": "a", "n": 1}\n{"kind": "b", "n": 2}\n{"kind": "a", "n": 1}\n')
    assert "3 source row(s), 2 new message(s)" in run("backfill", str(source), "--format", "json", "--topic", "events")
    with pytest.raises(CommandError, match="has no column 'nope'"):
        run("backfill", str(source), "--format", "json", "--topic", "events", "--id-column", "nope")


@pytest.mark.parametrize("engine", ["python", "jdbc"])
def test_export_writes_parquet_by_topic_and_date(spark, tmp_path, engine):
    if engine == "jdbc" and connection.vendor != "mysql":
        pytest.skip("Spark's JDBC reader is used for MySQL/MariaDB only")
    publish_sequenced("orders", 120, keys=6)
    yesterday = timezone.now() - dt.timedelta(days=1)
    Message.objects.filter(topic="orders", id__in=[f"m{i}" for i in range(20)]).update(published_at=yesterday)
    write_dead_letter(
        "orders_dlq",
        key="k",
        id="g:m1",
        payload={"n": 1},
        metadata={},
        created_at=timezone.now(),
        failure_count=3,
        last_error="KeyError: 'sku'",
        original_topic="orders",
        using="default",
    )
    sequence("orders_dlq")
    output = tmp_path / "export"

    out = run("export", "--topic", "orders", "--output", str(output), "--engine", engine)
    assert "export: orders: 120 message(s)" in out
    dates = sorted(p.name for p in (output / "topic=orders").iterdir())
    assert dates == [f"date={yesterday.date()}", f"date={timezone.now().date()}"]
    exported = spark.read.parquet(str(output)).where("topic = 'orders'")
    assert exported.count() == 120
    rows = {r.id: r for r in exported.collect()}
    original = Message.objects.get(topic="orders", id="m5")
    assert rows["m5"].payload == '{"n":5}' and rows["m5"].offset == original.offset
    assert rows["m5"].published_at.replace(tzinfo=dt.UTC) == original.published_at  # UTC end to end

    with pytest.raises(Exception, match="already exists"):
        run("export", "--topic", "orders", "--output", str(output), "--engine", engine)
    out = run("export", "--topic", "orders", "--dlq", "--output", str(output), "--engine", engine, "--overwrite")
    assert "export: orders_dlq: 1 message(s)" in out
    dlq = spark.read.parquet(str(output / "topic=orders_dlq")).collect()
    assert [(r.id, r.last_error, r.failure_count) for r in dlq] == [("g:m1", "KeyError: 'sku'", 3)]
    assert spark.read.parquet(str(output)).where("topic = 'orders'").count() == 120  # other topics kept


def test_replay_a_time_range_into_another_topic_and_a_new_group(spark):
    publish_sequenced("orders", 60, keys=3)
    old = timezone.now() - dt.timedelta(hours=5)
    Message.objects.filter(topic="orders", id__in=[f"m{i}" for i in range(20)]).update(published_at=old)
    since = (timezone.now() - dt.timedelta(hours=6)).isoformat()
    until = (timezone.now() - dt.timedelta(hours=4)).isoformat()

    for _ in range(2):
        out = run("replay", "--topic", "orders", "--since", since, "--until", until, "--to-topic", "orders_replayed")
        assert "20 message(s) of 'orders' published to 'orders_replayed'" in out
    replayed = Message.objects.filter(topic="orders_replayed")
    assert replayed.count() == 20
    assert sorted(m.payload["n"] for m in replayed) == list(range(20))
    first = replayed.first()
    assert re.fullmatch(r"replay:[0-9a-f]{64}", first.id)
    assert first.metadata["replayed_from"]["topic"] == "orders"

    recent = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    out = run("replay", "--topic", "orders", "--since", recent, "--group", "audit", "--yes")
    assert "group 'audit' starts 'orders'" in out
    marks = {o.partition: o.offset_acked for o in ConsumerOffset.objects.filter(consumer_group="audit", topic="orders")}
    for partition, mark in marks.items():
        # Everything after the watermark is recent; the message at it (if any) is old.
        after = Message.objects.filter(topic="orders", partition=partition, offset__gt=mark)
        assert (
            after.count()
            == Message.objects.filter(topic="orders", partition=partition, published_at__gte=recent).count()
        )
    with pytest.raises(CommandError, match="already consumes"):
        run("replay", "--topic", "orders", "--since", recent, "--group", "audit", "--yes")


def test_report_is_html_with_its_plots(spark, tmp_path):
    from django_sqlqueue.models import DeliveryState, Partition

    publish_sequenced("orders", 50, keys=4)
    publish_sequenced("payments", 30, keys=2)
    for i, error in enumerate(["ValueError: bad", "ValueError: worse", "KeyError: 'x'"]):
        write_dead_letter(
            "orders_dlq",
            key="k",
            id=f"billing:d{i}",
            payload={},
            metadata={},
            created_at=timezone.now(),
            failure_count=5,
            last_error=error,
            original_topic="orders",
            using="default",
        )
    now = timezone.now()
    for head in Partition.objects.filter(topic="orders"):
        ConsumerOffset.objects.create(
            consumer_group="billing",
            topic="orders",
            partition=head.partition,
            offset_acked=head.head_offset // 2,
            updated_at=now,
        )
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=head.partition,
        message_offset=head.head_offset // 2 + 1,
        invisible_until=now,
        retry_count=2,
        status=DeliveryState.Status.RETRY,
    )
    output = tmp_path / "report.html"
    out = run("report", "--output", str(output))
    assert "report:" in out
    page = output.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for anchor in ("per-hour", "lag", "failures", "slowest"):
        section = page.split(f"<section id='{anchor}'>")[1].split("</section>")[0]
        assert f"<figure class='plot' id='plot-{anchor}'><svg" in section, anchor
    assert ">ValueError<" in page and ">KeyError<" in page  # dead letters by error type
    assert "payments" in page and "billing" in page


def test_report_counts_a_topic_whose_log_was_consumed_and_garbage_collected(spark, tmp_path):
    """Messages per hour come from the sequencer's counters (queue_topic_hours), not the log."""
    from django_sqlqueue.db.store import QueueStore
    from django_sqlqueue.models import Partition
    from django_sqlqueue.ops.gc import collect_garbage

    started = timezone.now()
    publish_sequenced("archived", 40, keys=4)
    publish_sequenced("live", 10, keys=2)
    QueueStore("default").register_topic("archived", 8)
    now = timezone.now()
    for head in Partition.objects.filter(topic="archived"):
        ConsumerOffset.objects.create(
            consumer_group="billing",
            topic="archived",
            partition=head.partition,
            offset_acked=head.head_offset,
            updated_at=now,
        )
    assert collect_garbage(topics=["archived"]) == {"archived": 40}
    assert not Message.objects.filter(topic="archived").exists()
    output = tmp_path / "report.html"
    run("report", "--output", str(output))
    section = output.read_text().split("<section id='per-hour'>")[1].split("</section>")[0]
    hour = now.strftime("%Y-%m-%d %H:00")
    assert "<td>archived</td><td>40</td><td>40</td>" in section  # topic, messages, busiest hour
    if started.strftime("%Y-%m-%d %H:00") == hour:  # not published across an hour's end
        assert f"<td>archived</td><td>{hour}</td><td>40</td>" in section
    assert "<td>live</td><td>10</td><td>10</td>" in section


def test_replay_to_group_refuses_a_bad_name_and_a_group_that_already_consumes():
    """pipelines.replay_to_group runs no Spark: the new group's watermarks, or a refusal."""
    from django_sqlqueue.exceptions import InvalidMessage
    from django_sqlqueue.spark.options import SparkOptionError
    from django_sqlqueue.spark.pipelines import replay_to_group

    publish_sequenced("pipe.g", 4, keys=1)
    with pytest.raises(InvalidMessage, match="consumer group"):
        replay_to_group("pipe.g", "bad name", timezone.now())
    marks = replay_to_group("pipe.g", "fresh", timezone.now() - dt.timedelta(hours=1))
    assert list(marks.values()) == [0]  # one partition, every message after the time
    with pytest.raises(SparkOptionError, match="already consumes"):
        replay_to_group("pipe.g", "fresh", timezone.now())
